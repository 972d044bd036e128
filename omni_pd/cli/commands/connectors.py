"""``omni-pd connectors``: the KV connectors omni-pd can emit and where they run."""


from omni_pd.cli.output import print_table

#: connectors the CPU end-to-end runs move KV with (docs/status.md): MooncakeConnector in
#: the vllm-omni pipeline (the README's CPU rehearsal), NixlConnector for a single LLM
_CPU_RUN_CONNECTORS = ("MooncakeConnector", "NixlConnector")


def connectors() -> None:
    """List the KV connectors omni-pd can emit, with the platforms they run on (a
    vllm-ascend connector: npu only, at the vllm-ascend releases of presets/targets/vllm_ascend.yaml)."""
    from omni_pd.compile import ascend
    from omni_pd.compile import connectors as reg

    rows = []
    for name in reg.names():
        c = reg.get(name)
        if ascend.is_ascend(name):
            where = "npu (vllm-ascend " + ", ".join(f"{r}/vLLM {v}" for r, v in ascend.releases().items()) + ")"
        else:
            where = "cuda, rocm, xpu, cpu (vLLM)" if name in _CPU_RUN_CONNECTORS else "cuda, rocm, xpu (vLLM)"
        rows.append((name, where, c.summary))  # type: ignore[union-attr]
    print_table(("connector", "platforms", "what it does"), rows)
