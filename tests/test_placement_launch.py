"""Per-host plans (issue 25 step 2): ``launch --inventory FILE --host NAME``.

The two-host NIXL 1P1D golden (tests/golden/placement_llm_nixl_two_hosts.yaml): host A
runs prefill alone; host B runs decode and the router (decode's host, as llm-d runs the
routing sidecar in the decode pod), the router health-gated on prefill over A's address.
Every listener binds its own host's address; ``--dry-run`` without ``--host`` prints every
host. The supervisor gates on a peer without starting it, and fails when it never answers.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from omni_pd.check.context import Inventory
from omni_pd.cli import main
from omni_pd.io import load_file
from omni_pd.launch.plan import LaunchOptions, for_host, hosts_of, plan_document, without_peers
from omni_pd.launch.spec import HealthCheck, LaunchPlan, ProcessSpec
from omni_pd.launch.supervisor import Supervisor

ROOT = Path(__file__).resolve().parents[1]
PD = ROOT / "tests" / "golden" / "placement_llm_nixl_two_hosts.yaml"
HOSTS = {"hosts": {"A": {"address": "10.201.0.1", "count": 1}, "B": {"address": "10.201.0.2", "count": 1}},
         "placement": {0: "A", 1: "B"}}
HOSTS_YAML = "hosts:\n  A: {address: 10.201.0.1, count: 1}\n  B: {address: 10.201.0.2, count: 1}\nplacement: {0: A, 1: B}\n"


def _plan(**kw) -> LaunchPlan:
    opts = LaunchOptions(**{"model": "/m", "platform": "cpu", "port": 18000, "engine_port_base": 18100, **kw})
    planned = plan_document(load_file(PD), str(PD), opts, inventory=Inventory.from_dict(HOSTS))
    assert planned.plan is not None, [d.message for d in planned.validation.diagnostics]
    return planned.plan


def test_every_process_binds_its_own_hosts_address_and_the_router_is_on_decodes_host():
    plan = _plan()
    assert hosts_of(plan) == ("A", "B")
    got = {p.name: (p.host, {u.host for u in p.ports}, p.health.url) for p in plan.processes}
    assert got == {
        "prefill-0": ("A", {"10.201.0.1"}, "http://10.201.0.1:18100/health"),
        "decode-0": ("B", {"10.201.0.2"}, "http://10.201.0.2:18200/health"),
        "router": ("B", {"10.201.0.2"}, "http://10.201.0.2:18000/health"),
    }
    router = plan.process("router").argv
    assert router[router.index("--prefill") + 1] == "http://10.201.0.1:18100"
    assert router[router.index("--decode") + 1] == "http://10.201.0.2:18200"
    assert plan.entrypoint == "http://10.201.0.2:18000"
    prefill = plan.process("prefill-0").argv
    assert prefill[prefill.index("--host") + 1] == "10.201.0.1"
    # each side's side channel: its own address and port (the same port on both hosts)
    assert [(plan.process(n).env["VLLM_NIXL_SIDE_CHANNEL_HOST"], plan.process(n).env["VLLM_NIXL_SIDE_CHANNEL_PORT"])
            for n in ("prefill-0", "decode-0")] == [("10.201.0.1", "18500"), ("10.201.0.2", "18500")]


def test_for_host_keeps_that_hosts_processes_and_peers_for_remote_dependencies():
    plan = _plan()
    a, b = for_host(plan, "A"), for_host(plan, "B")
    assert [(p.name, p.role) for p in a.processes] == [("prefill-0", "prefill")]
    assert [(p.name, p.role) for p in b.processes] == [("prefill-0", "peer"), ("decode-0", "decode"),
                                                        ("router", "router")]
    peer = b.process("prefill-0")
    assert (peer.argv, peer.ports, peer.env, peer.host) == ((), (), {}, "A")
    assert peer.health == plan.process("prefill-0").health
    assert [p.name for p in without_peers(b).processes] == ["decode-0", "router"]
    with pytest.raises(KeyError):
        for_host(plan, "C")


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_dry_run_prints_every_host_and_one_with_host(tmp_path, capsys):
    inv = tmp_path / "hosts.yaml"
    inv.write_text(HOSTS_YAML)
    rc, out, err = _cli(capsys, "launch", PD, "--model", "/m", "--platform", "cpu", "--inventory", inv, "--dry-run",
                        "--format", "json")
    assert rc == 0, err
    hosts = json.loads(out)["hosts"]
    assert {h: [p["name"] for p in v["processes"]] for h, v in hosts.items()} == {
        "A": ["prefill-0"], "B": ["prefill-0", "decode-0", "router"]}
    rc, out, err = _cli(capsys, "launch", PD, "--model", "/m", "--platform", "cpu", "--inventory", inv, "--dry-run",
                        "--format", "json", "--host", "10.201.0.2")  # a host's address names it too
    assert rc == 0, err
    assert [(p["name"], p["role"]) for p in json.loads(out)["processes"]] == [
        ("prefill-0", "peer"), ("decode-0", "decode"), ("router", "router")]


@pytest.mark.parametrize("args, message", [
    ((), "error[OPD006]: launch --inventory starts one host's processes: --host names which"),
    (("--host", "C"), "error[OPD006]: --host C: the inventory has no such host (name or address)"),
    (("--host", "A", "--smoke"), "error[OPD006]: --smoke on A: the entrypoint runs on B"),
])
def test_launch_with_inventory_needs_a_host_of_it(tmp_path, capsys, args, message):
    inv = tmp_path / "hosts.yaml"
    inv.write_text(HOSTS_YAML)
    rc, out, err = _cli(capsys, "launch", PD, "--model", "/m", "--platform", "cpu", "--inventory", inv, *args)
    assert rc == 2
    assert err.splitlines()[0] == message  # stdout: validate's findings (OPD703 for --smoke on A)


def test_launch_refuses_a_localhost_side_channel_across_hosts_before_starting(tmp_path, capsys):
    inv = tmp_path / "hosts.yaml"
    inv.write_text(HOSTS_YAML)
    bad = tmp_path / "pd.yaml"
    bad.write_text(PD.read_text().replace('VLLM_NIXL_SIDE_CHANNEL_HOST: "10.201.0.1"',
                                          'VLLM_NIXL_SIDE_CHANNEL_HOST: "localhost"'))
    rc, out, _ = _cli(capsys, "launch", bad, "--model", "/m", "--platform", "cpu", "--inventory", inv,
                      "--host", "A", "--run-dir", tmp_path / "run")
    assert rc == 1
    assert "error[OPD503]: stage 0 (prefill) on A advertises 'localhost' as its NIXL side channel" in out
    assert out.rstrip().endswith(f"{bad}: not launched (1 error, 0 warnings, 1 info)")  # as validate counts
    assert not (tmp_path / "run").exists()


# --- the supervisor and a peer ---------------------------------------------------------

CHILD = str(ROOT / "tests" / "launch_helpers" / "child.py")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peer_plan(peer_port: int, own_port: int, timeout_s: float = 10.0) -> LaunchPlan:
    hc = HealthCheck(f"http://127.0.0.1:{peer_port}/health", timeout_s=timeout_s, interval_s=0.02, max_interval_s=0.1)
    peer = ProcessSpec(name="prefill-0", argv=(), role="peer", health=hc, host="A")
    own = ProcessSpec(name="router", argv=(sys.executable, CHILD, "--port", str(own_port)), role="router",
                      health=HealthCheck(f"http://127.0.0.1:{own_port}/health", timeout_s=10, interval_s=0.02,
                                         max_interval_s=0.1), depends_on=("prefill-0",), host="B")
    return LaunchPlan(runtime="vllm", model="t", connector="none", entrypoint="", config="", processes=(peer, own))


def test_supervisor_waits_for_a_peer_it_does_not_start(tmp_path):
    import subprocess

    pp, op = _free_port(), _free_port()
    remote = subprocess.Popen([sys.executable, CHILD, "--port", str(pp), "--healthy-after", "0.3"])
    try:
        out = io.StringIO()
        with Supervisor(_peer_plan(pp, op), tmp_path, out=out, live=False, grace_s=2) as sup:
            assert sup.start_and_wait_healthy()
            assert list(sup.pids()) == ["router"]  # the peer is never started here
            t = sup.timings
        assert t.started_s["router"] >= t.started_s["prefill-0"] + t.ready_s["prefill-0"]
        text = out.getvalue()
        assert f"waiting for prefill-0 on A (GET http://127.0.0.1:{pp}/health)" in text
        assert text.index("prefill-0 healthy") < text.index("started router")
        assert remote.poll() is None  # teardown left the remote process alone
    finally:
        remote.kill()
        remote.wait()


def test_a_peer_that_never_answers_fails_the_launch_and_nothing_starts(tmp_path):
    pp, op = _free_port(), _free_port()
    out = io.StringIO()
    with Supervisor(_peer_plan(pp, op, timeout_s=0.5), tmp_path, out=out, live=False, grace_s=2) as sup:
        assert not sup.start_and_wait_healthy()
        assert sup.pids() == {}
    assert sup.failure is not None and sup.failure.process == "prefill-0"
    assert f"prefill-0 did not become healthy within 0.5 s: GET http://127.0.0.1:{pp}/health" in out.getvalue()


# --- property: every placement expand accepts plans listeners on their own host only -----

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import example_budget  # noqa: E402


@settings(max_examples=example_budget(8))
@given(n_hosts=st.integers(1, 3), where=st.lists(st.integers(0, 2), min_size=2, max_size=2),
       connector=st.sampled_from(["NixlConnector", "MooncakeConnector"]))
def test_every_accepted_placement_advertises_only_each_hosts_own_address(n_hosts, where, connector):
    from omni_pd.compile.expand import expand_document
    from omni_pd.compile.passes.pd_split import ExpandOptions
    from omni_pd.io import parse_text

    names = [f"h{i}" for i in range(n_hosts)]
    raw = {"hosts": {n: {"address": f"10.9.0.{i + 1}", "count": 1} for i, n in enumerate(names)},
           "placement": {0: names[where[0] % n_hosts], 1: names[where[1] % n_hosts]}}
    inv = Inventory.from_dict(raw)
    src = ROOT / "tests" / "fixtures" / "llm.yaml"
    try:
        res = expand_document(parse_text(src.read_text(), src.name), ExpandOptions(connector=connector),
                              pipeline="llm", inventory=inv)
    except Exception as e:  # a placement the inventory cannot hold: two stages on a 1-device host
        assert raw["placement"][0] == raw["placement"][1] and "OPD805" in str(getattr(e, "diagnostic", e).code)
        return
    planned = plan_document(parse_text(res.text, "pd.yaml", own_output=True), "pd.yaml",
                            LaunchOptions(model="/m", platform="cpu"), inventory=inv)
    assert planned.plan is not None, [d.message for d in planned.validation.diagnostics]
    addr = {n: h["address"] for n, h in raw["hosts"].items()}
    for p in planned.plan.processes:
        own = addr[p.host]
        assert {u.host for u in p.ports} == {own}
        assert p.health.url.startswith(f"http://{own}:")
        for key in ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_HOST_IP"):
            assert p.env.get(key, own) == own
        if "--kv-transfer-config" in p.argv:
            kv = json.loads(p.argv[p.argv.index("--kv-transfer-config") + 1])
            assert kv.get("kv_ip", own) == own


def test_the_launchers_visible_devices_apply_to_its_own_hosts_processes_only():
    """`CUDA_VISIBLE_DEVICES=4,5 omni-pd launch --inventory ... --host A`: A's prefill maps
    logical device 0 through A's variable (physical 4); B's decode keeps logical 0, an index
    into B's own variable when it starts there. Before, every host's engines were mapped
    through this machine's variable."""
    def dev(plan, name):
        return plan.process(name).env.get("CUDA_VISIBLE_DEVICES")

    on_a = _plan(platform="cuda", launcher_env={"CUDA_VISIBLE_DEVICES": "4,5"}, local_host="A")
    assert (dev(on_a, "prefill-0"), dev(on_a, "decode-0")) == ("4", "0")
    on_b = _plan(platform="cuda", launcher_env={"CUDA_VISIBLE_DEVICES": "4,5"}, local_host="B")
    assert (dev(on_b, "prefill-0"), dev(on_b, "decode-0")) == ("0", "4")
    every = _plan(platform="cuda", launcher_env={"CUDA_VISIBLE_DEVICES": "4,5"})  # dry-run of every host
    assert (dev(every, "prefill-0"), dev(every, "decode-0")) == ("0", "0")
    alone = _plan(platform="cuda")
    assert (dev(alone, "prefill-0"), dev(alone, "decode-0")) == ("0", "0")
