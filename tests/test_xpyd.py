"""xPyD (issue 15): `expand --prefill-replicas N --decode-replicas M` on single-LLM pipelines
and the launch plan of N prefill + M decode `vllm serve` instances behind one router.

Every instance must have its own devices, engine id, HTTP port and connector ports, and
`validate` must pass on what expand wrote; the plan must give each instance exactly what
the file says for it (the contract's ports on the `vllm` runtime: ``base + r*span``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from omni_pd.check.validate import validate_document
from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.diagnostics import OmniPdError, Severity
from omni_pd.io import load_file, parse_text
from omni_pd.launch.plan import LaunchOptions, plan_document

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"


def expand(opts: ExpandOptions, src: Path = LLM) -> str:
    return expand_document(parse_text(src.read_text(), src.name), opts, pipeline="llm").text


def plan(text: str, tmp_path: Path, **kw):
    f = tmp_path / "pd.yaml"
    f.write_text(text)
    planned = plan_document(load_file(f), str(f), LaunchOptions(model="m", vllm="/v/bin/vllm", **kw))
    assert planned.plan is not None, [d.message for d in planned.validation.diagnostics]
    return planned.plan


def stage(text: str, i: int) -> dict:
    from ruamel.yaml import YAML

    return YAML(typ="safe", pure=True).load(text)["stages"][i]


def test_expand_2p3d_nixl_gives_each_side_its_instances_devices_and_one_port_range():
    text = expand(ExpandOptions(connector="NixlConnector", kv_buffer_device="cpu",
                                prefill_replicas=2, decode_replicas=3))
    p, d = stage(text, 0), stage(text, 1)
    assert (p["num_replicas"], p["devices"], p["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == (2, "0,1", "5600")
    assert (d["num_replicas"], d["devices"], d["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"]) == (3, "2,3,4", "5602")
    assert p["kv_transfer_config"]["engine_id"] == "llm-prefill" and d["kv_transfer_config"]["engine_id"] == "llm-decode"
    res = validate_document(parse_text(text, "pd.yaml"))
    assert [x.code for x in res.diagnostics if x.severity is Severity.ERROR] == []


def test_plan_2p3d_nixl_exact_instances_and_router(tmp_path):
    text = expand(ExpandOptions(connector="NixlConnector", kv_buffer_device="cpu",
                                prefill_replicas=2, decode_replicas=3))
    lp = plan(text, tmp_path)
    engines = [p for p in lp.processes if p.role in ("prefill", "decode")]
    got = []
    for p in engines:
        kv = json.loads(p.argv[p.argv.index("--kv-transfer-config") + 1])
        got.append((p.name, p.argv[p.argv.index("--port") + 1], p.env["CUDA_VISIBLE_DEVICES"],
                    p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"], kv["engine_id"], [u.port for u in p.ports]))
    assert got == [
        ("prefill-0", "8100", "0", "5600", "llm-prefill-r0", [8100, 5600]),
        ("prefill-1", "8101", "1", "5601", "llm-prefill-r1", [8101, 5601]),
        ("decode-0", "8200", "2", "5602", "llm-decode-r0", [8200, 5602]),
        ("decode-1", "8201", "3", "5603", "llm-decode-r1", [8201, 5603]),
        ("decode-2", "8202", "4", "5604", "llm-decode-r2", [8202, 5604]),
    ]
    router = lp.process("router")
    argv = list(router.argv)
    del argv[argv.index("--workers"):argv.index("--workers") + 2]  # sized from the host's CPUs (router/sizing.py)
    assert tuple(argv[argv.index("--port") + 1:]) == (
        "8000", "--prefill", "http://127.0.0.1:8100", "--prefill", "http://127.0.0.1:8101",
        "--decode", "http://127.0.0.1:8200", "--decode", "http://127.0.0.1:8201", "--decode",
        "http://127.0.0.1:8202")
    assert router.depends_on == tuple(p.name for p in engines)
    assert router.modules == ("aiohttp", "omni_pd") and router.python == sys.executable  # preflight checks it


def test_plan_2p1d_mooncake_gives_the_router_each_prefill_bootstrap_port(tmp_path):
    text = expand(ExpandOptions(connector="MooncakeConnector", prefill_replicas=2, decode_replicas=1))
    assert stage(text, 0)["env"]["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == "25201" and "num_replicas" not in stage(text, 1)
    lp = plan(text, tmp_path)
    pre = [p for p in lp.processes if p.role == "prefill"]
    assert [(p.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"], [(u.port, u.purpose) for u in p.ports]) for p in pre] == [
        ("25201", [(8100, "http"), (25201, "Mooncake bootstrap instance 0")]),
        ("25202", [(8101, "http"), (25202, "Mooncake bootstrap instance 1")])]
    router = lp.process("router").argv
    assert [router[i + 1] for i, a in enumerate(router) if a == "--prefill"] == [
        "http://127.0.0.1:8100,25201", "http://127.0.0.1:8101,25202"]


def test_one_instance_per_side_is_unchanged(tmp_path):
    # no flags: the 1P1D file and plan of before (no num_replicas, no -r suffix)
    text = expand(ExpandOptions(connector="NixlConnector", kv_buffer_device="cpu"))
    assert "num_replicas" not in text
    lp = plan(text, tmp_path)
    assert [p.name for p in lp.processes] == ["prefill-0", "decode-0", "router"]
    kv = json.loads(lp.processes[0].argv[lp.processes[0].argv.index("--kv-transfer-config") + 1])
    assert kv["engine_id"] == "llm-prefill" and "VLLM_NIXL_SIDE_CHANNEL_PORT" in lp.processes[0].env


def test_wrong_device_count_for_the_instances_is_opd805():
    with pytest.raises(OmniPdError) as exc:
        expand(ExpandOptions(connector="NixlConnector", prefill_replicas=2, prefill_devices=(0,)))
    d = exc.value.diagnostic
    assert d.code == "OPD805" and d.message == (
        "--prefill-devices lists 1 device(s); 2 are needed (2 instance(s) x 1 device(s) each)")


def test_cli_expand_flags(tmp_path):
    out = tmp_path / "pd.yaml"
    r = subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q", str(LLM), "--pipeline", "llm",
                        "--connector", "NixlConnector", "--kv-buffer-device", "cpu", "--prefill-replicas", "2",
                        "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert stage(out.read_text(), 0)["num_replicas"] == 2
    r = subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", str(LLM), "--pipeline", "llm",
                        "--decode-replicas", "0"], capture_output=True, text=True)
    assert r.returncode == 2 and "--decode-replicas" in r.stderr


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 4), m=st.integers(1, 4), tp=st.sampled_from([1, 2]),
       connector=st.sampled_from(["NixlConnector", "MooncakeConnector"]))
def test_xpyd_instances_never_share_a_port_device_or_engine_id(tmp_path_factory, n, m, tp, connector):
    text = expand(ExpandOptions(connector=connector, tp=tp, prefill_replicas=n, decode_replicas=m,
                                kv_buffer_device="cpu" if connector == "NixlConnector" else None))
    res = validate_document(parse_text(text, "pd.yaml"))
    assert [x.code for x in res.diagnostics if x.severity is Severity.ERROR] == []
    lp = plan(text, tmp_path_factory.mktemp("p"))
    engines = [p for p in lp.processes if p.role in ("prefill", "decode")]
    assert [p.role for p in engines] == ["prefill"] * n + ["decode"] * m
    ports = [u.port for p in lp.processes for u in p.ports if p.role != "router"]
    assert len(ports) == len(set(ports))
    devs = [x for p in engines for x in p.env["CUDA_VISIBLE_DEVICES"].split(",")]
    assert len(devs) == len(set(devs)) == (n + m) * tp
    ids = [json.loads(p.argv[p.argv.index("--kv-transfer-config") + 1])["engine_id"] for p in engines]
    assert len(set(ids)) == n + m


# --- per-side TP (issue 15): --prefill-tp / --decode-tp ---------------------------------

GOLDEN = ROOT / "tests" / "golden" / "xpyd"
PER_SIDE = ["expand", "-q", str(LLM), "--pipeline", "llm", "--connector", "NixlConnector", "--kv-buffer-device", "cpu",
            "--prefill-replicas", "2", "--prefill-tp", "1", "--decode-tp", "2"]


def cli(args: list[str], capsys) -> tuple[int, str, str]:
    from omni_pd.cli import main

    try:
        rc = main(args)
    except SystemExit as e:
        rc = int(e.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_golden_2p1d_prefill_tp1_decode_tp2_nixl(capsys):
    rc, out, err = cli(PER_SIDE, capsys)
    assert rc == 0, err
    assert out == (GOLDEN / "llm_2p1d_nixl_prefill_tp1_decode_tp2.yaml").read_text(encoding="utf-8")
    p, d = stage(out, 0), stage(out, 1)
    assert (p["tensor_parallel_size"], p["num_replicas"], p["devices"]) == (1, 2, "0,1")
    assert (d["tensor_parallel_size"], "num_replicas" in d, d["devices"]) == (2, False, "2,3")
    res = validate_document(parse_text(out, "pd.yaml"))
    assert [x.code for x in res.diagnostics if x.severity is not Severity.INFO] == []


def test_plan_of_per_side_tp_gives_each_instance_its_sides_tp_and_devices(tmp_path, capsys):
    rc, out, err = cli(PER_SIDE, capsys)
    assert rc == 0, err
    lp = plan(out, tmp_path)
    got = []
    for p in (x for x in lp.processes if x.role in ("prefill", "decode")):
        kv = json.loads(p.argv[p.argv.index("--kv-transfer-config") + 1])
        got.append((p.name, p.argv[p.argv.index("--tensor-parallel-size") + 1], p.env["CUDA_VISIBLE_DEVICES"],
                    p.env["VLLM_NIXL_SIDE_CHANNEL_PORT"], kv["engine_id"], [u.port for u in p.ports]))
    assert got == [
        ("prefill-0", "1", "0", "5600", "llm-prefill-r0", [8100, 5600]),
        ("prefill-1", "1", "1", "5601", "llm-prefill-r1", [8101, 5601]),
        ("decode-0", "2", "2,3", "5602", "llm-decode", [8200, 5602]),
    ]


def test_vllm_0_11_nixl_side_channel_spans_follow_each_sides_tp():
    # vLLM 0.11 binds one NIXL side-channel port per TP worker: prefill TP 1 x 1 instance takes
    # 5557; decode TP 2 x 2 instances need 4 ports (instance r at base + r*2): 5558-5561 would
    # hold 5560, which the input already uses, so decode takes 5561-5564 (sized from prefill's
    # TP it would fit at 5558 and bind 5560 twice)
    text = "connectors:\n  shm: {name: SharedMemoryConnector, extra: {zmq_port: 5560}}\n" + LLM.read_text()
    text = expand_document(parse_text(text, LLM.name), ExpandOptions(
        connector="NixlConnector", decode_replicas=2, prefill_tp=1, decode_tp=2), pipeline="llm",
        vllm_version="0.11").text
    p, d = stage(text, 0), stage(text, 1)
    assert (p["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"], p["devices"]) == ("5557", "0")
    assert (d["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"], d["devices"], d["num_replicas"]) == ("5561", "1,2,3,4", 2)
    from omni_pd.check.validate import ValidateOptions

    res = validate_document(parse_text(text, "pd.yaml"), ValidateOptions(vllm_version="0.11"))
    assert [x.code for x in res.diagnostics if x.severity is Severity.ERROR] == []


@pytest.mark.parametrize("args,code,msg,help", [
    (["--connector", "MooncakeConnector", "--vllm-version", "0.18", "--prefill-tp", "2", "--decode-tp", "1"],
     "OPD603", "--prefill-tp 2 --decode-tp 1: MooncakeConnector on vLLM 0.18 needs equal TP on prefill and decode",
     "pick TPs the connector pairs (`omni-pd explain OPD603`), another --connector or another --vllm-version"),
    (["--connector", "NixlConnector", "--vllm-version", "0.13", "--prefill-tp", "2", "--decode-tp", "1"],
     "OPD603", "--prefill-tp 2 --decode-tp 1: NixlConnector on vLLM 0.13 allows decode TP >= prefill TP only, "
     "as a multiple (got P=2, D=1)",
     "pick TPs the connector pairs (`omni-pd explain OPD603`), another --connector or another --vllm-version"),
    (["--connector", "NixlConnector", "--prefill-tp", "2", "--decode-tp", "3"],
     "OPD603", "--prefill-tp 2 --decode-tp 3: NixlConnector needs one TP size to divide the other (got 2 and 3)",
     "pick TPs the connector pairs (`omni-pd explain OPD603`), another --connector or another --vllm-version"),
    (["--tp", "2", "--decode-tp", "1"], "OPD006", "--decode-tp 1 contradicts --tp 2 (--tp sets both prefill and decode)",
     "drop --tp and give --prefill-tp and --decode-tp, or give --decode-tp 2"),
    (["--platform", "npu", "--decode-tp", "1", "--npu-decode-tp", "2"], "OPD006",
     "--npu-decode-tp 2 contradicts --decode-tp 1: with --platform npu both set the decode stage's "
     "tensor_parallel_size", "give one of them"),
    (["--platform", "npu", "--prefill-tp", "1", "--decode-tp", "2"], "OPD603",
     "--prefill-tp 1 --decode-tp 2: vllm-ascend MooncakeConnectorV1 needs prefill TP >= decode TP and divisible "
     "by it (got P=1, D=2)",
     "pick TPs the connector pairs (`omni-pd explain OPD603`), another --connector or another --vllm-version"),
])
def test_refused_tp_combinations_exit_2_with_exact_diagnostics(args, code, msg, help, capsys):
    rc, out, err = cli(["expand", str(LLM), "--pipeline", "llm", *args], capsys)
    assert (rc, out) == (2, "")
    assert err == f"error[{code}]: {msg}\n  = help: {help}\n"


def test_vllm_omni_pipeline_refuses_unequal_tp_at_the_file_connector(tmp_path, capsys):
    # Qwen3-Omni PD runs on vllm-omni, whose PD validator wants equal TP whatever the connector;
    # the connector named in the file locates the refusal
    src = tmp_path / "omni.yaml"
    src.write_text((ROOT / "presets" / "qwen3_omni_moe.yaml").read_text().replace(
        "  - stage_id: 0   # thinker\n", "  - stage_id: 0\n    kv_transfer_config: {kv_connector: NixlConnector}\n", 1))
    rc, out, err = cli(["expand", str(src), "--pipeline", "qwen3_omni_moe", "--decode-tp", "4"], capsys)
    assert (rc, out) == (2, "")
    first = err.splitlines()[:2]
    assert first == ["error[OPD306]: --decode-tp 4: tensor_parallel_size differs: prefill 1, decode 4; "
                     "vllm-omni's PD validator requires them equal (vllm_omni/entrypoints/pd_utils.py)",
                     f"  --> {src}:18:40"]  # the file's kv_connector value
    rc, out, err = cli(["expand", "-q", str(src), "--pipeline", "qwen3_omni_moe", "--prefill-tp", "4", "--decode-tp", "4"],
                       capsys)
    assert rc == 0, err  # equal per-side TPs are --tp


def test_npu_decode_tp_and_decode_tp_are_one_setting_with_platform_npu(capsys):
    # --platform npu: --npu-decode-tp is decode's TP through the same code path as --decode-tp
    a = cli(["expand", "-q", str(LLM), "--pipeline", "llm", "--platform", "npu", "--tp", "2", "--npu-decode-tp", "1"],
            capsys)
    b = cli(["expand", "-q", str(LLM), "--pipeline", "llm", "--platform", "npu", "--prefill-tp", "2",
             "--decode-tp", "1"], capsys)
    assert a[0] == b[0] == 0 and a[1] == b[1]
    assert (stage(a[1], 1)["tensor_parallel_size"], stage(a[1], 1)["devices"]) == (1, "2")


def test_validate_checks_the_pair_and_each_instances_devices():
    text = (GOLDEN / "llm_2p1d_nixl_prefill_tp1_decode_tp2.yaml").read_text()
    # vLLM 0.13 NIXL: decode TP 2 is a multiple of prefill TP 1: allowed; the reverse is not
    assert [x.code for x in validate_document(parse_text(text, "pd.yaml")).diagnostics
            if x.severity is Severity.ERROR] == []
    swapped = text.replace("tensor_parallel_size: 1\n", "tensor_parallel_size: X\n").replace(
        "tensor_parallel_size: 2\n", "tensor_parallel_size: 1\n").replace("tensor_parallel_size: X\n",
                                                                           "tensor_parallel_size: 2\n")
    swapped = swapped.replace('devices: "0,1"', 'devices: "0,1,4,5"').replace('devices: "2,3"', 'devices: "2"')
    from omni_pd.check.validate import ValidateOptions

    res = validate_document(parse_text(swapped, "pd.yaml"), ValidateOptions(vllm_version="0.13"))
    errs = [(x.code, x.message) for x in res.diagnostics if x.severity is Severity.ERROR]
    assert errs == [("OPD603", "NixlConnector on vLLM 0.13 allows decode TP >= prefill TP only, as a multiple "
                               "(got P=2, D=1)")]
    # one instance short of its side's TP: OPD401 per stage (devices = TP x PP x DP x num_replicas)
    short = text.replace('devices: "2,3"', 'devices: "2"')
    res = validate_document(parse_text(short, "pd.yaml"))
    assert [(x.code, x.message) for x in res.diagnostics if x.severity is Severity.ERROR] == [
        ("OPD401", "stage 1: tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 1 = 2 devices, "
                   "but devices has 1 entry")]


def test_a_platform_overlay_that_places_the_llm_gives_each_side_its_tp(capsys):
    # the rocm overlay places the LLM on device 4 (its TP from the base): each side keeps its
    # own TP there, so decode (TP 2) takes 2 devices per instance after prefill's, the pool of
    # its 2 instances (vllm-omni's split_devices_for_replicas would shift a 2-device template
    # "5,6" by 2 per replica and refuse it); before, decode got prefill's count and expand
    # failed its own check (exit 3)
    from ruamel.yaml import YAML

    from omni_pd.check.validate import ValidateOptions

    src = LLM.read_text() + 'platforms:\n  rocm:\n    stages:\n      - {stage_id: 0, devices: "4"}\n'
    text = expand_document(parse_text(src, "llm.yaml"), ExpandOptions(
        connector="NixlConnector", decode_replicas=2, prefill_tp=1, decode_tp=2), pipeline="llm").text
    rocm = YAML(typ="safe", pure=True).load(text)["platforms"]["rocm"]["stages"]
    assert rocm == [{"stage_id": 0, "devices": "4"}, {"stage_id": 1, "devices": "5,6,7,8"}]
    res = validate_document(parse_text(text, "pd.yaml"), ValidateOptions(all_platforms=True))
    assert [x.code for x in res.diagnostics if x.severity is Severity.ERROR] == []
    # an overlay that sets the LLM's TP gives it to both halves (the entry is copied to both)
    src = LLM.read_text() + ('platforms:\n  rocm:\n    stages:\n'
                             '      - {stage_id: 0, devices: "4,5", tensor_parallel_size: 2}\n')
    text = expand_document(parse_text(src, "llm.yaml"), ExpandOptions(
        connector="NixlConnector", prefill_tp=1, decode_tp=2), pipeline="llm").text
    rocm = YAML(typ="safe", pure=True).load(text)["platforms"]["rocm"]["stages"]
    assert [(s["stage_id"], s["devices"], s["tensor_parallel_size"]) for s in rocm] == [(0, "4,5", 2), (1, "6,7", 2)]
