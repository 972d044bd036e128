"""Synthetic N-stage topologies for the scaling benchmark (figure 3).

A chain pipeline ``synth<N>``: stage 0 a Thinker (the stage ``expand`` splits), stage 1
a Talker-like stage (model stage ``talker``, no talker role: see :func:`pipeline`), stages 2..N-1 Code2Wav-like generation stages, each reading the previous
one through a shared-memory connector. Every stage has its own device, every stage
after the Thinker its own ``VLLM_PORT`` (env), packed right below and across the
Mooncake bootstrap default (25201), and the Thinker runs with tensor parallel size 2,
so that device allocation and port allocation see N devices and N-1 claimed ports
on one host. A ``platforms.npu`` overlay
places every stage again (exercises overlay remapping), and an inventory describes
the host (``count`` = every device, so the device rules run their per-host checks).

Nothing here is timed; :func:`deploy_yaml` builds the input text,
:func:`catalogue` the pipeline catalogue that knows ``synth<N>`` and its PD variant.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

PORT_BASE = 25180  # stage k claims PORT_BASE + k: straddles Mooncake's 25201 default


def pipeline_name(n: int) -> str:
    return f"synth{n}"


def pipeline(n: int):
    """The frozen N-stage chain (omni_pd.compile.pipelines.Pipeline)."""
    from omni_pd.compile.pipelines import Pipeline, PipelineStage

    if n < 2:
        raise ValueError("a synthetic chain needs at least 2 stages")
    stages = [PipelineStage(0, "thinker", "thinker", "LLM_AR", (), True, "text")]
    # stage 1 reads the Thinker as a Talker does, without the talker role: omni-pd refuses a Talker
    # after a PD decode outside qwen3_omni_moe_pd (OPD704, omni_pd/compile/talker_pd.py), and this
    # figure measures how expand + validate scale, not that refusal
    stages.append(PipelineStage(1, "code2wav", "talker", "LLM_AR", (0,), n == 2, "audio" if n == 2 else None))
    for k in range(2, n):
        last = k == n - 1
        stages.append(PipelineStage(k, "code2wav", "code2wav", "LLM_GENERATION", (k - 1,), last,
                                    "audio" if last else None))
    return Pipeline(name=pipeline_name(n), stages=tuple(stages), model_arch="Synthetic")


def catalogue(n: int):
    """omni-pd's bundled catalogue plus ``synth<n>`` and ``synth<n>_pd``."""
    from omni_pd.compile.pipelines import Catalogue, derive_pd, load_catalogue

    p = pipeline(n)
    pd = derive_pd(p)
    return Catalogue({**load_catalogue().pipelines, p.name: p, pd.name: pd})


@contextlib.contextmanager
def installed(cat) -> Iterator[None]:
    """Make ``cat`` the catalogue every omni-pd module sees.

    ``expand_document`` takes ``catalogue=``; ``validate_document`` has no such
    parameter (it calls ``load_catalogue()``, as do ``rules.Context.catalogued`` and
    the CLI), so the bench swaps the function for the duration.
    """
    import omni_pd.compile.expand as compiler
    import omni_pd.compile.pipelines as pipelines
    import omni_pd.check.validate as validate

    saved = (pipelines.load_catalogue, validate.load_catalogue, compiler.load_catalogue)
    fn = lambda: cat  # noqa: E731
    pipelines.load_catalogue = validate.load_catalogue = compiler.load_catalogue = fn  # type: ignore[assignment]
    try:
        yield
    finally:
        pipelines.load_catalogue, validate.load_catalogue, compiler.load_catalogue = saved


def deploy_yaml(n: int) -> str:
    """The three-stage-style (unsplit) deploy config of ``synth<n>``, as YAML text."""
    out = [f"# synthetic {n}-stage chain for bench/fig3_scaling.py",
           f"pipeline: {pipeline_name(n)}",
           "async_chunk: false",
           "",
           "connectors:",
           "  shm:",
           "    name: SharedMemoryConnector",
           "    extra: {codec_chunk_frames: 25}",
           "",
           "stages:"]
    dev = 0
    npu: list[str] = []
    for k in range(n):
        if k == 0:
            devices, dev = "0,1", 2
            out += ["  - stage_id: 0   # thinker",
                    "    tensor_parallel_size: 2",
                    "    max_num_seqs: 64",
                    "    gpu_memory_utilization: 0.9",
                    f'    devices: "{devices}"',
                    "    default_sampling_params: {temperature: 0.0, max_tokens: 2048}"]
            npu += ["      - stage_id: 0", "        tensor_parallel_size: 2", '        devices: "0,1"']
            continue
        out += [f"  - stage_id: {k}   # {'talker' if k == 1 else 'code2wav'} {k}",
                "    max_num_seqs: 64",
                "    gpu_memory_utilization: 0.5",
                f'    devices: "{dev}"',
                f'    env: {{VLLM_PORT: "{PORT_BASE + k}"}}',
                f"    input_connectors: {{from_stage_{k - 1}: shm}}",
                "    default_sampling_params: {temperature: 0.9, max_tokens: 4096}"]
        npu += [f"      - stage_id: {k}", "        enforce_eager: true", f'        devices: "{dev}"']
        dev += 1
    out += ["", "platforms:", "  npu:", "    stages:"] + npu
    return "\n".join(out) + "\n"


def devices_needed(n: int) -> int:
    """Devices the expanded topology uses (thinker TP 2 split in two, 1 per other stage)."""
    return 4 + (n - 1)


def inventory(n: int):
    """One host with enough devices for the expanded topology, all stages on it."""
    from omni_pd.check.context import Inventory

    return Inventory.from_dict({"hosts": {"host-a": {"accelerator": "cuda", "count": devices_needed(n),
                                                     "memory_gib": 80, "address": "10.0.0.1"}},
                                "placement": {"all": "host-a"}})
