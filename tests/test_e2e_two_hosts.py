"""A prefill/decode pair on two (simulated) hosts through ``omni-pd launch --host`` (issue 25).

Two Linux network namespaces stand for hosts A and B, joined by a veth pair whose two
addresses form a private /30 that exists only between them (no route to anything else, no
loopback shared: traffic only between these namespaces). The tiny random-weight Qwen2 model
(tests/e2e/make_tiny_model.py) is compiled once, ``expand --inventory``, into a NIXL 1P1D
pair (``kv_buffer_device: cpu``) with prefill on A and decode on B; ``omni-pd launch
--inventory hosts.yaml --host A`` and ``--host B`` run inside each namespace (``ip netns
exec``), UCX restricted to TCP over the veth (no shared-memory shortcut between the
"hosts"). Greedy completions through the router on B equal a plain vLLM instance's, and
decode's ``vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`` grows: the
prompt's KV came from prefill on the other host. The same config with a localhost side
channel is refused by ``validate`` (OPD503) and by ``launch`` before anything starts.

The engine run needs the e2e venv (``OMNI_PD_E2E_PYTHON``) and network namespaces (root,
``ip netns``); the namespaces are removed in a fixture finalizer, also after a failure. The
refusal test runs everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e.baselines import LONG, SHORT
from e2e.harness import Launcher, engine_env
from e2e.netns import COMPLETIONS_CLIENT, netns_works, run_in, two_hosts, veth

ROOT = Path(__file__).resolve().parents[1]
E2E = os.environ.get("OMNI_PD_E2E_PYTHON")


#: the engine run's conditions (the refusal test needs neither)
needs_hosts = [
    pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)"),
    pytest.mark.skipif(not netns_works(), reason="needs root and `ip netns` (iproute2)"),
]

#: the /30 between the namespaces (RFC 1918; it exists only on the veth pair)
NET = "10.201.0"
ADDR = {"A": f"{NET}.1", "B": f"{NET}.2"}
ROUTER, ENGINES, SIDE = 18600, 18700, 18900
HOSTS_YAML = (f"hosts:\n  A: {{address: {ADDR['A']}, count: 1}}\n  B: {{address: {ADDR['B']}, count: 1}}\n"
              "placement: {0: A, 1: B}\n")


@pytest.fixture
def hosts():
    """``{"A": netns name, "B": netns name}``: two namespaces joined by a veth pair, each
    with loopback up and its address of :data:`NET`/30; removed afterwards whatever happened."""
    with two_hosts(f"opd{os.getpid() % 100000}", ADDR) as ns:
        yield ns


def _host_launcher(ns: str, host: str, pd: Path, inv: Path, model: Path, vllm: str, run_dir: Path,
                   env: dict[str, str]) -> Launcher:
    """``omni-pd launch --inventory INV --host HOST`` inside network namespace ``ns``."""
    return Launcher(pd, model, vllm, run_dir, router_port=ROUTER, engine_port_base=ENGINES, env=env,
                    extra=("--inventory", str(inv), "--host", host), prefix=("ip", "netns", "exec", ns))


def _expand(tmp: Path, inv: Path) -> Path:
    pd = tmp / "pd.yaml"
    subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q", str(ROOT / "tests" / "fixtures" / "llm.yaml"),
                    "--pipeline", "llm", "--connector", "NixlConnector", "--kv-buffer-device", "cpu",
                    "--port-base", str(SIDE), "--inventory", str(inv), "-o", str(pd)], check=True)
    return pd


def test_localhost_side_channel_across_hosts_is_refused_before_anything_starts(tmp_path):
    inv = tmp_path / "hosts.yaml"
    inv.write_text(HOSTS_YAML)
    pd = _expand(tmp_path, inv)
    bad = tmp_path / "pd-localhost.yaml"
    bad.write_text(pd.read_text().replace(f'VLLM_NIXL_SIDE_CHANNEL_HOST: "{ADDR["A"]}"',
                                          'VLLM_NIXL_SIDE_CHANNEL_HOST: "127.0.0.1"'))
    v = subprocess.run([sys.executable, "-m", "omni_pd.cli", "validate", str(bad), "--inventory", str(inv)],
                       capture_output=True, text=True)
    assert v.returncode == 1
    assert ("error[OPD503]: stage 0 (prefill) on A advertises '127.0.0.1' as its NIXL side channel; decode on B "
            "cannot reach it") in v.stdout
    run = tmp_path / "run"
    lr = subprocess.run([sys.executable, "-m", "omni_pd.cli", "launch", str(bad), "--inventory", str(inv), "--host",
                         "A", "--model", "/m", "--platform", "cpu", "--run-dir", str(run)],
                        capture_output=True, text=True)
    assert lr.returncode == 1 and "error[OPD503]" in lr.stdout
    assert not run.exists()  # nothing started


@needs_hosts[0]
@needs_hosts[1]
def test_prefill_on_a_and_decode_on_b_equal_a_plain_instance_and_kv_crosses(tmp_path, hosts, tiny_model, plain_llm):
    from omni_pd.launch.smoke import kv_received

    model = tiny_model("qwen2")
    vllm = str(Path(E2E).parent / "vllm")
    inv = tmp_path / "hosts.yaml"
    inv.write_text(HOSTS_YAML)
    pd = _expand(tmp_path, inv)
    base_env = engine_env(tmp_path)
    # per host: its own address for vLLM's get_ip(), UCX over TCP on the veth only
    env = {h: {**base_env, "VLLM_HOST_IP": ADDR[h], "UCX_TLS": "tcp", "UCX_NET_DEVICES": veth(hosts[h])}
           for h in ("A", "B")}
    t0 = time.monotonic()
    a = _host_launcher(hosts["A"], "A", pd, inv, model, vllm, tmp_path / "runA", env["A"])
    b = _host_launcher(hosts["B"], "B", pd, inv, model, vllm, tmp_path / "runB", env["B"])
    try:
        a.wait_for("process healthy after", 900)
        b.wait_for("processes healthy after", 900)
        ready_s = time.monotonic() - t0
        # B started decode and the router and waited for prefill on A; A started prefill alone
        assert any(f"waiting for prefill-0 on A (GET http://{ADDR['A']}:{ENGINES}/health)" in ln for ln in b.lines)
        assert not any("started decode-0" in ln or "started router" in ln for ln in a.lines)
        assert [ln.split()[1] for ln in (tmp_path / "runB" / "pids").read_text().splitlines()] == ["decode-0", "router"]
        # the router on B: through B's namespace only (A's address is not reachable from the test's host)
        got = json.loads(run_in(hosts["B"], COMPLETIONS_CLIENT, f"http://{ADDR['B']}:{ROUTER}",
                             f"http://{ADDR['B']}:{ENGINES + 100}/metrics", json.dumps([LONG, SHORT])))
        want = [plain_llm.completion(p, 24) for p in (LONG, SHORT)]
        assert got["texts"] == want
        assert kv_received(got["after"]) > kv_received(got["before"]), "decode did not receive KV from prefill"
        print(f"two hosts: all healthy after {ready_s:.1f} s; outputs equal; KV tokens received "
              f"{kv_received(got['after']) - kv_received(got['before']):g}")
    finally:
        rc_b, rc_a = b.stop(), a.stop()
    assert (rc_a, rc_b) == (130, 130), "\n".join(a.lines[-20:] + b.lines[-20:])

