"""`omni-pd launch` places the plain-vLLM engines where vllm-omni 0.30 would (issue 24 item
10): a stage's ``devices`` entries index the launcher's visibility variable
(``CUDA_VISIBLE_DEVICES``, ``ASCEND_RT_VISIBLE_DEVICES`` ...), or the stage's own env value of
it, and each child's variable carries the physical ids (vllm_omni/entrypoints/stage_utils.py
``resolve_stage_physical_devices`` / ``_map_device_list``; omni_pd/compile/devices.py).

Before this, ``CUDA_VISIBLE_DEVICES=4,5 omni-pd launch`` set prefill's ``CUDA_VISIBLE_DEVICES``
to ``0`` and decode's to ``1``: the children ran on physical GPUs 0 and 1.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_pd.compile.expand import expand_document
from omni_pd.compile.parse import parse_config
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.compile.pipelines import load_catalogue
from omni_pd.compile.targets import target
from omni_pd.compile.topology import resolve
from omni_pd.io import parse_text
from omni_pd.launch import preflight as pf
from omni_pd.launch.plan import LaunchOptions, build_plan, launcher_visibility, map_devices, plan_document

ROOT = Path(__file__).resolve().parent
LLM = ROOT / "fixtures" / "llm.yaml"
ASCEND = ROOT / "golden" / "ascend" / "thinker_tp4_to_2_pull.yaml"
NIXL_ENV = ("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
SRC = "vllm_omni/entrypoints/stage_utils.py resolve_stage_physical_devices"


def pd_text(**kw) -> str:
    """llm.yaml expanded to a NixlConnector pair (prefill devices first, then decode)."""
    opts = ExpandOptions(connector="NixlConnector", kv_buffer_device="cpu", **kw)
    return expand_document(parse_text(LLM.read_text(), LLM.name), opts, pipeline="llm").text


def planned(text: str, **kw):
    return plan_document(parse_text(text, "pd.yaml"), "/cfg/pd.yaml", LaunchOptions(model="m", vllm="/v/vllm", **kw))


def plan_of(text: str, **kw):
    got = planned(text, **kw)
    assert got.plan is not None, [d.message for d in got.validation.diagnostics]
    return got.plan


def built(text: str, **kw):
    """build_plan without validation: what the plan does with a list validate refuses."""
    doc = parse_text(text, "pd.yaml")
    topo = resolve(parse_config(doc), load_catalogue().get("llm_pd"), None, doc)
    return build_plan(topo, "/cfg/pd.yaml", LaunchOptions(model="m", vllm="/v/vllm", **kw), target(None))


def engines(plan) -> dict[str, tuple[dict, str | None, str | None, str | None]]:
    return {p.name: (dict(p.env), p.devices, p.logical_devices, p.visible_devices)
            for p in plan.processes if p.role != "router"}


def nixl(port: int, cvd: str) -> dict[str, str]:
    return {NIXL_ENV[0]: NIXL_ENV[1], "VLLM_NIXL_SIDE_CHANNEL_PORT": str(port), "CUDA_VISIBLE_DEVICES": cvd}


def test_1p1d_under_cuda_visible_devices_4_5_runs_on_physical_4_and_5():
    plan = plan_of(pd_text(), launcher_env={"CUDA_VISIBLE_DEVICES": "4,5"})
    assert engines(plan) == {"prefill-0": (nixl(5600, "4"), "4", "0", "4,5"),
                             "decode-0": (nixl(5601, "5"), "5", "1", "4,5")}
    assert plan.notes[-2:] == (
        'prefill-0: devices "0" index CUDA_VISIBLE_DEVICES=4,5 (the launcher\'s environment): it starts with '
        f"CUDA_VISIBLE_DEVICES=4 (logical->physical 0->4) ({SRC})",
        'decode-0: devices "1" index CUDA_VISIBLE_DEVICES=4,5 (the launcher\'s environment): it starts with '
        f"CUDA_VISIBLE_DEVICES=5 (logical->physical 1->5) ({SRC})")


def test_no_visibility_variable_leaves_the_devices_as_written():
    plan = plan_of(pd_text())
    assert engines(plan) == {"prefill-0": (nixl(5600, "0"), "0", "0", None),
                             "decode-0": (nixl(5601, "1"), "1", "1", None)}
    assert not any("index CUDA_VISIBLE_DEVICES" in n for n in plan.notes)
    # another platform's variable in the launcher's environment changes nothing on cuda
    assert engines(plan_of(pd_text(), launcher_env={"ASCEND_RT_VISIBLE_DEVICES": "4,5"})) == engines(plan)


def test_2p1d_tp2_under_six_visible_gpus_each_instance_gets_its_physical_pair():
    """xPyD, TP 2: the prefill pool "0,1,2,3" splits into "0,1" and "2,3" (vllm-omni's
    split_devices_for_replicas, logical values) and each instance's pair is then mapped."""
    text = pd_text(tp=2, prefill_replicas=2, decode_replicas=1)
    plan = plan_of(text, launcher_env={"CUDA_VISIBLE_DEVICES": "2,3,4,5,6,7"})
    assert engines(plan) == {"prefill-0": (nixl(5600, "2,3"), "2,3", "0,1", "2,3,4,5,6,7"),
                             "prefill-1": (nixl(5601, "4,5"), "4,5", "2,3", "2,3,4,5,6,7"),
                             "decode-0": (nixl(5602, "6,7"), "6,7", "4,5", "2,3,4,5,6,7")}
    for p in plan.processes[:3]:
        assert p.argv[p.argv.index("--tensor-parallel-size") + 1] == "2"


def test_1p1d_tp2_under_4_5_decode_has_no_entry_inside_and_launch_refuses_as_validate_does():
    """TP 2 on "0,1" / "2,3" with two visible GPUs: decode's list has no entry inside the
    visible set, which vllm-omni passes through as physical GPUs 2,3 (outside what the
    launcher may use); launch reports OPD402, as `validate --env` does, and starts nothing."""
    text = pd_text(tp=2)
    got = planned(text, launcher_env={"CUDA_VISIBLE_DEVICES": "4,5"})
    assert got.plan is None
    assert [(d.code, d.message, d.notes) for d in got.validation.diagnostics if d.code == "OPD402"] == [
        ("OPD402", "stage 1 uses device 2, 3, but only 2 GPUs are visible (the launcher's visibility variable "
                   "lists 2)",
         ["vllm-omni 0.30 reads a list with no entry below the 2 visible devices as physical ids: stage 1 would "
          "run on physical GPU 2, 3, not on entries of CUDA_VISIBLE_DEVICES=4,5"])]
    plan = built(text, launcher_env={"CUDA_VISIBLE_DEVICES": "4,5"})
    assert engines(plan)["decode-0"] == (nixl(5601, "2,3"), "2,3", "2,3", "4,5")
    assert plan.notes[-1] == (
        'decode-0: devices "2,3" have no entry below the 2 of CUDA_VISIBLE_DEVICES=4,5 (the launcher\'s '
        "environment): read as physical ids, it starts with CUDA_VISIBLE_DEVICES=2,3, as vllm-omni passes such a "
        "list through (vllm_omni/entrypoints/stage_utils.py _map_device_list)")


def test_an_entry_outside_the_visible_set_is_dropped_and_launch_says_so():
    """TP 2 on "0,1" / "2,3" with three visible GPUs: decode's logical 3 is outside
    4,5,6: vllm-omni drops it and starts decode on physical 6 alone; the plan does the
    same, and launch refuses it with validate's OPD402 naming what vllm-omni does."""
    text = pd_text(tp=2)
    plan = built(text, launcher_env={"CUDA_VISIBLE_DEVICES": "4,5,6"})
    assert engines(plan) == {"prefill-0": (nixl(5600, "4,5"), "4,5", "0,1", "4,5,6"),
                             "decode-0": (nixl(5601, "6"), "6", "2,3", "4,5,6")}
    assert plan.notes[-1] == (
        'decode-0: devices "2,3" index CUDA_VISIBLE_DEVICES=4,5,6 (the launcher\'s environment): it starts with '
        "CUDA_VISIBLE_DEVICES=6 (logical->physical 2->6); logical device 3 is outside it and dropped, as vllm-omni "
        f"drops it ({SRC})")
    got = planned(text, launcher_env={"CUDA_VISIBLE_DEVICES": "4,5,6"})
    assert got.plan is None
    assert [(d.code, d.message, d.notes) for d in got.validation.diagnostics if d.code == "OPD402"] == [
        ("OPD402", "stage 1 uses device 3, but only 3 GPUs are visible (the launcher's visibility variable lists 3)",
         ["vllm-omni drops the entries outside CUDA_VISIBLE_DEVICES=4,5,6 and starts on the rest"])]


def test_the_stage_env_value_wins_over_the_launcher_and_launch_env():
    """vllm-omni applies a stage's own env before mapping its devices (stage_init_utils.py
    stage_runtime_setup): decode's env CUDA_VISIBLE_DEVICES=6,7 is its visible set."""
    text = pd_text().replace('      VLLM_NIXL_SIDE_CHANNEL_PORT: "5601"\n',
                             '      VLLM_NIXL_SIDE_CHANNEL_PORT: "5601"\n      CUDA_VISIBLE_DEVICES: "6,7"\n')
    plan = plan_of(text, launcher_env={"CUDA_VISIBLE_DEVICES": "4,5"}, env={"CUDA_VISIBLE_DEVICES": "2,3"})
    assert engines(plan) == {"prefill-0": (nixl(5600, "2"), "2", "0", "2,3"),
                             "decode-0": (nixl(5601, "7"), "7", "1", "6,7")}
    assert [n.split(":")[0] + ":" + n.split("(")[1].split(")")[0] for n in plan.notes[-2:]] == [
        "prefill-0:--env", "decode-0:the stage's env"]


def test_npu_maps_through_ascend_rt_visible_devices():
    text = ASCEND.read_text()
    plan = plan_document(parse_text(text, "pd.yaml"), "/cfg/pd.yaml",
                         LaunchOptions(model="/models/q", platform="npu",
                                       launcher_env={"ASCEND_RT_VISIBLE_DEVICES": "8,9,10,11,12,13,14,15",
                                                     "CUDA_VISIBLE_DEVICES": "0"})).plan
    pre, dec, _ = plan.processes
    assert dict(pre.env) == {"HCCL_IF_BASE_PORT": "61000", "ASCEND_RT_VISIBLE_DEVICES": "8,9,10,11"}
    assert dict(dec.env) == {"HCCL_IF_BASE_PORT": "61064", "ASCEND_RT_VISIBLE_DEVICES": "12,13"}
    assert (pre.device_env, pre.devices, pre.logical_devices, dec.devices, dec.logical_devices) == (
        "ASCEND_RT_VISIBLE_DEVICES", "8,9,10,11", "0,1,2,3", "12,13", "4,5")
    assert plan.notes[-1] == (
        'decode-0: devices "4,5" index ASCEND_RT_VISIBLE_DEVICES=8,9,10,11,12,13,14,15 (the launcher\'s '
        "environment): it starts with ASCEND_RT_VISIBLE_DEVICES=12,13 (logical->physical 4->12, 5->13) "
        f"({SRC})")


@pytest.mark.parametrize("platform,var", [("rocm", "HIP_VISIBLE_DEVICES"), ("xpu", "ZE_AFFINITY_MASK")])
def test_every_platform_variable_the_plan_writes_is_mapped(platform, var):
    plan = plan_of(pd_text(), platform=platform, launcher_env={var: "3,1"})
    assert [(p.name, p.env[var], p.devices) for p in plan.processes[:2]] == [("prefill-0", "3", "3"),
                                                                           ("decode-0", "1", "1")]


def test_cpu_sets_no_visibility_variable_whatever_the_launcher_has():
    """--platform cpu: no variable is written, and validate does not judge the stages'
    devices against a CUDA_VISIBLE_DEVICES the CPU engines never read (one visible GPU
    would make decode's "1" OPD402 on cuda)."""
    plan = plan_of(pd_text(), platform="cpu", launcher_env={"CUDA_VISIBLE_DEVICES": "0"})
    assert [(p.devices, p.device_env, "CUDA_VISIBLE_DEVICES" in p.env) for p in plan.processes[:2]] == [
        (None, None, False), (None, None, False)]


def test_launcher_visibility_keeps_the_visibility_variables_only():
    assert launcher_visibility({"CUDA_VISIBLE_DEVICES": "4,5", "HF_TOKEN": "t", "PATH": "/bin",
                                "ASCEND_RT_VISIBLE_DEVICES": "1"}) == {
        "CUDA_VISIBLE_DEVICES": "4,5", "ASCEND_RT_VISIBLE_DEVICES": "1"}
    # a blank variable is every device visible (logical == physical)
    m = map_devices("0,1", "CUDA_VISIBLE_DEVICES", None, {}, {"CUDA_VISIBLE_DEVICES": " "})
    assert (m.physical, m.visible) == ("0,1", None)
    assert map_devices("cpu", "CUDA_VISIBLE_DEVICES", None, {}, {"CUDA_VISIBLE_DEVICES": "4"}) is None


def test_dry_run_shows_the_physical_ids_text_and_json(tmp_path, capsys, monkeypatch):
    from omni_pd.cli import main

    cfg = tmp_path / "pd.yaml"
    cfg.write_text(pd_text())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    assert main(["launch", str(cfg), "--model", "m", "--dry-run", "--format", "json"]) in (0, None)
    got = json.loads(capsys.readouterr().out)
    assert [(p["name"], p["env"].get("CUDA_VISIBLE_DEVICES"), p["devices"], p["logical_devices"],
             p["visible_devices"]) for p in got["processes"]] == [
        ("prefill-0", "4", "4", "0", "4,5"), ("decode-0", "5", "5", "1", "4,5"), ("router", None, None, None, None)]
    assert sum("index CUDA_VISIBLE_DEVICES=4,5 (the launcher's environment)" in n for n in got["notes"]) == 2
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["launch", str(cfg), "--model", "m", "--dry-run"]) in (0, None)
    out = capsys.readouterr().out
    assert "CUDA_VISIBLE_DEVICES=5" in out and "(logical 1 of CUDA_VISIBLE_DEVICES=4,5)" in out
    assert ('note: decode-0: devices "1" index CUDA_VISIBLE_DEVICES=4,5 (the launcher\'s environment): it starts '
            "with CUDA_VISIBLE_DEVICES=5") in out


# --- preflight names the logical device and the physical one ---------------------------------------

def test_preflight_names_logical_and_physical_devices():
    plan = plan_of(pd_text(), launcher_env={"CUDA_VISIBLE_DEVICES": "4,5"})
    got = [(d.code, d.message) for d in pf.check_devices(plan, "cuda", inventory=[(0, 81920, 81920),
                                                                                   (4, 81920, 1024)])]
    assert got == [
        ("OPD963", "decode-0 is given logical device 1 (physical GPU 5 under CUDA_VISIBLE_DEVICES=4,5), this "
                   "machine has [0, 4]"),
        ("OPD964", "GPU 4 (prefill-0's logical device 0 of CUDA_VISIBLE_DEVICES=4,5): engines ask 72.0 GiB, "
                   "1.0 GiB of 80.0 GiB is free")]
    # without the variable: the messages as before (physical == logical)
    plain = plan_of(pd_text())
    assert [(d.code, d.message) for d in pf.check_devices(plain, "cuda", inventory=[(0, 81920, 81920)])] == [
        ("OPD963", "decode-0 is given GPU 1, this machine has [0]")]


def test_the_encoder_of_an_e_p_d_plan_is_mapped_too():
    """E -> P -> D on cuda: encoder-0's logical device 2 is physical 7 under
    CUDA_VISIBLE_DEVICES=5,6,7 (prefill 0 -> 5, decode 1 -> 6)."""
    path = ROOT / "golden" / "encoder" / "qwen3_omni_thinker_1e1p1d.yaml"
    plan = plan_document(parse_text(path.read_text(), path.name), "/cfg/epd.yaml",
                         LaunchOptions(model="m", vllm="/v/vllm", launcher_env={"CUDA_VISIBLE_DEVICES": "5,6,7"})).plan
    assert [(p.name, p.env.get("CUDA_VISIBLE_DEVICES"), p.logical_devices) for p in plan.processes
            if p.role != "router"] == [("prefill-0", "5", "0"), ("decode-0", "6", "1"), ("encoder-0", "7", "2")]
    assert plan.notes[-1] == (
        'encoder-0: devices "2" index CUDA_VISIBLE_DEVICES=5,6,7 (the launcher\'s environment): it starts with '
        f"CUDA_VISIBLE_DEVICES=7 (logical->physical 2->7) ({SRC})")
