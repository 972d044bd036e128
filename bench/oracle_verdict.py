"""vllm-omni 0.30.0's own verdict on one deploy YAML (run inside the oracle venv).

Figure 1 times this whole process (interpreter start, imports, work) as the user's
alternative to ``omni-pd validate``: the checks vllm-omni itself runs before it starts
engines, with nothing added and nothing skipped that vllm-omni does for a PD config:

1. ``vllm_omni.config.stage_config.load_deploy_config(path)``
2. vllm-omni's frozen pipeline for the file's ``pipeline:`` (its PD variant
   derived by ``omni_pd.upstream.vllm_plugin.derive_pd_pipeline``, as the omni-pd plugin does),
   and ``merge_pipeline_deploy(pipeline, deploy)``
3. ``PDDisaggregationMixin.detect_pd_separation_from_stage_configs`` and
   ``_validate_pd_separation_config`` (vllm_omni/entrypoints/pd_utils.py).

Prints one JSON line ``{"file", "pipeline", "pair", "verdict"}``; exit status 0 when
vllm-omni accepts the file, 1 when it raises (the verdict is the exception), 2 on
usage errors. Kept apart from tests/oracle/oracle_check.py on purpose: the benchmark
must not move when the test oracle does.

Usage: ORACLE_PYTHON bench/oracle_verdict.py FILE  (or --quick: the expanded preset)
"""

from __future__ import annotations

import json
import logging
import sys

logging.disable(logging.WARNING)


#: the module that defines each pipeline's frozen ``PipelineConfig``. Imported directly
#: rather than through ``vllm_omni.config.pipeline_registry``: the registry imports every
#: model's pipeline module, and some need torchvision, which the CPU oracle venv lacks
#: (.ci/oracle_venv.sh). This spares vllm-omni that import time, so it can only make
#: vllm-omni look faster than a real install.
PIPELINE_MODULES = {
    "qwen3_omni_moe": "vllm_omni.model_executor.models.qwen3_omni.pipeline",
    "qwen2_5_omni": "vllm_omni.model_executor.models.qwen2_5_omni.pipeline",
}


def upstream_pipeline(name: str):
    """vllm-omni's frozen ``PipelineConfig`` whose ``model_type`` is ``name``."""
    import importlib

    from vllm_omni.config.stage_config import PipelineConfig

    if name not in PIPELINE_MODULES:
        raise LookupError(f"bench oracle knows no module for pipeline {name!r}")
    mod = importlib.import_module(PIPELINE_MODULES[name])
    for v in vars(mod).values():
        if isinstance(v, PipelineConfig) and v.model_type == name:
            return v
    raise LookupError(f"{PIPELINE_MODULES[name]} defines no PipelineConfig {name!r}")


def verdict(path: str) -> dict:
    from vllm_omni.config.stage_config import load_deploy_config, merge_pipeline_deploy
    from vllm_omni.entrypoints.pd_utils import PDDisaggregationMixin

    from omni_pd.compile.pipelines import PD_SUFFIX, load_catalogue
    from omni_pd.upstream.vllm_plugin import derive_pd_pipeline

    out: dict = {"file": path, "pipeline": None, "pair": None}
    try:
        deploy = load_deploy_config(path)
        name = deploy.pipeline or ""
        out["pipeline"] = name
        base = name[: -len(PD_SUFFIX)] if name.endswith(PD_SUFFIX) else name
        upstream = upstream_pipeline(base)
        pipe = derive_pd_pipeline(upstream, load_catalogue().get(base)) if name.endswith(PD_SUFFIX) else upstream
        stages = [c.to_omegaconf() for c in merge_pipeline_deploy(pipe, deploy)]
        pair = PDDisaggregationMixin.detect_pd_separation_from_stage_configs(stages)
        if pair is None:
            raise ValueError("no PD pair detected")
        out["pair"] = list(pair)

        class _Check(PDDisaggregationMixin):
            def __init__(self) -> None:
                self.stage_configs = stages

            def _get_pd_separation_pair(self):
                return pair

        _Check()._validate_pd_separation_config()
        out["verdict"] = "valid"
    except Exception as e:  # vllm-omni's answer, whatever it is
        out["verdict"] = f"{type(e).__name__}: {e}"
    return out


def main(argv: list[str]) -> int:
    """Print vllm-omni's verdict on ``argv[0]``; ``--quick`` (or ``$OMNI_PD_BENCH_QUICK=1``
    with no file): the expanded preset, and a skip (exit 77) where vllm-omni is not
    importable, i.e. outside the oracle venv."""
    import os
    from pathlib import Path

    quick = argv == ["--quick"] or (not argv and os.environ.get("OMNI_PD_BENCH_QUICK", "") not in ("", "0"))
    if quick:
        try:
            import vllm_omni  # noqa: F401
        except ImportError:
            print("SKIP: vllm_omni not importable: run it with the oracle venv's python ($OMNI_PD_ORACLE_PYTHON)")
            return 77
        argv = [str(Path(__file__).resolve().parent.parent / "tests" / "golden" / "qwen3_omni_moe_pd.yaml")]
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    out = verdict(argv[0])
    print(json.dumps(out), flush=True)
    return 0 if out["verdict"] == "valid" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
