"""Issue 35's rules beyond their examples: exact messages, locations, the router schema and the
release boundaries each fact names (one release on each side).

OPD315 speculative mismatch (vllm#49230: 0.25 without, 0.28 with), OPD316 max_model_len,
OPD405 device-set overlap (vllm-omni #7328: 0.30 without, 0.31 with), OPD624 draft KV
(vllm#51718: 0.27 crash, 0.30 skip), OPD625 DCP (vLLM 0.29 NIXL read, 0.28 not pinned),
OPD706/OPD707 router settings (vllm-router 0.1.17), OPD006 unknown router keys.
"""

from __future__ import annotations

import pytest

from omni_pd.check.context import Inventory, ModelInfo
from omni_pd.check.validate import ValidateOptions, options_from_example, validate_text
from omni_pd.diagnostics import Severity
from rule_found import col, found

_PAIR = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
         "  - {{stage_id: 0, devices: \"0\"{p}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_producer, engine_id: p0}}}}\n"
         "  - {{stage_id: 1, devices: \"1\"{d}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_consumer, engine_id: d0}}}}\n")
E3 = ", speculative_config: {method: eagle3, model: org/eagle3-head, num_speculative_tokens: 3}"
DRAFT = ", speculative_config: {method: mtp, model: google/gemma-4-27b-it-assistant, num_speculative_tokens: 3}"


def pair(p: str = "", d: str = "", c: str = "NixlConnector") -> str:
    return _PAIR.format(p=p, d=d, c=c)


def opts(version: str | None = "0.30", **kw) -> ValidateOptions:
    return ValidateOptions(vllm_version=version, **kw)


# --- OPD315 -------------------------------------------------------------------------------------

def test_opd315_decode_only_eagle3_is_located_at_decode_and_names_both_sides() -> None:
    text = pair(d=E3)
    got = found(text, "OPD315", opts=opts("0.30"))
    assert len(got) == 1
    sev, msg, at, help_, rel = got[0]
    assert sev == "error"
    assert msg.startswith("decode (stage 1) runs the model-based speculative method eagle3 (draft org/eagle3-head) "
                          "and prefill (stage 0) runs none: the draft layers change the KV cache groups NixlConnector "
                          "transfers; on vLLM 0.30 (with vllm#49230) every request fails the NIXL handshake")
    line, c = col(text, "speculative_config: {method: eagle3")
    assert at == (line, c + len("speculative_config: "))
    assert help_.startswith('give stage 0 the same model-based speculative_config: `speculative_config: {"method": "eagle3", '
                            '"model": "org/eagle3-head", "num_speculative_tokens": 3}`')
    assert rel and rel[0][2] == "prefill (stage 0): no speculative_config"


@pytest.mark.parametrize(("version", "words"), [
    ("0.25", "before vllm#49230) the handshake passes, short prompts work and long prompts crash decode"),
    ("0.26", "vllm#49230 not pinned for it"),
    ("0.28", "with vllm#49230) every request fails the NIXL handshake"),
])
def test_opd315_release_boundary_of_vllm_49230(version: str, words: str) -> None:
    got = found(pair(d=E3), "OPD315", opts=opts(version))
    assert [g[0] for g in got] == ["error"] and words in got[0][1]


def test_opd315_says_which_release_it_assumed_without_vllm_version() -> None:
    got = found(pair(d=E3), "OPD315", opts=opts(None))
    assert "vLLM 0.30 (assumed: no --vllm-version given; pass --vllm-version X.Y)" in got[0][1]


def test_opd315_pattern_based_and_equal_setups_pass() -> None:
    ngram = ", speculative_config: {method: ngram, num_speculative_tokens: 5, prompt_lookup_max: 4}"
    assert found(pair(d=ngram), "OPD315", opts=opts()) == []
    assert found(pair(p=ngram), "OPD315", opts=opts()) == []
    assert found(pair(p=E3, d=E3), "OPD315", opts=opts()) == []
    # a JSON string (as --speculative-config takes it) is read too
    js = ", speculative_config: '{\"method\": \"eagle3\", \"model\": \"org/eagle3-head\", \"num_speculative_tokens\": 3}'"
    assert found(pair(p=js, d=E3), "OPD315", opts=opts()) == []
    assert [g[0] for g in found(pair(d=js), "OPD315", opts=opts())] == ["error"]


# --- OPD316 -------------------------------------------------------------------------------------

def test_opd316_decode_from_the_model_default_above_prefill() -> None:
    text = pair(p=", max_model_len: 9217", c="MooncakeConnector")
    got = found(text, "OPD316", opts=opts(model=ModelInfo(max_position_embeddings=1048576)))
    assert [(g[0], g[3]) for g in got] == [("error", "write `max_model_len: 9217` on stage 1 (decode)")]
    assert "decode (stage 1) accepts prompts up to 1048576 tokens (model default; max_model_len unset), prefill " \
           "(stage 0) only 9217 (max_model_len)" in got[0][1]
    # without the model's default, decode's limit is unknown: nothing to compare
    assert found(text, "OPD316", opts=opts()) == []


def test_opd316_a_global_flag_applies_to_both_sides() -> None:
    text = pair(c="MooncakeConnector")
    assert found(text, "OPD316", opts=opts(cli={"max_model_len": 8192},
                                            model=ModelInfo(max_position_embeddings=1048576))) == []


# --- OPD405 -------------------------------------------------------------------------------------

_OMNI = ("async_chunk: false\nstages:\n"
         "  - {{stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2, gpu_memory_utilization: 0.5}}\n"
         "  - {{stage_id: 1, devices: \"{d}\", gpu_memory_utilization: 0.3}}\n")
_INV3 = {"hosts": {"host-a": {"accelerator": "cuda", "count": 3}}}


@pytest.mark.parametrize(("version", "fires"), [("0.28", True), ("0.30", True), ("0.31", False)])
def test_opd405_release_boundary_of_vllm_omni_7328(version: str, fires: bool) -> None:
    got = found(_OMNI.format(d="0"), "OPD405", {"vllm_version": version, "inventory": _INV3})
    assert [g[0] for g in got] == (["warning"] if fires else [])


def test_opd405_equal_or_disjoint_sets_and_other_hosts_pass() -> None:
    for d in ("0,1", "2"):
        assert found(_OMNI.format(d=d), "OPD405", {"vllm_version": "0.28", "inventory": _INV3}) == []
    two = {"hosts": {"a": {"accelerator": "cuda", "count": 2}, "b": {"accelerator": "cuda", "count": 2}},
           "placement": {0: "a", 1: "b"}}
    assert found(_OMNI.format(d="0"), "OPD405", {"vllm_version": "0.28", "inventory": two}) == []


def test_opd405_replicas_are_compared_per_slice() -> None:
    text = ("async_chunk: false\nstages:\n"
            "  - {stage_id: 0, devices: \"0,1\", num_replicas: 2, gpu_memory_utilization: 0.5}\n"
            "  - {stage_id: 1, devices: \"1\", gpu_memory_utilization: 0.3}\n")
    assert found(text, "OPD405", {"vllm_version": "0.28", "inventory": _INV3}) == []


# --- OPD624 -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("version", "severity", "words"), [
    ("0.27", "error", "decode fails at start"),
    ("0.28", "warning", "not pinned"),
    ("0.30", "warning", "NIXL skips the draft model's KV cache groups (vllm#54926)"),
])
def test_opd624_release_boundary_of_vllm_51718(version: str, severity: str, words: str) -> None:
    got = found(pair(p=DRAFT, d=DRAFT), "OPD624", opts=opts(version))
    assert [g[0] for g in got] == [severity] and words in got[0][1]
    assert "google/gemma-4-27b-it-assistant" in got[0][1]


# --- OPD625 -------------------------------------------------------------------------------------

def test_opd625_nixl_dcp_on_a_gqa_model_is_an_error_on_0_29_and_not_pinned_on_0_28() -> None:
    text = pair(p=", tensor_parallel_size: 2, decode_context_parallel_size: 2",
                d=", tensor_parallel_size: 2, decode_context_parallel_size: 2").replace(
        'devices: "0"', 'devices: "0,1"').replace('devices: "1"', 'devices: "2,3"')
    gqa = ModelInfo(num_kv_heads=8, attention="GQA")
    for version in ("0.29", "0.33"):
        got = found(text, "OPD625", opts=opts(version, model=gqa))
        assert [g[0] for g in got] == ["error"] and "MLA models only" in got[0][1]
    assert [g[0] for g in found(text, "OPD625", opts=opts("0.28", model=gqa))] == ["info"]


def test_opd625_dcp_adds_no_devices() -> None:
    text = pair(p=", tensor_parallel_size: 2, decode_context_parallel_size: 2",
                d=", tensor_parallel_size: 2, decode_context_parallel_size: 2").replace(
        'devices: "0"', 'devices: "0,1"').replace('devices: "1"', 'devices: "2,3"')
    assert found(text, "OPD401", opts=opts("0.33")) == []


# --- router: OPD706, OPD707, OPD006 -------------------------------------------------------------

def _router(router: dict, text: str, **kw) -> list:
    inv = {"hosts": {"host-a": {"accelerator": "cuda", "count": 2}}, "router": router}
    return found(text, kw.pop("code"), {"inventory": inv, "vllm_version": "0.30"})


def test_opd706_names_host_both_ports_and_the_fix() -> None:
    text = pair(p=", port: 8200", d=", port: 8200")
    got = _router({"kind": "llm-d", "prefill_target_port": 8000}, text, code="OPD706")
    assert got[0][:2] == ("error", "the llm-d router sends prefill requests to host-a:8000 but prefill (stage 0) serves "
                                   "on port 8200: connection refused, the router falls back to decode-only on stage 1 "
                                   "(no KV transfer, no error)")
    assert got[0][2] == (col(text, "port: 8200")[0], col(text, "port: 8200")[1] + len("port: "))
    assert got[0][3] == "write `port: 8000` on stage 0, or set the inventory's `router: {prefill_target_port: 8200}`"


def test_opd707_power_of_two_names_the_router_release_it_assumed() -> None:
    got = _router({"kind": "vllm-router", "prefill_policy": "power_of_two"}, pair(), code="OPD707")
    assert [g[0] for g in got] == ["warning"]
    assert got[0][1].startswith("vllm-router (assumed 0.1.17, the newest release read")
    assert "vllm-project/router" not in got[0][1] and got[0][3].startswith("set the inventory's router `prefill_policy: round_robin`")


@pytest.mark.parametrize(("router", "words"), [
    ({"kind": "llm-d", "prefil_target_port": 8000}, "unknown key `prefil_target_port` under router (kind llm-d); did you mean `prefill_target_port`?"),
    ({"kind": "vllm-router", "prefill_target_port": 8000}, "unknown key `prefill_target_port` under router (kind vllm-router); it is a key of router kind llm-d"),
    ({"relays_kv_transfer_param": True}, "did you mean `relays_kv_transfer_params`?"),
])
def test_unknown_router_keys_are_refused_with_a_suggestion(router: dict, words: str) -> None:
    with pytest.raises(ValueError) as ei:
        Inventory.from_dict({"hosts": {"a": {}}, "router": router})
    assert words in str(ei.value)


def test_unknown_router_key_on_the_command_line_is_opd006(tmp_path) -> None:
    import subprocess
    import sys

    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts: {a: {accelerator: cuda, count: 2}}\nrouter: {kind: llm-d, prefill_target_prot: 8000}\n")
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(pair())
    r = subprocess.run([sys.executable, "-m", "omni_pd.cli", "validate", str(cfg), "--inventory", str(inv)],
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "OPD006" in r.stdout + r.stderr and "did you mean `prefill_target_port`?" in r.stdout + r.stderr


def test_every_router_key_the_cases_and_docs_use_is_known() -> None:
    from omni_pd.check.context import router_keys

    for kind, keys in {"llm-d": ("prefill_target_port", "decode_sidecar_port"),
                       "vllm-router": ("prefill_policy", "decode_policy", "protocols"),
                       None: ("relays_kv_transfer_params",)}.items():
        assert set(keys) <= set(router_keys(kind))


def test_release_words_only_when_assumed() -> None:
    res = validate_text(pair(d=E3), "t.yaml", options_from_example({"vllm_version": "0.30"}))
    assert all("assumed" not in d.message for d in res.diagnostics if d.code == "OPD315")
    assert any(d.severity is Severity.ERROR for d in res.diagnostics if d.code == "OPD315")
