"""``omni-pd explain``: one code's documentation (omni_pd/check/explain.py)."""

import sys

import typer

from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity


def explain(code: str = typer.Argument(..., help="a diagnostic code or rule name, e.g. OPD302 or pd-kv-role "
                                                "(see `omni-pd rules`)")) -> None:
    """Print one code's documentation (a rule: with its failing and passing examples)."""
    from omni_pd.check.codes import explainable
    from omni_pd.check.explain import resolve

    entry, near = resolve(code, explainable())  # a code or a rule name `omni-pd rules` prints
    if entry is None:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message=f"unknown code or rule name `{code}`",
                                     help=(f"did you mean {near}? " if near else "") + "`omni-pd rules` lists them"))
    if sys.stdout.isatty():
        from rich.console import Console

        from omni_pd.check.explain import print_rich

        print_rich(entry, Console())
    else:
        from omni_pd.check.explain import explain_text

        sys.stdout.write(explain_text(entry))
