"""``omni-pd rules``: every diagnostic code."""


from omni_pd.cli.output import print_table


def rules_cmd() -> None:
    """List every diagnostic code: the validate rules, then the codes of input, usage, expand, launch."""
    from omni_pd.check.codes import CODES
    from omni_pd.check.rules import registry

    # no header: one code per line, first field the code (grep OPD3, awk '{print $1}')
    print_table(("code", "severity", "name", "summary"),
                [(e.code, e.severity.value, e.name, e.summary) for e in (*registry().values(), *CODES)], header=False)
