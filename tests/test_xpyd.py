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

    return YAML(typ="safe").load(text)["stages"][i]


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
    assert router.argv[router.argv.index("--port") + 1:] == (
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
