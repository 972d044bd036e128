"""Every branch of the PD pair rules (OPD301-OPD311) and of OPD610, with exact messages,
locations and help lines (issue 16: rules tested only through their one doc example let a
deliberately broken branch pass the suite).

Each test names the branch it pins; tests/test_rules.py keeps the doc-example tests. The
mutation run (bench/mutation.py, bench/MUTATION.md) is what found the unpinned branches.
"""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
import types
from pathlib import Path

import pytest

from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.diagnostics import Severity
from pd_fixture import PD  # tests/pd_fixture.py

P_KV = "    kv_transfer_config:\n      kv_connector: NixlConnector\n      kv_role: kv_producer\n      engine_id: p\n"
D_KV = "    kv_transfer_config:\n      kv_connector: NixlConnector\n      kv_role: kv_consumer\n      engine_id: d\n"
P = "{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}"
C = "{kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}"


def hits(text: str, code: str, opts: ValidateOptions | None = None) -> list[tuple]:
    """(severity, message, (line, column), help, [(line, column, label) of related], label)
    of each ``code`` diagnostic."""
    res = validate_text(text, "t.yaml", opts)
    return [(d.severity, d.message, (d.location.line, d.location.column) if d.location else None, d.help,
             [(r.line, r.column, r.label) for r in d.related], d.label)
            for d in res.diagnostics if d.code == code]


E, W, I = Severity.ERROR, Severity.WARNING, Severity.INFO


def test_the_base_pair_is_clean_for_every_pd_rule() -> None:
    codes = validate_text(PD, "t.yaml").codes()
    assert not {c for c in codes if c.startswith("OPD3")}


# --- OPD301 kv_transfer_config missing ------------------------------------------------------------

def test_opd301_both_sides_missing() -> None:
    text = PD.replace(P_KV, "").replace(D_KV, "")
    assert hits(text, "OPD301") == [(
        E, "stages 0 (prefill) and 1 (decode) form a PD pair but neither has a kv_transfer_config", (4, 5),
        "add `kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer}` to prefill and the same "
        "with `kv_role: kv_consumer` to decode (or run `omni-pd expand` on the three-stage config)",
        [(8, 5, "decode (stage 1) has none either")], None)]


def test_opd301_prefill_missing_names_decodes_connector() -> None:
    assert hits(PD.replace(P_KV, ""), "OPD301") == [(
        E, "prefill stage 0 has no kv_transfer_config", (4, 5),
        "add `kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}`",
        [(12, 5, "the other side (stage 1) has one")], None)]


def test_opd301_decode_missing() -> None:
    assert hits(PD.replace(D_KV, ""), "OPD301") == [(
        E, "decode stage 1 has no kv_transfer_config", (12, 5),
        "add `kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer}`",
        [(8, 5, "the other side (stage 0) has one")], None)]


def test_opd301_other_side_without_connector_suggests_mooncake() -> None:
    text = PD.replace(P_KV, "").replace("      kv_connector: NixlConnector\n      kv_role: kv_consumer",
                                        "      kv_role: kv_consumer")
    assert hits(text, "OPD301")[0][3] == \
        "add `kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer}`"


# --- OPD302 kv_role -------------------------------------------------------------------------------

def test_opd302_connector_without_role() -> None:
    assert hits(PD.replace("      kv_role: kv_consumer\n", ""), "OPD302") == [(
        E, "stage 1: kv_connector is set but kv_role is not", (16, 5),
        "add `kv_role: kv_producer` (prefill) or `kv_role: kv_consumer` (decode)", [], None)]


def test_opd302_unknown_role_value() -> None:
    assert hits(PD.replace("kv_role: kv_consumer", "kv_role: consumer"), "OPD302") == [(
        E, "stage 1: unsupported kv_role `consumer`", (18, 16),
        "did you mean `kv_consumer`? kv_role is one of kv_producer, kv_consumer, kv_both", [], None)]
    # a value no role resembles gets no guess
    assert hits(PD.replace("kv_role: kv_consumer", "kv_role: reader"), "OPD302") == [(
        E, "stage 1: unsupported kv_role `reader`", (18, 16),
        "kv_role is one of kv_producer, kv_consumer, kv_both", [], None)]


def test_opd302_decode_producing_is_not_called_reversed_when_prefill_is_right() -> None:
    assert hits(PD.replace("kv_role: kv_consumer", "kv_role: kv_producer"), "OPD302") == [(
        E, "decode stage 1 has kv_role kv_producer", (18, 16), "write `kv_role: kv_consumer` on the decode stage",
        [(10, 16, "prefill (stage 0) is kv_producer")], None)]


def test_opd302_prefill_consuming_alone() -> None:
    assert hits(PD.replace("kv_role: kv_producer", "kv_role: kv_consumer"), "OPD302") == [(
        E, "prefill stage 0 has kv_role kv_consumer", (10, 16), "write `kv_role: kv_producer` on the prefill stage",
        [(18, 16, "decode (stage 1) is kv_consumer")], None)]


def test_opd302_kv_both_is_an_accepted_role_on_either_side() -> None:
    text = PD.replace("kv_role: kv_producer", "kv_role: kv_both").replace("kv_role: kv_consumer", "kv_role: kv_both")
    assert hits(text, "OPD302") == []


# --- OPD303 kv_both -------------------------------------------------------------------------------

def test_opd303_kv_both_on_decode_is_warned_deprecated_for_nixl_from_024() -> None:
    text = PD.replace("kv_role: kv_consumer", "kv_role: kv_both")
    assert hits(text, "OPD303", ValidateOptions(vllm_version="0.30")) == [(
        W, "decode stage 1 uses kv_role kv_both (deprecated for NixlConnector since vLLM 0.24)", (18, 16),
        "write `kv_role: kv_consumer`", [], None)]


def test_opd303_kv_both_before_024_is_still_warned_for_the_other_direction() -> None:
    text = PD.replace("kv_role: kv_consumer", "kv_role: kv_both")
    assert hits(text, "OPD303", ValidateOptions(vllm_version="0.11")) == [(
        W, "decode stage 1 uses kv_role kv_both (the stage then also accepts the other direction)", (18, 16),
        "write `kv_role: kv_consumer`", [], None)]


def test_opd303_kv_both_on_both_sides_with_mooncake_is_not_called_deprecated() -> None:
    text = (PD.replace("NixlConnector", "MooncakeConnector").replace("kv_role: kv_producer", "kv_role: kv_both")
            .replace("kv_role: kv_consumer", "kv_role: kv_both"))
    got = hits(text, "OPD303", ValidateOptions(vllm_version="0.30"))
    assert [(h[1], h[2], h[3]) for h in got] == [
        ("prefill stage 0 uses kv_role kv_both (the stage then also accepts the other direction)", (10, 16),
         "write `kv_role: kv_producer`"),
        ("decode stage 1 uses kv_role kv_both (the stage then also accepts the other direction)", (18, 16),
         "write `kv_role: kv_consumer`")]


# --- OPD304 connector mismatch --------------------------------------------------------------------

def test_opd304_a_side_without_kv_connector_is_named_with_the_other_sides() -> None:
    text = PD.replace("      kv_connector: NixlConnector\n      kv_role: kv_consumer", "      kv_role: kv_consumer")
    assert hits(text, "OPD304") == [(E, "stage 1: kv_transfer_config has no kv_connector", (16, 5),
                                     "add `kv_connector: NixlConnector`", [], None)]


def test_opd304_neither_side_has_a_connector() -> None:
    text = PD.replace("      kv_connector: NixlConnector\n", "")
    assert [(h[1], h[3]) for h in hits(text, "OPD304")] == [
        ("stage 0: kv_transfer_config has no kv_connector", "add `kv_connector: MooncakeConnector`"),
        ("stage 1: kv_transfer_config has no kv_connector", "add `kv_connector: MooncakeConnector`")]


# --- OPD305 buffer mismatch -----------------------------------------------------------------------

def _buffers(p: str, d: str) -> str:
    return PD.replace("engine_id: p\n", f"engine_id: p\n      {p}\n").replace("engine_id: d\n", f"engine_id: d\n      {d}\n")


def test_opd305_kv_buffer_size_is_compared() -> None:
    assert hits(_buffers("kv_buffer_size: 1e9", "kv_buffer_size: 2e9"), "OPD305") == [(
        E, "kv_buffer_size differs: prefill 1000000000.0, decode 2000000000.0", (21, 23),
        "write the same kv_buffer_size on both stages (or drop it from both)",
        [(12, 23, "prefill sets 1000000000.0")], None)]


def test_opd305_equal_sizes_in_two_spellings_are_equal() -> None:
    assert hits(_buffers("kv_buffer_size: 1e9", "kv_buffer_size: 1000000000"), "OPD305") == []
    assert hits(_buffers("kv_buffer_size: '5e9'", "kv_buffer_size: 5000000000"), "OPD305") == []


def test_opd305_one_side_setting_a_value_is_not_a_mismatch() -> None:
    assert hits(_buffers("kv_buffer_size: 1e9", "engine_id2: x").replace("      engine_id2: x\n", ""),
                "OPD305") == []


def test_opd305_buffer_device_differs() -> None:
    assert [h[1] for h in hits(_buffers("kv_buffer_device: cpu", "kv_buffer_device: cuda"), "OPD305")] == [
        "kv_buffer_device differs: prefill 'cpu', decode 'cuda'"]


# --- OPD306 TP unequal (vllm-omni's PD validator) -------------------------------------------------

_TP = PD.replace('    devices: "0"\n', '    devices: "0,2"\n    tensor_parallel_size: 2\n').replace(
    '    devices: "1"\n', '    devices: "1"\n    tensor_parallel_size: 1\n')


def test_opd306_points_at_decodes_own_tensor_parallel_size_value() -> None:
    assert hits(_TP, "OPD306") == [(
        E, "tensor_parallel_size differs: prefill 2, decode 1; vllm-omni's PD validator requires them equal", (15, 27),
        "set `tensor_parallel_size: 2` on decode (and give it 2 devices)", [(6, 27, "prefill TP 2")], None)]


@pytest.mark.parametrize("side", [P_KV, D_KV])
def test_opd306_waits_for_both_kv_configs(side) -> None:
    # a side without kv_transfer_config is OPD301's finding; the TP check needs the pair
    assert hits(_TP.replace(side, ""), "OPD306") == []


# --- OPD307 decode input --------------------------------------------------------------------------

def test_opd307_decode_not_fed_by_prefill() -> None:
    """An inferred PD chain (no ``pipeline:``) where a stage sits between producer and consumer."""
    text = ("async_chunk: false\nstages:\n"
            f"  - {{stage_id: 0, devices: \"0\", kv_transfer_config: {P}}}\n"
            "  - {stage_id: 1, devices: \"1\"}\n"
            f"  - {{stage_id: 2, devices: \"2\", kv_transfer_config: {C}}}\n")
    assert hits(text, "OPD307") == [(E, "decode stage 2 does not list prefill stage 0 as an input", (5, 5),
                                     "decode's input is [0]", [(3, 5, "prefill")], None)]


def test_opd307_edges_without_the_prefill_decode_edge() -> None:
    text = PD.replace("async_chunk: false\n", "async_chunk: false\nedges:\n  - {from: 1, to: 2}\n  - {from: 2, to: 3}\n")
    assert hits(text, "OPD307") == [(E, "`edges:` has no edge from prefill (stage 0) to decode (stage 1)", (3, 1),
                                     "add `- {from: 0, to: 1}` to `edges:`", [(15, 5, "decode")], None)]


def test_opd307_edges_with_the_prefill_decode_edge_are_clean() -> None:
    text = PD.replace("async_chunk: false\n", "async_chunk: false\nedges:\n  - {from: 0, to: 1}\n  - {from: 1, to: 2}\n")
    assert hits(text, "OPD307") == []


# --- OPD308 pair count ----------------------------------------------------------------------------

_THREE = ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
          f"  - {{stage_id: 0, devices: \"0\", kv_transfer_config: {P}}}\n"
          f"  - {{stage_id: 1, devices: \"1\", kv_transfer_config: {C}}}\n"
          "  - {stage_id: 2, devices: \"2\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: ROLE, "
          "engine_id: t}}\n")


def test_opd308_a_second_producer_on_a_pd_pipeline() -> None:
    assert hits(_THREE.replace("ROLE", "kv_producer"), "OPD308") == [(
        E, "stage 2 is a second kv_producer; vllm-omni supports exactly one PD pair", (6, 92),
        "remove the kv_transfer_config from stages outside the prefill/decode pair",
        [(4, 92, "first kv_producer")], None)]


def test_opd308_a_second_consumer_on_a_pd_pipeline() -> None:
    assert hits(_THREE.replace("ROLE", "kv_consumer"), "OPD308") == [(
        E, "stage 2 is a second kv_consumer; vllm-omni supports exactly one PD pair", (6, 92),
        "remove the kv_transfer_config from stages outside the prefill/decode pair",
        [(5, 92, "first kv_consumer")], None)]


def test_opd308_kv_roles_on_a_pipeline_without_a_split() -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n"
            f"  - {{stage_id: 0, devices: \"0\", kv_transfer_config: {P}}}\n"
            f"  - {{stage_id: 1, devices: \"1\", kv_transfer_config: {C}}}\n")
    assert hits(text, "OPD308") == [(
        E, "stages 0 and 1 are a KV producer/consumer pair, but pipeline qwen3_omni_moe has no prefill/decode "
           "split: PD stays off", (1, 11), "use `pipeline: qwen3_omni_moe_pd`",
        [(4, 92, "consumer")], None)]


# --- OPD309 engine_id -----------------------------------------------------------------------------

def test_opd309_engine_id_shared_with_a_stage_outside_the_pair() -> None:
    text = _THREE.replace("ROLE", "kv_consumer").replace("engine_id: t", "engine_id: p")
    assert hits(text, "OPD309") == [(E, "stages 0 and 2 share engine_id `p`", (6, 116),
                                     "give each engine its own id, e.g. `engine_id: p-2`",
                                     [(4, 116, "first used here")], None)]


# --- OPD610 vLLM's own KVTransferConfig -----------------------------------------------------------

def _stand_in_vllm(monkeypatch, config_module) -> None:
    """Put a ``vllm`` package in ``sys.modules`` whose ``vllm.config`` is ``config_module``
    (None: the import fails, as in a broken install)."""
    pkg = types.ModuleType("vllm")
    pkg.__spec__ = importlib.machinery.ModuleSpec("vllm", None, is_package=True)
    pkg.__path__ = []
    monkeypatch.setitem(sys.modules, "vllm", pkg)
    monkeypatch.setitem(sys.modules, "vllm.config", config_module)


class _KVTransferConfig:
    """The checks of vLLM 0.30 config/kv_transfer.py that OPD610's examples exercise."""

    def __init__(self, kv_role=None, kv_load_failure_policy="fail", **_):
        if kv_role is not None and kv_role not in ("kv_producer", "kv_consumer", "kv_both"):
            raise ValueError(f"Unsupported kv_role: {kv_role}.")
        if kv_load_failure_policy not in ("recompute", "fail"):
            raise ValueError(f"1 validation error for KVTransferConfig\nkv_load_failure_policy\n"
                             f"  Input should be 'recompute' or 'fail' [input_value='{kv_load_failure_policy}']")


def test_opd610_runs_vllms_class_on_each_kv_config(monkeypatch) -> None:
    from omni_pd.check.rules import registry

    mod = types.ModuleType("vllm.config")
    mod.KVTransferConfig = _KVTransferConfig
    _stand_in_vllm(monkeypatch, mod)
    r = registry()["OPD610"]
    assert hits(r.passing, "OPD610") == []
    got = hits(r.fail, "OPD610")
    assert [(h[0], h[1], h[2]) for h in got] == [
        (E, "stage 0: vLLM rejects kv_transfer_config: 1 validation error for KVTransferConfig", (4, 33))]


def test_opd610_says_so_when_vllm_is_installed_but_broken(monkeypatch) -> None:
    from omni_pd.check.rules import registry

    _stand_in_vllm(monkeypatch, None)
    got = hits(registry()["OPD610"].passing, "OPD610")
    assert len(got) == 1
    sev, msg, loc, help_, _, _ = got[0]
    assert (sev, loc) == (I, (4, 33))
    assert msg == ("vLLM is installed but `from vllm.config import KVTransferConfig` failed (ModuleNotFoundError: "
                   "import of vllm.config halted; None in sys.modules): kv_transfer_config was not checked by vLLM")
    assert help_.startswith("repair the vLLM install")


def test_opd610_without_vllm_checks_nothing_and_says_nothing(monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    from omni_pd.check.rules import registry

    assert hits(registry()["OPD610"].fail, "OPD610") == []


@pytest.mark.parametrize("conn", ["NixlConnector", "MooncakeConnector"])
def test_opd610_no_kv_config_no_import(monkeypatch, conn) -> None:
    """A file without any kv_transfer_config never reports OPD610, even with a broken vLLM."""
    _stand_in_vllm(monkeypatch, None)
    text = "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"0\"}\n"
    assert hits(text, "OPD610") == []


# --- every rule example, every field of every diagnostic ------------------------------------------
#
# tests/test_rules.py checks that each example fires (severity + one message fragment) or stays
# clean; the mutation run (bench/MUTATION.md) showed what that lets through: a dropped help line,
# a wrong location or related span, a changed message, a second finding, a lost note. This pins
# the whole of each: tests/golden/rules/examples.json, one entry per rule example (failing,
# passing, and each extra example), read by eye when written. Regenerate on purpose with
# OMNI_PD_REGEN=1 and review the diff.

RULE_GOLDEN = Path(__file__).parent / "golden" / "rules" / "examples.json"
#: rules whose output depends on the environment, pinned by their own tests above instead
_ENV_DEPENDENT = {"OPD610"}


def _rule_examples() -> dict[str, tuple[str, str, dict]]:
    from omni_pd.check.rules import registry

    out: dict[str, tuple[str, str, dict]] = {}
    for code, r in registry().items():
        if code in _ENV_DEPENDENT:
            continue
        out[f"{code} fails"] = (code, r.fail, r.example_context)
        out[f"{code} passes"] = (code, r.passing, r.pass_context if r.pass_context is not None else r.example_context)
        for e in r.examples:
            out[f"{code} {e.name}"] = (code, e.yaml, e.context)
    return out


def _full(code: str, text: str, ctx: dict, res=None) -> list[dict]:
    from omni_pd.check.validate import options_from_example

    res = res if res is not None else validate_text(text, "t.yaml", options_from_example(ctx))

    def loc(x):
        return None if x is None else [x.line, x.column, x.label]

    return [{"severity": d.severity.value, "message": d.message, "at": loc(d.location), "help": d.help,
             "related": [loc(x) for x in d.related], "notes": list(d.notes), "label": d.label}
            for d in res.diagnostics if d.code == code]


def _golden() -> dict:
    return json.loads(RULE_GOLDEN.read_text(encoding="utf-8")) if RULE_GOLDEN.exists() else {}


def test_the_golden_has_exactly_the_rule_examples() -> None:
    if os.environ.get("OMNI_PD_REGEN") == "1":
        got = {k: _full(*v) for k, v in _rule_examples().items()}
        RULE_GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        RULE_GOLDEN.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    assert sorted(_golden()) == sorted(_rule_examples())


@pytest.mark.parametrize("key", sorted(_golden()))
def test_every_rule_example_gives_exactly_its_golden_diagnostics(key: str) -> None:
    # one case per example, so a changed rule fails on its own example first
    from omni_pd.check.validate import options_from_example

    code, text, ctx = _rule_examples()[key]
    res = validate_text(text, "t.yaml", options_from_example(ctx))
    assert _full(code, text, ctx, res) == _golden()[key]
    # and no rule crashes on it: a crash becomes OPD000 (run_rules keeps the other rules
    # going), which the golden, filtered to the example's own code, would not see (e.g.
    # OPD307 unpacking a PD pair that a non-PD example does not have)
    assert [d.message for d in res.diagnostics if d.code == "OPD000"] == []


# --- OPD307 / OPD310 branches the examples miss -----------------------------------------------------

def test_opd307_an_edge_from_prefill_to_another_stage_is_not_the_pd_edge() -> None:
    text = PD + "edges:\n  - {from: 0, to: 2}\n  - {from: 2, to: 1}\n"
    assert hits(text, "OPD307") == [(
        E, "`edges:` has no edge from prefill (stage 0) to decode (stage 1)", (20, 1), "add `- {from: 0, to: 1}` to `edges:`",
        [(12, 5, "decode")], None)]


def test_opd310_without_an_async_chunk_key_points_at_the_document() -> None:
    """No key: vllm-omni's default (on); on a release omni-pd's layer does not make stream the
    finding sits at the document and names the release."""
    assert hits(PD.replace("async_chunk: false\n", ""), "OPD310", ValidateOptions(vllm_version="0.28")) == [(
        E, "async_chunk is on (vllm-omni's default) with a prefill/decode pair: vllm-omni 0.28 refuses async_chunk "
           "with a kv_transfer_config and omni-pd's compatibility layer does not make it stream there",
        (1, 1), "target a release it covers (`--vllm-version 0.30`), or `omni-pd expand --no-stream` (or "
                "`async_chunk: false` in the input) for the one-piece answer", [(7, 5, "KV connector here")], None)]
    # the same file on vllm-omni 0.30 (covered) with no edges: it streams, nothing to say
    assert hits(PD.replace("async_chunk: false\n", ""), "OPD310") == []


def test_opd310_kv_stages_without_a_pd_pair_are_not_its_finding() -> None:
    text = PD.replace("pipeline: qwen3_omni_moe_pd\n", "pipeline: qwen3_omni_moe\n").replace(
        "async_chunk: false", "async_chunk: true")
    assert hits(text, "OPD310") == []
    assert "OPD308" in validate_text(text, "t.yaml").codes()  # the pair without a split is OPD308's


# --- one side without kv_transfer_config: OPD301's finding, no other pair rule runs or crashes ----

@pytest.mark.parametrize("side", [P_KV, D_KV])
def test_pair_rules_leave_a_one_sided_pair_to_opd301(side) -> None:
    text = _buffers("kv_buffer_size: 1e9", "kv_buffer_size: 2e9").replace(side, "")
    codes = validate_text(text, "t.yaml").codes()
    assert "OPD301" in codes
    assert not codes & {"OPD000", "OPD302", "OPD304", "OPD305", "OPD306"}, codes


def test_opd302_a_wrong_role_on_the_only_kv_side_is_left_to_opd301() -> None:
    text = PD.replace(P_KV, "").replace("kv_role: kv_consumer", "kv_role: kv_producer")
    assert hits(text, "OPD302") == []


def test_opd304_prefill_without_kv_connector_is_told_decodes() -> None:
    text = PD.replace("      kv_connector: NixlConnector\n      kv_role: kv_producer", "      kv_role: kv_producer")
    assert hits(text, "OPD304") == [(E, "stage 0: kv_transfer_config has no kv_connector", (8, 5),
                                     "add `kv_connector: NixlConnector`", [], None)]


def test_opd308_a_producer_alone_on_a_pipeline_without_a_split_is_not_a_pair() -> None:
    text = PD.replace("pipeline: qwen3_omni_moe_pd", "pipeline: qwen3_omni_moe").replace(D_KV, "")
    codes = validate_text(text, "t.yaml").codes()
    assert "OPD308" not in codes and "OPD000" not in codes


def test_opd309_a_stage_without_engine_id_before_the_clash_does_not_end_the_scan() -> None:
    text = PD.replace("      engine_id: p\n", "") + (
        "  - stage_id: 2\n    devices: \"1\"\n"
        "    kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}\n")
    assert hits(text, "OPD309") == [(E, "stages 1 and 2 share engine_id `d`", (21, 88),
                                     "give each engine its own id, e.g. `engine_id: d-2`", [(18, 18, "first used here")],
                                     None)]


# --- OPD308 without a `pipeline:` key, OPD311 and OPD312 branch by branch (bench/MUTATION.md pd_pair) ---

_NO_KEY = ("stages:\n"
           f"  - {{stage_id: 0, devices: \"0\", kv_transfer_config: {P}}}\n"
           f"  - {{stage_id: 1, devices: \"1\", kv_transfer_config: {C}}}\n")
_NO_SPLIT = (E, "stages 0 and 1 are a KV producer/consumer pair, but pipeline qwen3_omni_moe has no prefill/decode "
                "split: PD stays off", (2, 33), "use `pipeline: qwen3_omni_moe_pd`", [(3, 92, "consumer")], None)


def test_opd308_pipeline_from_the_option_points_at_the_producers_kv_transfer_config() -> None:
    # no `pipeline:` key to point at: the producer's kv_transfer_config key (2:33), not its stage entry (2:5)
    assert hits(_NO_KEY, "OPD308", ValidateOptions(pipeline="qwen3_omni_moe")) == [_NO_SPLIT]


def test_opd308_pipeline_from_the_deploy_file_name_points_at_the_producers_kv_transfer_config() -> None:
    res = validate_text(_NO_KEY, "qwen3_omni_moe.yaml")  # vllm-omni's default deploy file of qwen3_omni_moe
    assert res.pipeline_name == "qwen3_omni_moe"
    got = [(d.severity, d.message, (d.location.line, d.location.column), d.help,
            [(r.line, r.column, r.label) for r in d.related], d.label) for d in res.diagnostics if d.code == "OPD308"]
    assert got == [_NO_SPLIT]
    assert "OPD000" not in res.codes()


def _peer(p_extra: str, d_extra: str = "", d_stage: str = "") -> str:
    return ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
            "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, "
            f"engine_id: p{p_extra}}}}}\n"
            f"  - {{stage_id: 1, devices: \"1\"{d_stage}, kv_transfer_config: {{kv_connector: NixlConnector, "
            f"kv_role: kv_consumer, engine_id: d{d_extra}}}}}\n")


def test_opd311_a_decode_block_alone_is_checked_and_names_decodes_tensor_parallel_size() -> None:
    # no `prefill:` block before it: the `decode:` block is still read; decode runs TP 2 on two devices
    text = _peer(", kv_connector_extra_config: {decode: {tp_size: 1}}", d_stage=", tensor_parallel_size: 2")
    text = text.replace('devices: "1"', 'devices: "1,2"')
    assert hits(text, "OPD311") == [(
        E, "stage 0: kv_connector_extra_config.decode.tp_size=1 but stage 1 (decode) runs tensor_parallel_size=2",
        (4, 165), "write `tp_size: 2`", [(5, 35, "decode stage 1")], None)]


def test_opd311_dp_size_is_compared_with_the_peers_data_parallel_size() -> None:
    text = _peer(", kv_connector_extra_config: {prefill: {tp_size: 1}, decode: {tp_size: 1, dp_size: 2}}",
                 d_stage=", data_parallel_size: 1")
    assert hits(text, "OPD311") == [(
        E, "stage 0: kv_connector_extra_config.decode.dp_size=2 but stage 1 (decode) runs data_parallel_size=1",
        (4, 200), "write `dp_size: 1`", [(5, 33, "decode stage 1")], None)]


def test_opd311_decodes_own_blocks_are_checked_against_prefill() -> None:
    text = _peer("", d_extra=", kv_connector_extra_config: {prefill: {tp_size: 2, dp_size: 1}, decode: {tp_size: 1}}")
    assert hits(text, "OPD311") == [(
        E, "stage 1: kv_connector_extra_config.prefill.tp_size=2 but stage 0 (prefill) runs tensor_parallel_size=1",
        (5, 166), "write `tp_size: 1`", [(4, 5, "prefill stage 0")], None)]


_ASC = ("{{kv_connector: {conn}, kv_role: {role}, kv_port: {port}, engine_id: {eid}{extra}}}")
_BLOCKS = ", kv_connector_extra_config: {prefill: {dp_size: 1, tp_size: 1}, decode: {dp_size: 1, tp_size: 1}}"
_NPU = ValidateOptions(platform="npu")


def _asc(p: str, d: str) -> str:
    return ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
            f"  - {{stage_id: 0, devices: \"0\", kv_transfer_config: {p}}}\n"
            f"  - {{stage_id: 1, devices: \"1\", kv_transfer_config: {d}}}\n")


def _need(stage: int, side: str, at: tuple, related: tuple, conn: str = "MooncakeConnectorV1") -> tuple:
    return (E, f"stage {stage}: {conn} needs kv_connector_extra_config.{side}.tp_size and dp_size (vllm-ascend "
               "asserts it at worker init)", at,
            f"write `{side}: {{dp_size: 1, tp_size: 1}}` under kv_connector_extra_config on both stages "
            "(omni-pd expand does)", [related], None)


def test_opd312_a_prefill_whose_connector_reads_no_blocks_does_not_end_the_scan() -> None:
    # prefill: layerwise on vllm-ascend 0.18 (reads no peer blocks); decode: MooncakeConnectorV1 without them
    text = _asc(_ASC.format(conn="MooncakeLayerwiseConnector", role="kv_producer", port=36000, eid="p", extra=""),
                _ASC.format(conn="MooncakeConnectorV1", role="kv_consumer", port=36001, eid="d", extra=""))
    assert hits(text, "OPD312", ValidateOptions(platform="npu", vllm_version="0.18")) == [
        _need(1, "prefill", (5, 68), (4, 5, "prefill stage 0")),
        _need(1, "decode", (5, 68), (5, 5, "decode stage 1"))]


def test_opd312_vllm_ascend_mooncake_hybrid_connector_needs_both_blocks_on_both_stages() -> None:
    # issue 22 / BR-49: MooncakeHybridConnector (vllm-ascend 0.23.0.post1) asserts tp_size/dp_size in
    # both blocks (kv_p2p/mooncake_hybrid_connector.py _get_prefill_decode_size); it was unknown (OPD601)
    hy = "MooncakeHybridConnector"
    v23 = ValidateOptions(platform="npu", vllm_version="0.23")
    bare = _asc(_ASC.format(conn=hy, role="kv_producer", port=36000, eid="p", extra=""),
                _ASC.format(conn=hy, role="kv_consumer", port=36001, eid="d", extra=""))
    assert hits(bare, "OPD312", v23) == [
        _need(s, side, (4 + s, 68), (4 if side == "prefill" else 5, 5, f"{side} stage {0 if side == 'prefill' else 1}"), hy)
        for s in (0, 1) for side in ("prefill", "decode")]
    ok = _asc(_ASC.format(conn=hy, role="kv_producer", port=36000, eid="p", extra=_BLOCKS),
              _ASC.format(conn=hy, role="kv_consumer", port=36001, eid="d", extra=_BLOCKS))
    assert hits(ok, "OPD312", v23) == []
    # the whole file is clean as two plain `vllm serve` engines (qwen3_omni_moe_pd adds the Talker's OPD704)
    res = validate_text(ok.replace("qwen3_omni_moe_pd", "llm_pd"), "t.yaml", v23)
    assert [(d.code, d.message) for d in res.diagnostics if d.severity in (E, W)] == []


def test_opd312_a_complete_prefill_block_does_not_end_the_scan_of_the_decode_block() -> None:
    text = _asc(_ASC.format(conn="MooncakeConnectorV1", role="kv_producer", port=36000, eid="p", extra=_BLOCKS),
                _ASC.format(conn="MooncakeConnectorV1", role="kv_consumer", port=36001, eid="d",
                            extra=", kv_connector_extra_config: {prefill: {dp_size: 1, tp_size: 1}}"))
    # no decode block at all: located at the stage's kv_connector value
    assert hits(text, "OPD312", _NPU) == [_need(1, "decode", (5, 68), (5, 5, "decode stage 1"))]


def test_opd312_a_non_mapping_extra_config_under_engine_args_lacks_both_blocks() -> None:
    # engine_args is an open mapping (pydantic does not type its kv_transfer_config), so a list
    # reaches the rules; top-level kv_connector_extra_config: [..] would be OPD101 and dropped
    text = ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
            "  - stage_id: 0\n    devices: \"0\"\n    engine_args:\n      kv_transfer_config: "
            + _ASC.format(conn="MooncakeConnectorV1", role="kv_producer", port=36000, eid="p",
                          extra=", kv_connector_extra_config: [prefill, decode]") + "\n"
            "  - {stage_id: 1, devices: \"1\", kv_transfer_config: "
            + _ASC.format(conn="MooncakeConnectorV1", role="kv_consumer", port=36001, eid="d", extra=_BLOCKS) + "}\n")
    # the prefill stage's span is its entry (4:5), not its `engine_args:` key: Context.sloc with no keys
    assert hits(text, "OPD312", _NPU) == [_need(0, "prefill", (7, 42), (4, 5, "prefill stage 0")),
                                          _need(0, "decode", (7, 42), (8, 5, "decode stage 1"))]


def test_opd311_a_non_mapping_extra_config_under_engine_args_is_skipped_not_a_crash() -> None:
    # engine_args' kv_transfer_config is not typed: OPD311 used to call .get on the list (OPD000)
    # and so also lost decode's own wrong block, which must still be reported
    text = ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
            "  - stage_id: 0\n    devices: \"0\"\n    engine_args:\n      kv_transfer_config: {kv_connector: "
            "NixlConnector, kv_role: kv_producer, engine_id: p, kv_connector_extra_config: [prefill, decode]}\n"
            "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, "
            "engine_id: d, kv_connector_extra_config: {prefill: {tp_size: 2}}}}\n")
    res = validate_text(text, "t.yaml")
    assert [d.message for d in res.diagnostics if "rule OPD311" in d.message] == []
    assert hits(text, "OPD311") == [(
        E, "stage 1: kv_connector_extra_config.prefill.tp_size=2 but stage 0 (prefill) runs tensor_parallel_size=1",
        (8, 166), "write `tp_size: 1`", [(4, 5, "prefill stage 0")], None)]


def test_opd308_names_only_catalogued_pipelines_which_are_never_placeholder_chains() -> None:
    # OPD308's help writes `pipeline: <name>_pd` from the catalogued name; validate's stand-in
    # chains (`<linear chain>`, `<inferred PD chain>`, `<foo: linear chain>`) are never catalogued
    from omni_pd.compile.pipelines import load_catalogue

    assert all(n[:1].isalpha() for n in load_catalogue().names())
    for text in (_NO_KEY.replace("stages:", "pipeline: foo\nstages:"),  # uncatalogued name: OPD207 info
                 _NO_KEY + "  - {stage_id: 2, devices: \"2\"}\n"):      # no name, a pair: OPD208, a PD chain
        assert hits(text, "OPD308") == []


# --- engine_args.kv_transfer_config is typed like a stage's own (no rule meets a wrong type) ---

_NESTED_KV = """pipeline: llm_pd
stages:
  - stage_id: 0
    devices: "0"
    {where}
        kv_connector: NixlConnector
        kv_role: kv_producer
        kv_connector_extra_config: [a, b]
  - stage_id: 1
    devices: "1"
    kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_consumer}}
"""


def test_a_list_extra_config_under_engine_args_is_one_located_opd101_and_no_rule_crashes() -> None:
    """vllm-omni flattens engine_args into the engine arguments, so vLLM's KVTransferConfig
    (``kv_connector_extra_config: dict[str, Any]``) refuses the list either way. OPD104 and
    OPD504 crashed on it (OPD000) before the nested config was typed."""
    text = _NESTED_KV.format(where="engine_args:\n      kv_transfer_config:")
    res = validate_text(text, "pd.yaml", ValidateOptions())
    assert [d.code for d in res.diagnostics if d.code == "OPD000"] == []
    opd101 = [(d.message, d.location.line, d.location.column, d.help) for d in res.diagnostics if d.code == "OPD101"]
    assert opd101 == [("`kv_connector_extra_config` must be a mapping, found a list", 9, 36,
                       "write a mapping for `kv_connector_extra_config`")]


def test_the_nested_and_the_stage_level_wrong_type_read_alike() -> None:
    nested = validate_text(_NESTED_KV.format(where="engine_args:\n      kv_transfer_config:"), "a.yaml", ValidateOptions())
    flat = validate_text(_NESTED_KV.format(where="kv_transfer_config:").replace("\n        kv_", "\n      kv_"),
                         "b.yaml", ValidateOptions())
    msg = [d.message for d in nested.diagnostics if d.code == "OPD101"]
    assert msg == [d.message for d in flat.diagnostics if d.code == "OPD101"] != []


def test_a_list_extra_config_under_a_platform_overlays_engine_args_is_one_opd101_and_no_rule_crashes() -> None:
    """The overlay entry's ``engine_args.kv_transfer_config`` reaches the stage like the base's
    (vllm-omni applies the overlay, then flattens engine_args): OPD104, OPD501, OPD502, OPD504
    and OPD620 crashed on the list (OPD000) and no OPD101 named it."""
    text = (_NESTED_KV.format(where="kv_transfer_config:").replace("\n        kv_", "\n      kv_")
            .replace("kv_connector_extra_config: [a, b]", "kv_connector_extra_config: {}")
            + "platforms:\n  npu:\n    stages:\n      - stage_id: 0\n        engine_args:\n"
              "          kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, "
              "kv_connector_extra_config: [a]}\n")
    for opts in (ValidateOptions(platform="npu"), ValidateOptions(all_platforms=True)):
        res = validate_text(text, "pd.yaml", opts)
        assert [d.message for d in res.diagnostics if d.code == "OPD000"] == []
        assert [(d.message, d.location.line, d.location.column, d.help) for d in res.diagnostics
                if d.code == "OPD101"] == [("`kv_connector_extra_config` must be a mapping, found a list", 17, 110,
                                            "write a mapping for `kv_connector_extra_config`")]


def test_opd304_a_multiconnector_prefill_whose_handoff_child_is_decodes_connector_pairs_on_vllm_serve() -> None:
    # issue 22 precision (TC-11's fix): MultiConnector[Nixl, LMCacheMP] on prefill, Nixl on decode is a correct
    # pair of plain `vllm serve` engines (vLLM pairs by the handoff child's kv_transfer_params)
    def text(pipeline: str, kids: str) -> str:
        return (f"pipeline: {pipeline}\nasync_chunk: false\nstages:\n"
                "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MultiConnector, kv_role: kv_producer, "
                f"engine_id: p, kv_connector_extra_config: {{connectors: [{kids}]}}}}}}\n"
                "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, "
                "engine_id: d}}\n")
    nixl_lmc = "{kv_connector: NixlConnector, kv_role: kv_producer}, {kv_connector: LMCacheMPConnector, kv_role: kv_producer}"
    assert hits(text("llm_pd", nixl_lmc), "OPD304") == []
    # vllm-omni compares the names itself (_validate_pd_separation_config): still the finding there
    assert [h[1] for h in hits(text("qwen3_omni_moe_pd", nixl_lmc), "OPD304")] == [
        "prefill and decode use different KV connectors"]
    # a MultiConnector without decode's connector as a child moves nothing to it
    mc_lmc = "{kv_connector: MooncakeConnector, kv_role: kv_producer}, {kv_connector: LMCacheMPConnector, kv_role: kv_producer}"
    assert [h[1] for h in hits(text("llm_pd", mc_lmc), "OPD304")] == ["prefill and decode use different KV connectors"]


def test_opd306_help_says_one_device_not_one_devices() -> None:
    """Prefill TP 1, decode TP 2: 'give it 1 devices' before (new-user walkthrough)."""
    one = PD.replace('    devices: "0"\n', '    devices: "0"\n    tensor_parallel_size: 1\n').replace(
        '    devices: "1"\n', '    devices: "1,2"\n    tensor_parallel_size: 2\n')
    assert [h[3] for h in hits(one, "OPD306")] == ["set `tensor_parallel_size: 1` on decode (and give it 1 device)"]
