"""ROCm maps a stage's logical devices as vLLM 0.30 and vllm-omni 0.30 read them there
(omni_pd/compile/devices.py ``DEVICE_VARS``): vLLM's ``RocmPlatform.device_control_env_var``
is ``CUDA_VISIBLE_DEVICES``; ``HIP_VISIBLE_DEVICES`` counts only when ``CUDA_VISIBLE_DEVICES``
is unset or empty (vllm/platforms/rocm.py ``_sync_hip_cuda_env_vars`` copies it over at
import), so ``CUDA_VISIBLE_DEVICES`` wins when both are set; each child gets both variables
set to its list, as vllm-omni's ``RocmOmniPlatform.set_device_control_env_var`` writes them.

Before: omni-pd read ``HIP_VISIBLE_DEVICES`` only. Under ``CUDA_VISIBLE_DEVICES=4,5`` (what a
scheduler sets on AMD nodes too) prefill got ``HIP_VISIBLE_DEVICES=0`` beside the inherited
``CUDA_VISIBLE_DEVICES=4,5``: physical GPU 0, outside the launcher's set, and a pair vLLM
refuses at import ("Inconsistent GPU visibility env vars"); validate did not see the four
visible GPUs either.
"""

from __future__ import annotations

import pytest

from omni_pd.check.validate import ValidateOptions, validate_document
from omni_pd.compile.devices import DEVICE_ENV, DEVICE_VARS, VISIBILITY_VARS, visible_value
from omni_pd.io import parse_text
from omni_pd.launch.plan import launcher_visibility

from test_launch_visible_devices import SRC, pd_text, plan_of, planned

CVD, HVD = "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"
ROCM = DEVICE_VARS["rocm"]


def test_the_table():
    assert ROCM == (CVD, HVD)
    assert DEVICE_ENV == {"cuda": CVD, "rocm": CVD, "npu": "ASCEND_RT_VISIBLE_DEVICES", "xpu": "ZE_AFFINITY_MASK",
                          "musa": "MUSA_VISIBLE_DEVICES", "cpu": None}
    assert VISIBILITY_VARS == (CVD, HVD, "ASCEND_RT_VISIBLE_DEVICES", "ZE_AFFINITY_MASK", "MUSA_VISIBLE_DEVICES")


@pytest.mark.parametrize("env,hit", [
    ({CVD: "4,5"}, (0, CVD, "4,5")),
    ({HVD: "4,5"}, (0, HVD, "4,5")),
    ({CVD: "6,7", HVD: "4,5"}, (0, CVD, "6,7")),      # both set: CUDA_VISIBLE_DEVICES decides
    ({CVD: "", HVD: "4,5"}, (0, HVD, "4,5")),         # an empty value counts as unset (vLLM: `or None`)
    ({CVD: " ", HVD: ""}, (0, CVD, " ")),             # both blank: every device visible
    ({"ROCR_VISIBLE_DEVICES": "1"}, None),            # read by neither vLLM nor vllm-omni
    ({}, None),
])
def test_which_variable_decides_on_rocm(env, hit):
    assert visible_value(ROCM, env) == hit


def test_a_higher_source_wins_whatever_variable_it_sets():
    """The stage's env, then --env, then the launcher's: HIP_VISIBLE_DEVICES in the stage's
    env beats CUDA_VISIBLE_DEVICES in the launcher's (vllm-omni applies the stage's env first)."""
    assert visible_value(ROCM, {HVD: "2,3"}, {}, {CVD: "4,5"}) == (0, HVD, "2,3")
    assert visible_value(ROCM, None, {CVD: "6"}, {HVD: "4,5"}) == (1, CVD, "6")
    assert visible_value(DEVICE_VARS["cuda"], {HVD: "2,3"}, {CVD: "4,5"}) == (1, CVD, "4,5")  # HIP means nothing on cuda


def _engines(plan):
    return [(p.name, dict(p.env), p.device_env, p.devices, p.logical_devices, p.visible_devices)
            for p in plan.processes if p.role != "router"]


def _nixl(port: int, dev: str) -> dict[str, str]:
    return {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(port), CVD: dev, HVD: dev}


def test_launch_maps_through_cuda_visible_devices_and_sets_both():
    plan = plan_of(pd_text(), platform="rocm", launcher_env={CVD: "4,5"})
    assert _engines(plan) == [("prefill-0", _nixl(5600, "4"), CVD, "4", "0", "4,5"),
                              ("decode-0", _nixl(5601, "5"), CVD, "5", "1", "4,5")]


def test_hip_visible_devices_alone_is_read_and_the_note_names_it():
    plan = plan_of(pd_text(), platform="rocm", launcher_env={HVD: "4,5"})
    assert _engines(plan) == [("prefill-0", _nixl(5600, "4"), CVD, "4", "0", "4,5"),
                              ("decode-0", _nixl(5601, "5"), CVD, "5", "1", "4,5")]
    assert plan.notes[-1] == ('decode-0: devices "1" index HIP_VISIBLE_DEVICES=4,5 (the launcher\'s environment): '
                              f"it starts with CUDA_VISIBLE_DEVICES=5 (logical->physical 1->5) ({SRC})")


def test_both_set_cuda_visible_devices_wins_and_the_child_gets_one_list():
    plan = plan_of(pd_text(), platform="rocm", launcher_env=launcher_visibility({CVD: "6,7", HVD: "4,5", "PATH": "/b"}))
    assert _engines(plan) == [("prefill-0", _nixl(5600, "6"), CVD, "6", "0", "6,7"),
                              ("decode-0", _nixl(5601, "7"), CVD, "7", "1", "6,7")]


def test_the_stage_env_hip_value_is_that_stages_visible_set():
    text = pd_text().replace('      VLLM_NIXL_SIDE_CHANNEL_PORT: "5601"\n',
                             '      VLLM_NIXL_SIDE_CHANNEL_PORT: "5601"\n      HIP_VISIBLE_DEVICES: "2,3"\n')
    plan = plan_of(text, platform="rocm", launcher_env={CVD: "4,5"})
    assert _engines(plan)[1] == ("decode-0", _nixl(5601, "3"), CVD, "3", "1", "2,3")


def test_validate_judges_rocm_devices_against_cuda_visible_devices():
    """One visible GPU under CUDA_VISIBLE_DEVICES: decode's logical 1 has no entry (OPD402),
    in validate --platform rocm as in launch."""
    got = planned(pd_text(), platform="rocm", launcher_env={CVD: "3"})
    assert got.plan is None
    assert [(d.code, d.message) for d in got.validation.diagnostics if d.code == "OPD402"] == [
        ("OPD402", "stage 1 uses device 1, but only 1 GPU is visible (the launcher's visibility variable lists 1)")]
    res = validate_document(parse_text(pd_text(), "pd.yaml"), ValidateOptions(platform="rocm", env={CVD: "3"}))
    assert [d.code for d in res.diagnostics if d.code == "OPD402"] == ["OPD402"]
