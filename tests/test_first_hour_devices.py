"""Carets and device labels (issue 24, item 10).

* ``devices: "2,3,4,5"`` was underlined ``^^``: the caret stopped at the first ``,``
  inside the quotes. A quoted scalar is now underlined whole, quotes included (as
  ``"4"`` always was), and a block-context plain ``2,3`` likewise.
* A memory finding (OPD404) named ``physical GPU 4 ... TP rank 0`` for entry 4 of a TP 2
  stage on ``"2,3,4,5"``: vLLM's workers use the first TP x PP x DP entries only.
* Under ``CUDA_VISIBLE_DEVICES=4,5`` logical device 4 was read as physical GPU 4.
"""

from __future__ import annotations

from pathlib import Path

from omni_pd.compile.devices import device_name, parse_visible, passed_through, physical_ids, rank_names
from omni_pd.diagnostics import Diagnostic, Location, Severity, render_text
from rule_found import found, validate_cli  # tests/rule_found.py


def _validate(tmp_path: Path, capsys, text: str, *args: str) -> tuple[int, str]:
    return validate_cli(tmp_path, capsys, "d.yaml", text, *args)


def _block(out: str, code: str) -> list[str]:
    """The rendered lines of the first ``code`` finding, up to its blank line."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if f"[{code}]" in ln)
    end = next((i for i in range(start, len(lines)) if not lines[i] or lines[i].startswith("d.yaml:")), len(lines))
    return lines[start:end]


# --- carets ---------------------------------------------------------------------------------------

def test_a_quoted_device_list_is_underlined_whole(tmp_path, capsys) -> None:
    text = "stages:\n  - stage_id: 0\n    devices: \"2,3,4,5\"\n    tensor_parallel_size: 2\n"
    rc, out = _validate(tmp_path, capsys, text, "--pipeline", "llm")
    assert rc == 1
    assert _block(out, "OPD401") == [
        "error[OPD401]: stage 0: tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 1 = 2 "
        "devices, but devices has 4 entries",
        " --> d.yaml:3:14",
        "  |",
        "3 |     devices: \"2,3,4,5\"",
        "  |              ^^^^^^^^^",
        "  = help: list 2 devices here, e.g. devices: \"2,3\"",
    ]


def _caret(src: str, col: int) -> str:
    d = Diagnostic(code="OPD000", severity=Severity.ERROR, message="m", location=Location(file="f", line=1, column=col))
    return render_text([d], lambda f, n: src).splitlines()[4]


def test_caret_spans_of_quoted_plain_and_flow_scalars() -> None:
    # single quotes with the '' escape, double quotes with \" and a space inside
    assert _caret("devices: 'a''b,c'  # x", 10) == "  |          ^^^^^^^^"
    assert _caret('name: "a \\" b"', 7) == "  |       ^^^^^^^^"
    # block context: a plain 2,3 is one scalar; inside a flow mapping the comma ends it
    assert _caret("devices: 2,3", 10) == "  |          ^^^"
    assert _caret("- {stage_id: 0, devices: 2}", 14) == "  |              ^"
    assert _caret("- {stage_id: 0, devices: \"0,1\"}", 26) == "  |                          ^^^^^"
    # a key is still underlined up to its colon
    assert _caret("    devices: \"0\"", 5) == "  |     ^^^^^^^"


# --- ranks: vLLM's workers take the entries in order, per DP replica -------------------------------

_MEM_HELP = "lower gpu_memory_utilization so the stages on this device sum to at most 1.0, or move one to another device"
_Q = "pipeline: qwen3_omni_moe\nstages:\n"


def test_an_entry_past_the_world_size_holds_no_tp_rank(tmp_path, capsys) -> None:
    # TP 2 on "2,3,4,5": vLLM's workers take cuda:0 and cuda:1 of the four, i.e. logical 2
    # and 3; logical 4 holds no rank (it was "physical GPU 4: 0.6 (stage 0, TP rank 0) + 0.6
    # (stage 1)"). Only OPD401 stands.
    text = (_Q + "  - stage_id: 0\n    devices: \"2,3,4,5\"\n    tensor_parallel_size: 2\n"
            "    gpu_memory_utilization: 0.6\n  - stage_id: 1\n    devices: \"4\"\n    gpu_memory_utilization: 0.6\n")
    assert found(text, "OPD404") == []
    assert [h[1] for h in found(text, "OPD401")] == [
        "stage 0: tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 1 = 2 devices, but devices "
        "has 4 entries"]
    # the entry a rank does use still counts
    assert [h[1] for h in found(text.replace("devices: \"4\"", "devices: \"3\""), "OPD404")] == [
        "physical GPU 3: 0.6 (stage 0, TP rank 1) + 0.6 (stage 1) = 1.20 > 1.0"]


def test_tp2_dp2_on_four_devices_names_the_dp_and_tp_rank(tmp_path, capsys) -> None:
    # DP_LOCAL_RANK * TP * PP + TP_LOCAL_RANK (vLLM Worker.init_device): entry 2 is DP rank 1, TP rank 0
    text = (_Q + "  - stage_id: 0\n    devices: \"2,3,4,5\"\n    tensor_parallel_size: 2\n    data_parallel_size: 2\n"
            "    gpu_memory_utilization: 0.6\n  - stage_id: 1\n    devices: \"4\"\n    gpu_memory_utilization: 0.6\n")
    assert found(text, "OPD404") == [(
        "error", "physical GPU 4: 0.6 (stage 0, DP rank 1, TP rank 0) + 0.6 (stage 1) = 1.20 > 1.0", (10, 29),
        _MEM_HELP, [(7, 29, "stage 0 reserves 0.6")])]
    rc, out = _validate(tmp_path, capsys, text)
    assert _block(out, "OPD404")[1:5] == [
        "  --> d.yaml:10:29", "   |", "10 |     gpu_memory_utilization: 0.6", "   |                             ^^^"]


# --- logical -> physical under a visibility variable -----------------------------------------------

_TWO = ("stages:\n  - stage_id: 0\n    devices: \"0\"\n    gpu_memory_utilization: 0.6\n"
        "  - stage_id: 1\n    devices: \"DEV\"\n    gpu_memory_utilization: 0.6\n")


def test_one_logical_device_names_its_physical_gpu_and_the_variable(tmp_path, capsys) -> None:
    text = _TWO.replace("\"0\"", "\"1\"").replace("\"DEV\"", "\"1\"")
    ctx = {"env": {"CUDA_VISIBLE_DEVICES": "4,5"}}
    assert found(text, "OPD404", ctx) == [(
        "error", "logical device 1 (physical GPU 5 under CUDA_VISIBLE_DEVICES=4,5): 0.6 (stage 0) + 0.6 (stage 1) "
                 "= 1.20 > 1.0", (7, 29), _MEM_HELP, [(4, 29, "stage 0 reserves 0.6")])]


def test_a_list_outside_the_visible_set_is_what_vllm_omni_passes_through_as_physical(tmp_path, capsys) -> None:
    # CUDA_VISIBLE_DEVICES=4,5: stage 0's logical 0 is physical 4; stage 1's "4" has no
    # entry below 2, which vllm-omni's _map_device_list passes through as physical id 4.
    # Before, OPD404 said "physical GPU 4" as if logical 4 were physical 4 under the
    # variable, and OPD402 did not say what vllm-omni then does.
    text = _TWO.replace("\"DEV\"", "\"4\"")
    rc, out = _validate(tmp_path, capsys, text, "--env", "CUDA_VISIBLE_DEVICES=4,5")
    assert rc == 1
    assert _block(out, "OPD402") == [
        "error[OPD402]: stage 1 uses device 4, but only 2 GPUs are visible (the launcher's visibility variable lists 2)",
        " --> d.yaml:6:14",
        "  |",
        "6 |     devices: \"4\"",
        "  |              ^^^",
        "  = note: vllm-omni 0.30 reads a list with no entry below the 2 visible devices as physical ids: stage 1 "
        "would run on physical GPU 4, not on entries of CUDA_VISIBLE_DEVICES=4,5",
        "  = help: use device indices 0..1, or run on a host with more GPUs",
    ]
    assert _block(out, "OPD404")[:5] == [
        "error[OPD404]: physical GPU 4: 0.6 (stage 0, logical device 0 of CUDA_VISIBLE_DEVICES=4,5) + 0.6 (stage 1, "
        "device 4 read as physical: no entry below the 2 visible) = 1.20 > 1.0",
        " --> d.yaml:7:29",
        "  |",
        "7 |     gpu_memory_utilization: 0.6",
        "  |                             ^^^",
    ]


def test_an_entry_vllm_omni_drops_is_not_counted_on_a_physical_gpu() -> None:
    # "0,4" under 4,5: entry 4 is dropped ("Falling back to mapped subset"), so nothing of
    # stage 1 lands on physical 4 (before: "physical GPU 4", read as logical == physical)
    text = (_Q + "  - {stage_id: 0, devices: \"1\", gpu_memory_utilization: 0.6}\n"
            "  - {stage_id: 1, devices: \"0,4\", tensor_parallel_size: 2, gpu_memory_utilization: 0.6}\n")
    ctx = {"env": {"CUDA_VISIBLE_DEVICES": "4,5"}}
    assert found(text, "OPD404", ctx) == []
    assert found(text, "OPD402", ctx, notes=True) == [(
        "error", "stage 1 uses device 4, but only 2 GPUs are visible (the launcher's visibility variable lists 2)",
        (4, 28), "use device indices 0..1, or run on a host with more GPUs", [],
        ["vllm-omni drops the entries outside CUDA_VISIBLE_DEVICES=4,5 and starts on the rest"])]


def test_a_stage_env_visibility_variable_maps_that_stage(tmp_path, capsys) -> None:
    # vllm-omni applies a stage's runtime.env before mapping its devices (stage_runtime_setup)
    text = _TWO.replace("\"DEV\"", "\"1\"\n    env: {CUDA_VISIBLE_DEVICES: \"5,4\"}")
    ctx = {"env": {"CUDA_VISIBLE_DEVICES": "4,5"}}
    assert [h[1] for h in found(text, "OPD404", ctx)] == [
        "physical GPU 4: 0.6 (stage 0, logical device 0 of CUDA_VISIBLE_DEVICES=4,5) + 0.6 (stage 1, logical device 1 "
        "of CUDA_VISIBLE_DEVICES=5,4) = 1.20 > 1.0"]
    # without the launcher variable, stage 0's logical 0 is physical 0: no shared device
    assert found(text, "OPD404") == []
    # a stage env value out of range is counted against that stage's own list
    bad = _TWO.replace("\"DEV\"", "\"1\"\n    env: {CUDA_VISIBLE_DEVICES: \"5\"}")
    assert [h[1] for h in found(bad, "OPD402")] == [
        "stage 1 uses device 1, but only 1 GPU is visible (the stage's env CUDA_VISIBLE_DEVICES lists 1)"]


# --- the mapping itself (omni_pd/compile/devices.py) -----------------------------------------------

def test_physical_ids_follow_vllm_omnis_map_device_list() -> None:
    assert parse_visible(" 4, 5,") == ("4", "5") and parse_visible("") is None and parse_visible(None) is None
    assert physical_ids((0, 1), None) == ("0", "1")
    assert physical_ids((1, 0), ("4", "5")) == ("5", "4")
    assert physical_ids((0, 3), ("1", "3", "4", "5", "6")) == ("1", "5")
    assert physical_ids((0, 4), ("4", "5")) == ("4", None)  # dropped: another entry maps
    assert physical_ids((4, 7), ("4", "5")) == ("4", "7")  # every entry outside: passed through
    assert passed_through((4, 7), ("4", "5")) and not passed_through((0, 4), ("4", "5"))
    assert not passed_through((4,), None)
    assert device_name(1, ("4", "5"), "CUDA_VISIBLE_DEVICES") == \
        "logical device 1 (physical GPU 5 under CUDA_VISIBLE_DEVICES=4,5)"
    assert device_name(3, None, "ASCEND_RT_VISIBLE_DEVICES", "NPU") == "physical NPU 3"


def test_rank_names_follow_vllms_worker_device_index() -> None:
    assert rank_names(2, 2, 1, 1, 2) == ("TP rank 0", "TP rank 1")
    assert rank_names(4, 2, 1, 1, 2) == ("TP rank 0", "TP rank 1", None, None)
    assert rank_names(4, 2, 1, 2, 4) == ("DP rank 0, TP rank 0", "DP rank 0, TP rank 1",
                                         "DP rank 1, TP rank 0", "DP rank 1, TP rank 1")
    assert rank_names(4, 2, 2, 1, 4) == ("PP rank 0, TP rank 0", "PP rank 0, TP rank 1",
                                         "PP rank 1, TP rank 0", "PP rank 1, TP rank 1")
    assert rank_names(4, 2, 1, 1, 2, replicas=2) == ("replica 0, TP rank 0", "replica 0, TP rank 1",
                                                     "replica 1, TP rank 0", "replica 1, TP rank 1")
    assert rank_names(1, 1, 1, 1, 1) == ("",)
    assert rank_names(2, 1, 1, 1, 2) == ("rank 0", "rank 1")  # world 2 from CFG/SP, not TP x PP x DP
