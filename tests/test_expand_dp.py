"""expand's data-parallel options (issue 26): ``--dp`` (both sides), ``--prefill-dp``,
``--decode-dp``. Each instance of a side is one engine of DP ranks: ``data_parallel_size: N``
on its stage and TP x PP x N devices (vLLM 0.30 ``Worker.init_device``; vllm-omni 0.30
``get_stage_devices_per_replica``), its connector range sized from its DP, and on the
plain-vLLM runtime its own ``--data-parallel-rpc-port``."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from omni_pd.check.validate import ValidateOptions, validate_document
from omni_pd.cli import main
from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions, side_dps
from omni_pd.diagnostics import OmniPdError
from omni_pd.io import load_file, parse_text

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"
FULL = GOLDEN / "qwen3_omni_moe_pd_decode_dp2.yaml"
THINKER_ONLY = GOLDEN / "qwen3_omni_moe_thinker_only_pd_decode_dp2.yaml"
MODEL = "Qwen/Qwen3-Omni-30B-A3B-Instruct"


def cli(args: list[str], capsys) -> tuple[int, str, str]:
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


def stages(text: str) -> dict[int, dict]:
    return {s["stage_id"]: s for s in parse_text(text, "pd.yaml").tree["stages"]}


def overlay(text: str, platform: str) -> dict[int, dict]:
    return {s["stage_id"]: s for s in parse_text(text, "pd.yaml").tree["platforms"][platform]["stages"]}


def clean(text: str) -> list[str]:
    """Validate's errors and warnings on every platform (``validate --all-platforms``)."""
    res = validate_document(parse_text(text, "pd.yaml"), ValidateOptions(all_platforms=True))
    return [f"{d.code}: {d.message}" for d in res.diagnostics if d.severity.value != "info"]


# --- golden ------------------------------------------------------------------------------

def test_golden_decode_dp2_on_the_bundled_preset(capsys):
    rc, out, err = cli(["expand", "-q", "--decode-dp", "2"], capsys)
    assert rc == 0, err
    assert out == FULL.read_text(encoding="utf-8")
    s = stages(out)
    # decode: one engine of 2 DP ranks on 2 devices; the Talker and Code2Wav move past it
    assert [(sid, st.get("data_parallel_size"), st["devices"]) for sid, st in s.items()] == [
        (0, None, "0"), (1, 2, "1,2"), (2, None, "3"), (3, None, "3")]
    # the overlays inherit decode's DP: npu runs its TP 2 x DP 2 (and tells vllm-ascend so), xpu TP 4 x DP 2
    npu, xpu = overlay(out, "npu"), overlay(out, "xpu")
    assert npu[1]["devices"] == "2,3,4,5" and xpu[1]["devices"] == "4,5,6,7,8,9,10,11"
    blocks = npu[0]["kv_transfer_config"]["kv_connector_extra_config"]
    assert (dict(blocks["prefill"]), dict(blocks["decode"])) == ({"dp_size": 1, "tp_size": 2},
                                                                {"dp_size": 2, "tp_size": 2})
    assert clean(out) == []


def test_golden_decode_dp2_thinker_only(capsys):
    rc, out, err = cli(["expand", "-q", "--pipeline", "qwen3_omni_moe_thinker_only", "--decode-dp", "2"], capsys)
    assert rc == 0, err
    assert out == THINKER_ONLY.read_text(encoding="utf-8")
    s = stages(out)
    assert [(sid, st.get("data_parallel_size"), st["devices"]) for sid, st in s.items()] == [
        (0, None, "0"), (1, 2, "1,2")]
    assert clean(out) == []


def test_dry_run_plan_of_the_thinker_only_dp_config_gives_decode_its_dp_rpc_port(capsys):
    rc, out, err = cli(["launch", str(THINKER_ONLY), "--model", MODEL, "--dry-run", "--format", "json"], capsys)
    assert rc == 0, err
    procs = json.loads(out)["processes"]
    got = [(p["name"], p["env"].get("CUDA_VISIBLE_DEVICES"), [(u["port"], u["purpose"]) for u in p["ports"]])
           for p in procs]
    assert got == [
        ("prefill-0", "0", [(8100, "http"), (25201, "Mooncake bootstrap")]),
        ("decode-0", "1,2", [(8200, "http"), (8500, "data-parallel RPC (--data-parallel-rpc-port)")]),
        ("router", None, [(8000, "http")]),
    ]
    argv = {p["name"]: p["argv"] for p in procs}
    assert "--data-parallel-size" not in argv["prefill-0"]
    d = argv["decode-0"]
    assert d[d.index("--data-parallel-size") + 1] == "2" and d[d.index("--data-parallel-rpc-port") + 1] == "8500"


# --- the options ---------------------------------------------------------------------------

def test_dp_sets_both_sides_and_a_side_option_may_repeat_it():
    assert side_dps(ExpandOptions(dp=2)) == (2, 2)
    assert side_dps(ExpandOptions(dp=2, decode_dp=2)) == (2, 2)
    assert side_dps(ExpandOptions(prefill_dp=3)) == (3, None)
    with pytest.raises(OmniPdError) as e:
        side_dps(ExpandOptions(dp=2, prefill_dp=1))
    d = e.value.diagnostic
    assert (e.value.exit_code, d.code, d.message, d.help) == (
        2, "OPD006", "--prefill-dp 1 contradicts --dp 2 (--dp sets both prefill and decode)",
        "drop --dp and give --prefill-dp and --decode-dp, or give --prefill-dp 2")


def test_xpyd_with_dp_gives_every_instance_tp_x_dp_devices_and_a_side_channel_port_per_dp_rank(tmp_path, capsys):
    # vLLM 0.30 NIXL: one side-channel port per DP rank of an engine (base + dp index), per instance
    out = tmp_path / "pd.yaml"
    rc, _, err = cli(["expand", "-q", str(LLM), "--connector", "NixlConnector", "--kv-buffer-device", "cpu",
                      "--prefill-replicas", "2", "--prefill-dp", "2", "--decode-dp", "2", "-o", str(out)], capsys)
    assert rc == 0, err
    s = stages(out.read_text())
    assert [(st["num_replicas"] if "num_replicas" in st else 1, st["data_parallel_size"], st["devices"],
             st["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for st in s.values()] == [
        (2, 2, "0,1,2,3", "5600"), (1, 2, "4,5", "5604")]
    rc, plan, err = cli(["launch", str(out), "--model", "m", "--dry-run", "--format", "json"], capsys)
    assert rc == 0, err
    got = [(p["name"], p["env"].get("CUDA_VISIBLE_DEVICES"), [u["port"] for u in p["ports"]])
           for p in json.loads(plan)["processes"] if p["role"] != "router"]
    assert got == [("prefill-0", "0,1", [8100, 5600, 5601, 8400]), ("prefill-1", "2,3", [8101, 5602, 5603, 8401]),
                   ("decode-0", "4,5", [8200, 5604, 5605, 8500])]


def test_vllm_0_11_nixl_ranges_are_sized_from_each_sides_dp():
    # 0.11 binds one side-channel port per TP x DP rank: prefill 2 instances x DP 2 = 5557-5560, decode after
    res = expand_document(load_file(LLM), ExpandOptions(connector="NixlConnector", prefill_replicas=2, prefill_dp=2,
                                                        decode_dp=3), vllm_version="0.11", pipeline="llm")
    s = stages(res.text)
    assert [(st["devices"], st["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for st in s.values()] == [
        ("0,1,2,3", "5557"), ("4,5,6", "5561")]
    assert clean(res.text) == []


def test_dp_in_engine_args_is_rewritten_there():
    """A Thinker that carries its parallel sizes under ``engine_args`` gets each side's DP there."""
    text = LLM.read_text().replace("stage_id: 0\n", "stage_id: 0\n    engine_args: {data_parallel_size: 1}\n", 1)
    res = expand_document(parse_text(text, "llm.yaml"), ExpandOptions(decode_dp=2), pipeline="llm")
    s = stages(res.text)
    assert (s[0]["engine_args"]["data_parallel_size"], s[1]["engine_args"]["data_parallel_size"]) == (1, 2)
    assert "data_parallel_size" not in s[1] and s[1]["devices"] == "1,2"


ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")


@pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")
def test_vllm_omni_0_30_reads_decode_dp_and_its_devices_per_replica():
    """The golden through vllm-omni 0.30.0's serve-path resolver: decode's engine runs DP 2
    and one replica takes its 2 devices (tests/oracle/dp_probe.py)."""
    proc = subprocess.run([str(ORACLE), str(ROOT / "tests" / "oracle" / "dp_probe.py"), str(FULL)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("DP-PROBE ")), None)
    assert line, proc.stderr[-2000:]
    assert json.loads(line.split(" ", 1)[1]) == [
        {"stage": 0, "tp": 1, "dp": 1, "per_replica": 1, "devices": "0", "replicas": 1},
        {"stage": 1, "tp": 1, "dp": 2, "per_replica": 2, "devices": "1,2", "replicas": 1},
        {"stage": 2, "tp": 1, "dp": 1, "per_replica": 1, "devices": "3", "replicas": 1},
        {"stage": 3, "tp": 1, "dp": 1, "per_replica": 1, "devices": "3", "replicas": 1},
    ]
