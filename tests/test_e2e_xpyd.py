"""A real xPyD run on CPU through `omni-pd launch` (issue 15): 2 prefill + 1 decode.

Runs where the e2e venv exists (``OMNI_PD_E2E_PYTHON``, built by ``.ci/e2e_venv.sh``),
on the shared tiny random-weight Qwen2 model. At most three engines run at once: first a
plain instance records the greedy outputs, then ``expand --prefill-replicas 2`` (NIXL,
``kv_buffer_device: cpu``) is launched as prefill-0, prefill-1, decode-0 and the router.
Checked: every answer through the router equals the plain instance's; both prefills
computed prompts (their ``vllm:prompt_tokens_by_source_total{source="local_compute"}``
grew) and decode received KV; then prefill-1 is SIGKILLed while requests run and every
request still succeeds with the same output (the router retries on prefill-0 and skips
prefill-1), the launcher keeps serving and restarts prefill-1; after SIGINT nothing is
left.
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
from e2e.harness import Launcher, alive, engine_env, get, port_free, post_json, prompt_tokens_by_source, wait_health

ROOT = Path(__file__).resolve().parents[1]
E2E = os.environ.get("OMNI_PD_E2E_PYTHON")
pytestmark = pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)")

ROUTER, ENGINES, PLAIN, SIDE = 18600, 18700, 18900, 19000
PROMPTS = [" ".join(f"def g{i}_{k}(x):\n    return x * {i} - {k}" for i in range(36)) for k in range(3)] + [
    "def hello_world(x):"]


def complete(base: str, prompt: str) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    return post_json(base + "/v1/completions", body, timeout=120)["choices"][0]["text"]


def local_compute(port: int) -> float:
    return prompt_tokens_by_source(get(f"http://127.0.0.1:{port}/metrics")).get("local_compute", 0.0)


def kv_transferred(port: int) -> float:
    return prompt_tokens_by_source(get(f"http://127.0.0.1:{port}/metrics")).get("external_kv_transfer", 0.0)


def test_2p1d_on_cpu_spreads_equals_plain_and_survives_a_prefill_kill(tmp_path, tiny_model):
    model = tiny_model("qwen2")
    vllm = str(Path(E2E).parent / "vllm")
    env = engine_env(tmp_path)
    # 1. the plain instance's answers (one engine, stopped before the xPyD run starts)
    log = open(tmp_path / "plain.log", "w")
    plain = subprocess.Popen([vllm, "serve", str(model), "--host", "127.0.0.1", "--port", str(PLAIN),
                              "--served-model-name", "tiny", "--max-model-len", "1024", "--enforce-eager",
                              "--dtype", "float32"], env={**os.environ, **env}, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_health(f"http://127.0.0.1:{PLAIN}/health", 600, plain)
        want = {p: complete(f"http://127.0.0.1:{PLAIN}", p) for p in PROMPTS}
    finally:
        os.killpg(plain.pid, signal.SIGKILL)
        plain.wait()
    # 2. 2P1D from expand to launch
    pd = tmp_path / "pd.yaml"
    subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q", str(ROOT / "tests" / "fixtures" / "llm.yaml"),
                    "--pipeline", "llm", "--connector", "NixlConnector", "--kv-buffer-device", "cpu",
                    "--prefill-replicas", "2", "--port-base", str(SIDE), "-o", str(pd)], check=True)
    launcher = Launcher(pd, model, vllm, tmp_path / "run", router_port=ROUTER, engine_port_base=ENGINES, env=env)
    router = f"http://127.0.0.1:{ROUTER}"
    p0, p1, d0 = ENGINES, ENGINES + 1, ENGINES + 100
    try:
        launcher.wait_for("all 4 processes healthy after", 900)
        tree = launcher.descendants()
        before = {p: local_compute(p) for p in (p0, p1)}
        kv0 = kv_transferred(d0)
        t_spread = time.monotonic()
        for prompt in PROMPTS:  # least outstanding, ties in turn: two for each prefill
            assert complete(router, prompt) == want[prompt]
        t_spread = time.monotonic() - t_spread
        after = {p: local_compute(p) for p in (p0, p1)}
        assert all(after[p] > before[p] for p in (p0, p1)), f"a prefill served nothing: {before} -> {after}"
        assert kv_transferred(d0) > kv0, "decode received no KV"
        # 3. prefill-1 killed while requests run: every request still answers, unchanged
        got: list[tuple[str, str]] = []
        errors: list[BaseException] = []

        def client() -> None:
            try:
                for i in range(8):
                    p = PROMPTS[i % len(PROMPTS)]
                    got.append((p, complete(router, p)))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        t = threading.Thread(target=client)
        t_kill = time.monotonic()
        t.start()
        while len(got) < 1 and t.is_alive():
            time.sleep(0.05)
        os.killpg(launcher.pids()["prefill-1"], signal.SIGKILL)
        t.join(300)
        t_kill = time.monotonic() - t_kill
        assert errors == [] and len(got) == 8
        assert [g for p, g in got] == [want[p] for p, _ in got]
        launcher.wait_for("prefill-1 exited with", 60)
        assert launcher.proc.poll() is None, "the launcher tore the deployment down"
        assert any("restarting (1/3)" in ln for ln in launcher.lines), launcher.lines[-20:]
        # measurements for the record (pytest -rP shows them)
        print(f"xPyD 2P1D: prompt tokens computed per prefill {before} -> {after}; decode KV tokens "
              f"{kv0} -> {kv_transferred(d0)}; 4 requests {t_spread:.1f} s; 8 requests across the kill "
              f"{t_kill:.1f} s; {launcher.wait_for('all 4 processes healthy after', 1)}")
    finally:
        if launcher.proc.poll() is None:
            launcher.proc.send_signal(signal.SIGINT)
        rc = launcher.proc.wait(120)
    assert rc == 130, "\n".join(launcher.lines[-40:])
    time.sleep(1)
    assert [p for p in tree + launcher.descendants() if alive(p)] == []
    assert all(port_free(p) for p in (ROUTER, p0, p1, d0, SIDE, SIDE + 1, SIDE + 2))
