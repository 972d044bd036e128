"""One prefill instance spanning two (simulated) hosts, vLLM's own multi-node launch, through
``omni-pd launch --host`` (issue 25: TP across nodes).

Hosts A and B are network namespaces joined by a veth pair (tests/e2e/netns.py: a /30 only
between them). The tiny random-weight Qwen2 is compiled, ``expand --inventory`` with
``placement: {0: [A, B], 1: B}``, into a NIXL pair whose prefill has TP 2 over ``nnodes: 2``
and whose decode has TP 2 on B. Equal TPs: the tiny model has one KV head, and vLLM 0.30's
NIXL refuses a prefill TP above ``num_key_value_heads`` with a smaller decode TP (the first
run of this test hit it as decode's "handshake_setup_failed"), so the test first shows that
``omni-pd launch`` refuses that pair from the checkpoint's own config.json (OPD603) before
starting anything.

``omni-pd launch --host A`` starts node rank 0 (the API server, the scheduler, TP rank 0,
``--master-addr`` A's address), ``--host B`` the headless TP rank 1 (``--node-rank 1
--headless``), decode and the router. The two TP ranks meet over torch.distributed (gloo on
CPU, ``GLOO_SOCKET_IFNAME`` the veth) across the pair; B's launch is ready once prefill's
``/health`` on A answers. Greedy completions through the router equal a plain TP 1
instance's, and decode's ``vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}``
grows.

Needs the e2e venv (``OMNI_PD_E2E_PYTHON``) and network namespaces (root, ``ip netns``).
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
from omni_pd.compile.port_plan import SPAN_MASTER_PORT_OFFSET

ROOT = Path(__file__).resolve().parents[1]
E2E = os.environ.get("OMNI_PD_E2E_PYTHON")

pytestmark = [
    pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)"),
    pytest.mark.skipif(not netns_works(), reason="needs root and `ip netns` (iproute2)"),
]

#: the /30 between the namespaces (RFC 1918; it exists only on the veth pair)
NET = "10.202.0"
ADDR = {"A": f"{NET}.1", "B": f"{NET}.2"}
ROUTER, ENGINES, SIDE = 18610, 18710, 18910
HOSTS_YAML = (f"hosts:\n  A: {{address: {ADDR['A']}, count: 1}}\n  B: {{address: {ADDR['B']}, count: 3}}\n"
              "placement: {0: [A, B], 1: B}\n")


def test_prefill_tp2_over_hosts_a_and_b_equals_a_plain_instance_and_kv_crosses(tmp_path, tiny_model, plain_llm):
    from omni_pd.launch.smoke import kv_received

    model = tiny_model("qwen2")
    vllm = str(Path(E2E).parent / "vllm")
    inv = tmp_path / "hosts.yaml"
    inv.write_text(HOSTS_YAML)

    def expand(out: Path, *tp: str) -> Path:
        subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q",
                        str(ROOT / "tests" / "fixtures" / "llm.yaml"), "--pipeline", "llm", "--connector",
                        "NixlConnector", "--kv-buffer-device", "cpu", *tp, "--port-base", str(SIDE),
                        "--inventory", str(inv), "-o", str(out)], check=True)
        return out

    # prefill TP 2 over one KV head with decode at TP 1: refused from the checkpoint's config.json
    bad = expand(tmp_path / "pd-tp2-tp1.yaml", "--prefill-tp", "2")
    lr = subprocess.run([sys.executable, "-m", "omni_pd.cli", "launch", str(bad), "--inventory", str(inv), "--host",
                         "A", "--model", str(model), "--platform", "cpu", "--run-dir", str(tmp_path / "run-bad")],
                        capture_output=True, text=True)
    assert lr.returncode == 1, lr.stdout + lr.stderr
    assert ("error[OPD603]: prefill TP 2 > num_key_value_heads 1 with the other side at TP 1: KV heads are "
            "replicated and the heterogeneous-TP shape check fails") in lr.stdout
    assert not (tmp_path / "run-bad").exists()
    pd = expand(tmp_path / "pd.yaml", "--prefill-tp", "2", "--decode-tp", "2")
    assert "    tensor_parallel_size: 2\n    nnodes: 2\n" in pd.read_text()
    with two_hosts(f"opt{os.getpid() % 100000}", ADDR) as ns:
        base_env = engine_env(tmp_path)
        # per host: its own address for vLLM's get_ip(); gloo and UCX over the veth only
        env = {h: {**base_env, "GLOO_SOCKET_IFNAME": veth(ns[h]), "UCX_TLS": "tcp", "UCX_NET_DEVICES": veth(ns[h])}
               for h in ("A", "B")}
        t0 = time.monotonic()
        launch = {h: Launcher(pd, model, vllm, tmp_path / f"run{h}", router_port=ROUTER, engine_port_base=ENGINES,
                              env=env[h], extra=("--inventory", str(inv), "--host", h),
                              prefix=("ip", "netns", "exec", ns[h]))
                  for h in ("A", "B")}
        try:
            launch["A"].wait_for("process healthy after", 900)
            launch["B"].wait_for("processes healthy after", 900)
            ready_s = time.monotonic() - t0
            pids = {h: [ln.split()[1] for ln in (tmp_path / f"run{h}" / "pids").read_text().splitlines()]
                    for h in ("A", "B")}
            assert pids == {"A": ["prefill-0"], "B": ["prefill-0-node1", "decode-0", "router"]}
            assert any(f"waiting for prefill-0 on A (GET http://{ADDR['A']}:{ENGINES}/health)" in ln
                       for ln in launch["B"].lines)
            got = json.loads(run_in(ns["B"], COMPLETIONS_CLIENT, f"http://{ADDR['B']}:{ROUTER}",
                                    f"http://{ADDR['B']}:{ENGINES + 100}/metrics", json.dumps([LONG, SHORT])))
            assert got["texts"] == [plain_llm.completion(p, 24) for p in (LONG, SHORT)]
            assert kv_received(got["after"]) > kv_received(got["before"]), "decode did not receive KV from prefill"
            worker_log = (tmp_path / "runB" / "prefill-0-node1.log").read_text()
            assert f"head node address {ADDR['A']}:{ENGINES + SPAN_MASTER_PORT_OFFSET}" in worker_log, worker_log[-3000:]
            print(f"prefill TP 2 across hosts, decode TP 2: all healthy after {ready_s:.1f} s; outputs equal; "
                  f"KV tokens received {kv_received(got['after']) - kv_received(got['before']):g}")
        finally:
            rc_b, rc_a = launch["B"].stop(), launch["A"].stop()
        assert (rc_a, rc_b) == (130, 130), "\n".join(launch["A"].lines[-20:] + launch["B"].lines[-20:])
