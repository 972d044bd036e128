"""Root cause first (issue 24, item 9).

A misspelt key (``tensor_paralel_size``) leaves ``tensor_parallel_size`` at its default, so
OPD306 (prefill TP 2, decode TP 1) and OPD401 (2 devices for TP 1) fire too; sorted by line,
OPD306 came before the OPD103 that causes it. Findings now name the key paths they read
(``Diagnostic.reads``) and OPD103 the path it leaves unset (``shadows``);
omni_pd/check/causes.py lists each caused finding right after its cause, with a note.
"""

from __future__ import annotations

import json
from pathlib import Path

from omni_pd.check.causes import key_of, order_by_cause
from omni_pd.check.validate import validate_text
from rule_found import validate_cli  # tests/rule_found.py
from omni_pd.diagnostics import Diagnostic, Location, Severity

#: decode's TP is misspelt; its "2,3" and prefill's TP 2 are what the user meant
TYPO_ON_DECODE = """\
pipeline: qwen3_omni_moe_pd
async_chunk: false
stages:
  - stage_id: 0
    devices: "0,1"
    tensor_parallel_size: 2
    env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "5600"}
    kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}
  - stage_id: 1
    devices: "2,3"
    tensor_paralel_size: 2
    env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "5610"}
    kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}
"""

EXPECTED = """\
error[OPD103]: unknown stage key `tensor_paralel_size`: vllm-omni 0.30 refuses to start ("no structured config owner")
  --> pd.yaml:11:5
   |
11 |     tensor_paralel_size: 2
   |     ^^^^^^^^^^^^^^^^^^^
   = note: this leaves `stages[1].tensor_parallel_size` unset (its default); the findings listed next follow from that: OPD306 at pd.yaml:9:5, OPD401 at pd.yaml:10:14
   = help: did you mean `tensor_parallel_size`?

error[OPD306]: tensor_parallel_size differs: prefill 2, decode 1; vllm-omni's PD validator requires them equal
 --> pd.yaml:9:5
  |
9 |   - stage_id: 1
  |     ^^^^^^^^
  = note: prefill TP 2: pd.yaml:6:27
  = note: follows from OPD103 at pd.yaml:11:5, which leaves `stages[1].tensor_parallel_size` unset (its default)
  = help: set `tensor_parallel_size: 2` on decode (and give it 2 devices)

error[OPD401]: stage 1: tensor_parallel_size 1 x pipeline_parallel_size 1 x data_parallel_size 1 = 1 device, but devices has 2 entries
  --> pd.yaml:10:14
   |
10 |     devices: "2,3"
   |              ^^^^^
   = note: follows from OPD103 at pd.yaml:11:5, which leaves `stages[1].tensor_parallel_size` unset (its default)
   = help: list 1 device here, e.g. devices: "2"
pd.yaml: FAILED (3 errors, 0 warnings, 0 info)
"""


def _run(tmp_path: Path, capsys, text: str, *args: str) -> tuple[int, str]:
    return validate_cli(tmp_path, capsys, "pd.yaml", text, *args)


def test_typo_is_listed_before_the_findings_its_default_causes(tmp_path, capsys):
    rc, out = _run(tmp_path, capsys, TYPO_ON_DECODE)
    assert rc == 1
    assert out == EXPECTED


def test_json_keeps_every_finding_in_cause_order(tmp_path, capsys):
    """Nothing is folded away: JSON (and so SARIF) has the three findings, cause first."""
    rc, out = _run(tmp_path, capsys, TYPO_ON_DECODE, "--format", "json")
    assert rc == 1
    got = json.loads(out)
    assert [(d["code"], d["location"]["line"]) for d in got] == [("OPD103", 11), ("OPD306", 9), ("OPD401", 10)]
    assert got[1]["notes"][-1] == ("follows from OPD103 at pd.yaml:11:5, which leaves "
                                  "`stages[1].tensor_parallel_size` unset (its default)")


def test_typo_inside_engine_args_is_the_same_cause():
    """``engine_args.tensor_paralel_size`` shadows the stage's TP too (vllm-omni flattens
    engine_args into the stage), so the order is the same."""
    text = TYPO_ON_DECODE.replace("    tensor_paralel_size: 2\n", "    engine_args: {tensor_paralel_size: 2}\n")
    res = validate_text(text, "pd.yaml")
    assert [(d.code, d.location.line) for d in res.diagnostics] == [("OPD103", 11), ("OPD306", 9), ("OPD401", 10)]
    assert res.diagnostics[0].shadows == (("stages", 1, "engine_args", "tensor_parallel_size"),)


def test_misspelt_kv_transfer_config_comes_before_opd301():
    text = TYPO_ON_DECODE.replace("    kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer",
                                  "    kv_transfer_confg: {kv_connector: NixlConnector, kv_role: kv_producer")
    text = text.replace("tensor_paralel_size", "tensor_parallel_size")
    res = validate_text(text, "pd.yaml")
    assert [(d.code, d.location.line) for d in res.diagnostics] == [("OPD103", 8), ("OPD301", 4)]
    assert res.diagnostics[1].notes[-1] == ("follows from OPD103 at pd.yaml:8:5, which leaves "
                                            "`stages[0].kv_transfer_config` unset (its default)")


def test_a_correct_file_has_no_cause_notes():
    """The same file with the key spelt right: OPD306/OPD401 gone, nothing reordered."""
    res = validate_text(TYPO_ON_DECODE.replace("tensor_paralel_size", "tensor_parallel_size"), "pd.yaml")
    assert res.errors == []


# --- the ordering pass on its own (pure) ------------------------------------------------

def _d(code: str, line: int, *, reads=(), shadows=()) -> Diagnostic:
    return Diagnostic(code=code, severity=Severity.ERROR, message=code, location=Location("f.yaml", line, 1),
                      reads=tuple(reads), shadows=tuple(shadows))


def test_unrelated_findings_keep_their_sorted_place():
    tp = ("stages", 1, "tensor_parallel_size")
    diags = [_d("OPD201", 2), _d("OPD306", 5, reads=[tp]), _d("OPD501", 7), _d("OPD103", 9, shadows=[tp]),
             _d("OPD401", 10, reads=[("stages", 1, "runtime", "tensor_parallel_size")]), _d("OPD601", 12)]
    out = order_by_cause(diags)
    assert [d.code for d in out] == ["OPD201", "OPD501", "OPD103", "OPD306", "OPD401", "OPD601"]
    assert [len(d.notes) for d in out] == [0, 0, 1, 1, 1, 0]
    assert diags[1].notes == []  # the input is not changed


def test_a_read_of_another_stage_is_not_caused():
    diags = [_d("OPD306", 5, reads=[("stages", 0, "tensor_parallel_size")]),
             _d("OPD103", 9, shadows=[("stages", 1, "tensor_parallel_size")])]
    assert order_by_cause(diags) == diags
    assert [d.notes for d in order_by_cause(diags)] == [[], []]


def test_a_chain_is_followed_and_a_cycle_left_alone():
    a, b = ("stages", 0, "a"), ("stages", 0, "b")
    chain = [_d("X3", 1, reads=[b]), _d("X2", 2, reads=[a], shadows=[b]), _d("X1", 3, shadows=[a])]
    assert [d.code for d in order_by_cause(chain)] == ["X1", "X2", "X3"]
    cycle = [_d("Y1", 1, reads=[b], shadows=[a]), _d("Y2", 2, reads=[a], shadows=[b])]
    assert [(d.code, d.notes) for d in order_by_cause(cycle)] == [("Y1", []), ("Y2", [])]


def test_key_of_flattens_stage_blocks_only():
    assert key_of(("stages", 2, "engine_args", "max_num_seqs")) == ("stages", 2, "max_num_seqs")
    assert key_of(("stages", 2, "runtime", "devices")) == ("stages", 2, "devices")
    assert key_of(("platforms", "npu", "engine_args", "x")) == ("platforms", "npu", "engine_args", "x")


def test_a_misspelt_top_level_key_comes_before_what_its_default_causes():
    """``async_chnk: false`` leaves async_chunk on (vllm-omni's default): OPD310 (here the
    launcher turns omni-pd's streaming patches off, so the pair cannot stream), located at
    the top of the file, came before the typo on line 2."""
    from omni_pd.check.validate import ValidateOptions

    text = TYPO_ON_DECODE.replace("async_chunk: false", "async_chnk: false").replace(
        "tensor_paralel_size", "tensor_parallel_size")
    res = validate_text(text, "pd.yaml", ValidateOptions(env={"OMNI_PD_VLLM_OMNI_STREAM_PD": "0"}))
    assert [(d.code, d.location.line) for d in res.diagnostics] == [("OPD103", 2), ("OPD310", 1)]
    assert res.diagnostics[0].notes == ["this leaves `async_chunk` unset (its default); the findings listed "
                                        "next follow from that: OPD310 at pd.yaml:1:1"]
