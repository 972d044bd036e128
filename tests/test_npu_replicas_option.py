"""``expand --platform npu --prefill-replicas 2`` is refused (OPD805) with a help that names
the option the replicas came from, as the CUDA path does (pd_split.check_replicas_apart).

Found walking the README as a new user: the npu path (passes/ascend.py) always said
"set num_replicas: 1 on the Thinker", which the file did not set.
"""

from __future__ import annotations

import pytest

from tests.test_cli import ROOT, run_cli

PRESET = str(ROOT / "presets" / "qwen3_omni_moe.yaml")


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_npu_replicas_from_the_option_name_the_option(tmp_path, capsys, side):
    rc, out, err = run_cli(["expand", PRESET, "--platform", "npu", f"--{side}-replicas", "2", "-q"],
                           capsys, cwd=tmp_path)
    assert (rc, out) == (2, "")
    port = 36000 if side == "prefill" else 36002  # after prefill's range (36000-36001)
    assert err == (f"error[OPD805]: npu: cannot place 2 replicas of the {side} stage on one host: vllm-omni 0.30 "
                   f"gives every replica the same kv_port + rank (MooncakeConnectorV1) port ({port})\n"
                   f"  = help: give --{side}-replicas 1 (one engine per side), or serve the replicas "
                   "from different hosts\n")


def test_npu_replicas_from_the_file_still_say_num_replicas(tmp_path, capsys):
    text = (ROOT / "presets" / "qwen3_omni_moe.yaml").read_text()
    assert "  - stage_id: 0   # thinker\n" in text
    (tmp_path / "qwen3_omni_moe.yaml").write_text(
        text.replace("  - stage_id: 0   # thinker\n", "  - stage_id: 0   # thinker\n    num_replicas: 2\n", 1))
    rc, _, err = run_cli(["expand", "qwen3_omni_moe.yaml", "--platform", "npu", "-q"], capsys, cwd=tmp_path)
    assert rc == 2
    assert err.startswith("error[OPD805]: npu: cannot place 2 replicas of the prefill stage on one host")
    assert "  = help: set num_replicas: 1 on the Thinker (one engine per side)" in err
