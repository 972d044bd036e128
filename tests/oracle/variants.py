"""Broken variants of the expanded Qwen3-Omni PD config, for the oracle agreement table.

Each variant is one edit of ``tests/golden/qwen3_omni_moe_pd.yaml`` (ruamel round
trip, so the rest of the file stays byte-identical). ``EXPECTED`` is the agreement
table: for each variant, the error codes ``omni-pd validate`` must report and the
start of vllm-omni 0.30.0's verdict (``valid...`` means vllm-omni accepts it).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Callable

from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "qwen3_omni_moe_pd.yaml"


def _stage(d, sid):
    return next(s for s in d["stages"] if s["stage_id"] == sid)


def _set_kv(sid, key, value):
    def f(d):
        _stage(d, sid)["kv_transfer_config"][key] = value
    return f


def _both(*fs):
    def f(d):
        for g in fs:
            g(d)
    return f


def _tp2(d):
    p = _stage(d, 0)
    p["tensor_parallel_size"] = 2
    p["devices"] = "0,3"


def _drop_stage(sid):
    def f(d):
        d["stages"].remove(_stage(d, sid))
    return f


def _env_port_ignored(d):
    # vllm-omni 0.30 overwrites the prefill replica's env with bootstrap_port + replica id
    _stage(d, 0)["env"]["VLLM_MOONCAKE_BOOTSTRAP_PORT"] = "25301"


def _unknown_key(d):
    _stage(d, 2)["bogus_stage_key"] = 1


VARIANTS: dict[str, tuple[str, Callable]] = {
    # name: (what changed, edit)
    "roles_swapped": ("prefill kv_consumer, decode kv_producer",
                      _both(_set_kv(0, "kv_role", "kv_consumer"), _set_kv(1, "kv_role", "kv_producer"))),
    "connectors_differ": ("decode uses NixlConnector", _set_kv(1, "kv_connector", "NixlConnector")),
    "tp_differs": ("prefill tensor_parallel_size 2 on devices 0,3", _tp2),
    "no_kv_on_decode": ("decode has no kv_transfer_config", lambda d: _stage(d, 1).pop("kv_transfer_config")),
    "no_kv_on_prefill": ("prefill has no kv_transfer_config", lambda d: _stage(d, 0).pop("kv_transfer_config")),
    "async_chunk_true": ("async_chunk: true", lambda d: d.__setitem__("async_chunk", True)),
    "three_stage_pipeline": ("pipeline: qwen3_omni_moe (4 deploy stages, 3-stage pipeline)",
                             lambda d: d.__setitem__("pipeline", "qwen3_omni_moe")),
    "pipeline_key_removed": ("no pipeline: key (inferred from the model)", lambda d: d.pop("pipeline")),
    "decode_stage_deleted": ("stage 1 entry deleted", _drop_stage(1)),
    "buffer_device_differs": ("kv_buffer_device cpu on prefill, cuda on decode",
                              _both(_set_kv(0, "kv_buffer_device", "cpu"), _set_kv(1, "kv_buffer_device", "cuda"))),
    "same_engine_id": ("decode engine_id = prefill's", _set_kv(1, "engine_id", "omni-thinker-prefill")),
    "bootstrap_env_ignored": ("prefill env bootstrap port 25301, bootstrap_port 25201", _env_port_ignored),
    "kv_role_typo": ("prefill kv_role: kv_prod", _set_kv(0, "kv_role", "kv_prod")),
    "unknown_stage_key": ("talker has bogus_stage_key", _unknown_key),
}

# variant -> (omni-pd validate error codes, vllm-omni 0.30.0 verdict prefix)
EXPECTED: dict[str, tuple[tuple[str, ...], str]] = {
    "roles_swapped": (("OPD302",), "ValueError: Prefill stage-0 kv_role must be 'kv_producer' or 'kv_both'"),
    "connectors_differ": (("OPD304",), "ValueError: PD connector mismatch"),
    "tp_differs": (("OPD306",), "ValueError: PD stages must have matching tensor_parallel_size"),
    "no_kv_on_decode": (("OPD301",), "ValueError: Stage-1 is marked for PD but has no 'kv_transfer_config'"),
    "no_kv_on_prefill": (("OPD301",), "ValueError: Stage-0 is marked for PD but has no 'kv_transfer_config'"),
    # streaming beside the prefill -> decode edge: vllm-omni's config loader accepts it once omni-pd's layer is in
    # (the oracle runs with it); the edge makes decode a prewarmed chunk receiver at serve time, which only
    # omni-pd sees (OPD310; tests/test_oracle_stream_pd.py shows the roles vllm-omni derives)
    "async_chunk_true": (("OPD310",), "valid"),
    "three_stage_pipeline": (("OPD202", "OPD204", "OPD308"), "valid (no PD pair)"),
    "pipeline_key_removed": (("OPD208",), "valid (no PD pair)"),
    "decode_stage_deleted": (("OPD301",), "ValueError: Stage-1 is marked for PD but has no 'kv_transfer_config'"),
    "buffer_device_differs": (("OPD305",), "ValueError: PD kv_buffer_device mismatch"),
    "same_engine_id": (("OPD309",), "valid"),
    "bootstrap_env_ignored": (("OPD502",), "valid"),
    "kv_role_typo": (("OPD302",), "ValidationError: 1 validation error for OmniStageConnectorConfig"),
    "unknown_stage_key": (("OPD111",), "ValueError: Stage 2 (llm_ar) has explicit engine argument(s) with no "
                                       "structured config owner"),
}


def one_piece_text() -> str:
    """The bundled preset's PD output with ``async_chunk: false`` (``expand --no-stream``): the base
    every variant edits. The golden streams since issue 34; the variants were written for the
    one-piece file (``async_chunk_true`` turns streaming on beside the prefill -> decode edge)."""
    from omni_pd.compile.expand import expand_document
    from omni_pd.compile.passes.pd_split import ExpandOptions
    from omni_pd.io import load_file

    return expand_document(load_file(GOLDEN.parent.parent.parent / "presets" / "qwen3_omni_moe.yaml"),
                           ExpandOptions(stream=False), schema_ref="omni-pd-deploy.schema.json").text


def write_variants(dest: Path) -> dict[str, Path]:
    """Write every variant as ``dest/<name>.yaml``; returns name -> path."""
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    out = {}
    base = one_piece_text()
    for name, (_, edit) in VARIANTS.items():
        data = yaml.load(base)
        edit(data)
        buf = io.StringIO()
        yaml.dump(data, buf)
        p = dest / f"{name}.yaml"
        p.write_text(buf.getvalue())
        out[name] = p
    return out
