"""``omni-pd pipelines``: the catalogued pipelines and their stages."""


from omni_pd.cli.output import print_table


def pipelines() -> None:
    """List the catalogued pipelines and their stages.

    ``runtime``: whose pipeline it is (vllm-omni's registry, or plain vLLM); ``launch``:
    how ``omni-pd launch`` serves it (the header of ``launch --dry-run`` says the same),
    ``-`` for one launch does not start (expand it first).
    """
    from omni_pd.compile.pipelines import load_catalogue

    cat = load_catalogue()
    rows = []
    for name in cat.names():
        p = cat.get(name)
        assert p is not None
        rows.append((name, p.runtime, p.launch_form or "-",
                     " -> ".join(f"{s.stage_id}:{s.role}{'/' + s.pd_role if s.pd_role else ''}" for s in p.stages)))
    print_table(("pipeline", "runtime", "launch", "stages"), rows)
