"""Supervisor tests with real child processes (tests/launch_helpers/child.py).

Every child runs ``sys.executable`` on the helper; ports come from binding port 0. The
SIGINT/SIGTERM tests run the launcher itself as a process (launch_helpers/launcher.py).
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from omni_pd.launch.spec import HealthCheck, LaunchPlan, PortUse, ProcessSpec
from omni_pd.launch.supervisor import Supervisor, restart_argv, run

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process groups and signals")

HELPERS = Path(__file__).parent / "launch_helpers"
CHILD = str(HELPERS / "child.py")
LAUNCHER = str(HELPERS / "launcher.py")
REPO = Path(__file__).resolve().parents[1]


# --- helpers ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child(name: str, *args: object, port: int | None = None, depends_on: tuple[str, ...] = (),
          env: dict[str, str] | None = None, timeout_s: float = 10.0) -> ProcessSpec:
    argv = [sys.executable, CHILD, *map(str, args)]
    health = None
    if port is not None:
        argv += ["--port", str(port)]
        health = HealthCheck(f"http://127.0.0.1:{port}/health", timeout_s=timeout_s, interval_s=0.02, max_interval_s=0.1)
    return ProcessSpec(name=name, argv=tuple(argv), env=env or {}, ports=(PortUse(port, "http"),) if port else (),
                       health=health, depends_on=depends_on)


def plan(*procs: ProcessSpec) -> LaunchPlan:
    return LaunchPlan(runtime="vllm", model="test", connector="none", entrypoint="", config="", processes=procs)


def alive(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:].split()[0] != b"Z"
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def read_pid(path: Path) -> int:
    assert wait_for(path.exists, 5), path
    return int(path.read_text())


def stamps(log: Path, word: str) -> float:
    m = re.search(rf"^{word} .*?at ([0-9.]+)$", log.read_text(), re.M)
    assert m, (word, log.read_text())
    return float(m.group(1))


# --- 1. start order --------------------------------------------------------------------


def test_dependent_starts_after_all_dependencies_are_healthy(tmp_path: Path) -> None:
    pa, pb, pc = free_port(), free_port(), free_port()
    p = plan(
        child("prefill-0", "--healthy-after", 0.4, port=pa),
        child("decode-0", "--healthy-after", 0.2, port=pb),
        child("router", port=pc, depends_on=("prefill-0", "decode-0")),
    )
    out = io.StringIO()
    with Supervisor(p, tmp_path, out=out, live=False, grace_s=2) as sup:
        assert sup.start_and_wait_healthy()
        t = sup.timings
        pids = sup.pids()
    # the engines start at once, each before the other became healthy
    healthy = {n: t.started_s[n] + t.ready_s[n] for n in t.ready_s}
    assert max(t.started_s["prefill-0"], t.started_s["decode-0"]) < min(healthy["prefill-0"], healthy["decode-0"])
    assert t.ready_s["prefill-0"] >= 0.4 and t.ready_s["decode-0"] >= 0.2
    # the router starts after both are healthy (launcher clock and the children's own)
    assert t.started_s["router"] >= max(healthy["prefill-0"], healthy["decode-0"])
    router_start = stamps(tmp_path / "router.log", "start")
    assert router_start > stamps(tmp_path / "prefill-0.log", "served 200")
    assert router_start > stamps(tmp_path / "decode-0.log", "served 200")
    # timings: critical path = slowest engine + router; overhead is what is left
    assert t.all_healthy_s == pytest.approx(healthy["router"], abs=1e-6)
    slowest = max(t.ready_s["prefill-0"], t.ready_s["decode-0"])
    assert t.critical_path_s == pytest.approx(slowest + t.ready_s["router"], abs=1e-6)
    assert t.overhead_s == pytest.approx(t.all_healthy_s - t.critical_path_s, abs=1e-6)
    assert json.loads((tmp_path / "timings.json").read_text())["all_healthy_s"] == round(t.all_healthy_s, 3)
    # debugging files
    assert {ln.split()[1]: int(ln.split()[0]) for ln in (tmp_path / "pids").read_text().splitlines()} == pids
    assert [q["name"] for q in json.loads((tmp_path / "plan.json").read_text())["processes"]] == [
        "prefill-0", "decode-0", "router"]
    text = out.getvalue()
    assert text.index("prefill-0 healthy") < text.index("started router")
    assert text.index("decode-0 healthy") < text.index("started router")
    assert "all 3 processes healthy" in text
    assert not any(alive(pid) for pid in pids.values())
    assert all(bindable(port) for port in (pa, pb, pc))


# --- 2. early exit ---------------------------------------------------------------------


def test_child_exit_tears_everything_down(tmp_path: Path) -> None:
    pa, pb = free_port(), free_port()
    p = plan(
        child("prefill-0", "--grandchild", tmp_path / "gc.pid", port=pa),
        # decode-0 starts once prefill-0 is healthy and exits 1 s after its start
        child("decode-0", "--lines", 30, "--exit-after", 1, "--exit-code", 3, port=pb, depends_on=("prefill-0",)),
        child("router", depends_on=("decode-0",)),
    )
    out = io.StringIO()
    rc = run(p, tmp_path, out=out, live=False, grace_s=2, handle_signals=False)
    assert rc == 1
    text = out.getvalue()
    assert "still running after" not in text  # children stopped on SIGTERM: no SIGKILL needed
    assert "decode-0 exited with exit code 3 after it became healthy" in text
    assert "decode-0 exit code: 3" in text
    report = text[text.index("launch failed:"):]
    assert "last 20 log lines of decode-0" in report
    tail = re.findall(r"  \| (.*)\n", report)
    assert len(tail) == 20 and tail[-1] == "exiting with 3" and "line 29" in tail
    assert "line 9" not in tail  # only the tail
    pids = [int(ln.split()[0]) for ln in (tmp_path / "pids").read_text().splitlines()]
    assert len(pids) == 3
    assert not any(alive(pid) for pid in pids + [read_pid(tmp_path / "gc.pid")])
    assert bindable(pa) and bindable(pb)


def test_child_exit_before_healthy_fails_start(tmp_path: Path) -> None:
    p = plan(child("prefill-0", "--stderr", "CUDA out of memory", "--healthy-after", 60, "--exit-after", 0,
                   "--exit-code", 7, port=free_port()),
             child("router", depends_on=("prefill-0",)))
    out = io.StringIO()
    with Supervisor(p, tmp_path, out=out, live=False) as sup:
        assert not sup.start_and_wait_healthy()
        assert sup.exit_code == 1 and sup.failure is not None
        assert sup.failure.process == "prefill-0" and sup.failure.returncode == 7
        assert "router" not in sup.pids()
    text = out.getvalue()
    assert "prefill-0 exited with exit code 7 before it became healthy" in text
    assert "  | CUDA out of memory" in text


def test_unstartable_command_fails(tmp_path: Path) -> None:
    p = plan(child("a", port=free_port()),
             ProcessSpec(name="b", argv=(str(tmp_path / "no-such-binary"),)))
    out = io.StringIO()
    assert run(p, tmp_path, out=out, live=False, grace_s=1, handle_signals=False) == 1
    assert "b could not start" in out.getvalue() and "no-such-binary" in out.getvalue()
    (pid,) = [int(ln.split()[0]) for ln in (tmp_path / "pids").read_text().splitlines()]
    assert not alive(pid)


# --- 3. signals to the launcher --------------------------------------------------------


def _launch(tmp_path: Path, procs: list[dict], grace_s: float = 5.0) -> tuple[subprocess.Popen, Path]:
    spec = tmp_path / "plan-in.json"
    spec.write_text(json.dumps({"processes": procs}))
    run_dir = tmp_path / "run"
    log = open(tmp_path / "launcher.out", "w")
    proc = subprocess.Popen([sys.executable, LAUNCHER, str(spec), str(run_dir), str(grace_s)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    log.close()
    return proc, run_dir


def _wait_healthy(proc: subprocess.Popen, run_dir: Path, tmp_path: Path) -> None:
    ok = wait_for(lambda: (run_dir / "timings.json").exists() or proc.poll() is not None, 15)
    assert ok and proc.poll() is None, (tmp_path / "launcher.out").read_text()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_to_launcher_stops_the_whole_tree(tmp_path: Path, sig: int, code: int) -> None:
    pa, pb = free_port(), free_port()
    procs = [
        {"name": "prefill-0", "argv": [sys.executable, CHILD, "--port", str(pa), "--grandchild",
                                       str(tmp_path / "gc.pid"), "--escaped-grandchild", str(tmp_path / "esc.pid")],
         "health_url": f"http://127.0.0.1:{pa}/health", "ports": [pa]},
        {"name": "router", "argv": [sys.executable, CHILD, "--port", str(pb), "--grandchild", str(tmp_path / "gc2.pid")],
         "health_url": f"http://127.0.0.1:{pb}/health", "ports": [pb], "depends_on": ["prefill-0"]},
    ]
    proc, run_dir = _launch(tmp_path, procs)
    _wait_healthy(proc, run_dir, tmp_path)
    pids = [int(ln.split()[0]) for ln in (run_dir / "pids").read_text().splitlines()]
    pids += [read_pid(tmp_path / f) for f in ("gc.pid", "esc.pid", "gc2.pid")]
    assert len(pids) == 5 and all(alive(pid) for pid in pids)
    proc.send_signal(sig)
    assert proc.wait(10) == code
    out = (tmp_path / "launcher.out").read_text()
    assert f"received {signal.Signals(sig).name}" in out and "stopped 2 processes" in out
    assert [pid for pid in pids if alive(pid)] == []
    assert bindable(pa) and bindable(pb)


def test_second_sigint_kills_at_once(tmp_path: Path) -> None:
    pa = free_port()
    procs = [{"name": "stubborn", "argv": [sys.executable, CHILD, "--port", str(pa), "--ignore-term",
                                           "--grandchild", str(tmp_path / "gc.pid")],
              "health_url": f"http://127.0.0.1:{pa}/health", "ports": [pa]}]
    proc, run_dir = _launch(tmp_path, procs, grace_s=60)
    _wait_healthy(proc, run_dir, tmp_path)
    pids = [int((run_dir / "pids").read_text().split()[0]), read_pid(tmp_path / "gc.pid")]
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    assert proc.poll() is None and all(alive(pid) for pid in pids)  # SIGTERM ignored, in grace
    proc.send_signal(signal.SIGINT)
    assert proc.wait(10) == 130  # well inside the 60 s grace: the second signal escalated
    assert "a second signal" in (tmp_path / "launcher.out").read_text()
    assert [pid for pid in pids if alive(pid)] == []
    assert bindable(pa)


# --- 4. SIGKILL after the grace period -------------------------------------------------


def test_sigterm_ignoring_child_is_killed_after_grace(tmp_path: Path) -> None:
    p = plan(child("stubborn", "--ignore-term", "--grandchild", tmp_path / "gc.pid", port=free_port()),
             child("polite", port=free_port()))
    out = io.StringIO()
    with Supervisor(p, tmp_path, out=out, live=False, grace_s=0.5) as sup:
        assert sup.start_and_wait_healthy()
        pids = sup.pids()
        gc = read_pid(tmp_path / "gc.pid")
        sup.shutdown()
        sup.shutdown()  # idempotent
    assert "SIGKILL to stubborn (still running after 0.5 s)" in out.getvalue()
    assert not any(alive(pid) for pid in [*pids.values(), gc])


# --- 5. health timeout -----------------------------------------------------------------


def test_health_timeout_names_the_url(tmp_path: Path) -> None:
    port = free_port()
    p = plan(child("prefill-0", "--healthy-after", 60, port=port, timeout_s=1.5), child("other", port=free_port()))
    out = io.StringIO()
    assert run(p, tmp_path, out=out, live=False, grace_s=1, handle_signals=False) == 1
    text = out.getvalue()
    # last: HTTP 503 (or connection refused on a machine so slow that the child took 1.5 s to start)
    assert f"prefill-0 did not become healthy within 1.5 s: GET http://127.0.0.1:{port}/health (last: " in text
    assert not any(alive(int(ln.split()[0])) for ln in (tmp_path / "pids").read_text().splitlines())


# --- 6. secrets ------------------------------------------------------------------------


def test_secrets_are_masked_in_logs_output_and_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAUNCHER_API_KEY", "launcher-secret-42")
    secret = "hf_s3cr3t_t0ken_value"
    spec = ProcessSpec(
        name="engine",
        argv=(sys.executable, CHILD, "--print-env", "HF_TOKEN", "--print-env", "LAUNCHER_API_KEY",
              "--print-env", "PLAIN", "--stderr", f"auth failed for {secret}!", "--exit-after", "0"),
        env={"HF_TOKEN": secret, "PLAIN": "visible-value"},
    )
    out = io.StringIO()
    assert run(plan(spec), tmp_path, out=out, live=False, grace_s=1, handle_signals=False) == 1
    log = (tmp_path / "engine.log").read_text()
    streamed = out.getvalue()
    for text in (log, streamed, (tmp_path / "plan.json").read_text()):
        assert secret not in text and "launcher-secret-42" not in text
    for text in (log, streamed):
        assert "HF_TOKEN=***" in text and "LAUNCHER_API_KEY=***" in text and "auth failed for ***!" in text
        assert "PLAIN=visible-value" in text
    assert "  | auth failed for ***!" in streamed  # the failure report too


# --- 7. log files ----------------------------------------------------------------------


def test_log_files_hold_raw_lines_per_process(tmp_path: Path) -> None:
    # the children print before they serve /health: healthy means printed; colours are dropped
    p = plan(child("prefill-0", "--lines", 3, "--stderr", "to \x1b[1;31mstderr\x1b[0m [x]", port=free_port()),
             child("decode-0", "--lines", 2, port=free_port()))
    out = io.StringIO()
    assert run(p, tmp_path, out=out, live=False, stay=False, grace_s=1, handle_signals=False) == 0
    pre = (tmp_path / "prefill-0.log").read_text().splitlines()
    assert pre[0].startswith("start ") and pre[1:5] == ["line 0", "line 1", "line 2", "to stderr [x]"]
    dec = (tmp_path / "decode-0.log").read_text().splitlines()
    assert dec[1:3] == ["line 0", "line 1"]
    streamed = out.getvalue().splitlines()
    assert "[prefill-0] line 0" in streamed and "[prefill-0] to stderr [x]" in streamed
    assert "[decode-0] line 1" in streamed


# --- API odds and ends -----------------------------------------------------------------


def test_on_ready_result_and_stay_false(tmp_path: Path) -> None:
    calls = []
    p = plan(child("a", port=free_port()))
    out = io.StringIO()
    assert run(p, tmp_path / "ok", on_ready=lambda _out: calls.append(1) or 0, stay=False, out=out, live=False,
               handle_signals=False) == 0
    assert run(p, tmp_path / "bad", on_ready=lambda _out: 4, out=out, live=False, handle_signals=False) == 4
    assert calls == [1] and "readiness check returned 4" in out.getvalue()
    for d in ("ok", "bad"):
        assert not alive(int((tmp_path / d / "pids").read_text().split()[0]))


def test_live_view(tmp_path: Path) -> None:
    out = io.StringIO()
    p = plan(child("prefill-0", "--lines", 1, port=free_port()))
    assert run(p, tmp_path, out=out, live=True, stay=False, handle_signals=False) == 0
    text = out.getvalue()
    assert "[prefill-0] line 0" in text and "process" in text and "stopped" in text


def test_readiness_output_goes_through_the_live_console(tmp_path: Path, monkeypatch) -> None:
    """On a terminal the live table redraws over anything written past its console (issue
    13: the `smoke: ok` line vanished from screen and scrollback); the readiness callback's
    lines are printed by the view's own console, above the table, whole lines only."""
    import rich.console
    import rich.text

    printed: list[str] = []

    class Recording(rich.console.Console):
        """A terminal console (so the live table really redraws) noting what is printed."""

        def __init__(self, *a, **kw) -> None:
            super().__init__(*a, **{**kw, "force_terminal": True, "width": 120})

        def print(self, *objects, **kw) -> None:
            printed.extend(o.plain for o in objects if isinstance(o, rich.text.Text))
            super().print(*objects, **kw)

    monkeypatch.setattr(rich.console, "Console", Recording)
    out = io.StringIO()

    def ready(o) -> int:
        o.write("smoke: ok in 1.00 s: ' x'; decode received KV\nsecond ")
        o.write("line, flushed at the end")
        return 0

    p = plan(child("prefill-0", port=free_port()))
    assert run(p, tmp_path, out=out, live=True, stay=False, handle_signals=False, on_ready=ready) == 0
    i = printed.index("smoke: ok in 1.00 s: ' x'; decode received KV")
    assert printed[i + 1] == "second line, flushed at the end"
    assert printed[i - 1].startswith("all 1 process healthy after ")  # after readiness, as the view's own
    assert "smoke: ok" in out.getvalue()


def test_readiness_output_without_a_terminal_is_a_launcher_line(tmp_path: Path) -> None:
    out = io.StringIO()
    p = plan(child("a", port=free_port()))
    assert run(p, tmp_path, out=out, live=False, stay=False, handle_signals=False,
               on_ready=lambda o: o.write("smoke: ok in 1.00 s\n") and 0) == 0
    assert "[omni-pd] smoke: ok in 1.00 s" in out.getvalue().splitlines()


def test_rich_is_imported_lazily() -> None:
    code = ("import sys, io; from omni_pd.launch import supervisor; "
            "supervisor.Supervisor(supervisor.LaunchPlan('vllm', 'm', 'c', '', '', ()), '.', out=io.StringIO()); "
            "print('rich' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


@pytest.mark.parametrize("procs, message", [
    ((ProcessSpec("a", ("x",)), ProcessSpec("a", ("x",))), "two processes are called 'a'"),
    ((ProcessSpec("a", ("x",), depends_on=("b",)),), "depends on 'b'"),
    ((ProcessSpec("a", ("x",), depends_on=("b",)), ProcessSpec("b", ("x",), depends_on=("a",))), "cycle: a -> b -> a"),
    ((ProcessSpec("../a", ("x",)),), "process name '../a'"),
    ((ProcessSpec("a", ()),), "empty argv"),
    ((ProcessSpec("a", ("x",), health=HealthCheck("localhost:80/health")),), "not http(s)"),
])
def test_bad_plans_are_refused(tmp_path: Path, procs: tuple[ProcessSpec, ...], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        Supervisor(plan(*procs), tmp_path)


# --- 5. xPyD: an instance that dies or turns unhealthy after readiness (issue 15) -----------


def _xpyd_plan(tmp_path: Path, *, p1_args: tuple = ()) -> tuple[LaunchPlan, list[int]]:
    ports = [free_port() for _ in range(3)]
    procs = (
        replace_role(child("prefill-0", port=ports[0]), "prefill"),
        replace_role(child("prefill-1", *p1_args, port=ports[1]), "prefill"),
        replace_role(child("decode-0", "--unhealthy-while", tmp_path / "d0-sick", port=ports[2]), "decode"),
        replace_role(child("router", depends_on=("prefill-0", "prefill-1", "decode-0")), "router"),
    )
    return plan(*procs), ports


def replace_role(spec: ProcessSpec, role: str) -> ProcessSpec:
    from dataclasses import replace

    return replace(spec, role=role)


def _supervise(sup: Supervisor) -> "threading.Thread":
    import threading

    t = threading.Thread(target=sup.wait, daemon=True)
    t.start()
    return t


def _pd_plan(tmp_path: Path) -> tuple[LaunchPlan, list[int]]:
    """E -> PD's two instances (role ``pd``, the router's single-instance pool), pd-1 exiting."""
    ports = [free_port() for _ in range(2)]
    return plan(replace_role(child("pd-0", port=ports[0]), "pd"),
                replace_role(child("pd-1", "--exit-after", 1.5, "--exit-code", 3, port=ports[1]), "pd"),
                replace_role(child("router", depends_on=("pd-0", "pd-1")), "router")), ports


@pytest.mark.parametrize("layout, dying", [("xpyd", "prefill-1"), ("e_to_pd", "pd-1")])
def test_instance_exit_after_readiness_restarts_it_while_another_serves(tmp_path: Path, layout, dying) -> None:
    """xPyD's prefill/decode instances and E -> PD's ``pd`` instances (a ``pd`` exit used
    to tear everything down): restarted while another of the role serves, then left out."""
    p, _ = (_xpyd_plan(tmp_path, p1_args=("--exit-after", 1.5, "--exit-code", 3)) if layout == "xpyd"
            else _pd_plan(tmp_path))
    out = io.StringIO()
    with Supervisor(p, tmp_path, out=out, live=False, grace_s=2, max_restarts=1) as sup:
        assert sup.start_and_wait_healthy()
        t = _supervise(sup)
        assert wait_for(lambda: "left out" in out.getvalue(), 15), out.getvalue()
        assert sup.failure is None and t.is_alive()  # still serving on the other instance
        sup.request_stop(signal.SIGTERM)
        t.join(5)
    text = out.getvalue()
    assert (f"{dying} exited with exit code 3 after it became healthy; out of rotation, restarting (1/1)"
            in text)
    assert text.count(f"started {dying}") == 2 and text.count(f"{dying} healthy after") == 2
    assert f"{dying} exited with exit code 3 after 1 restart(s); left out (the router routes around it)" in text
    log = (tmp_path / f"{dying}.log").read_text()
    assert log.count("exiting with 3") == 2  # the restart appended to the log
    pids = [int(ln.split()[0]) for ln in (tmp_path / "pids").read_text().splitlines()]
    assert not any(alive(pid) for pid in pids)


def test_restarted_instance_gets_a_fresh_kv_engine_id(tmp_path: Path) -> None:
    # vLLM's NIXL decode caches a prefill's agents by engine_id; with the old id every request
    # routed to a restarted prefill failed on decode (NIXL_ERR_REMOTE_DISCONNECT, 500)
    kv = '{"kv_connector":"NixlConnector","engine_id":"llm-prefill-r1","kv_role":"kv_producer"}'
    p, _ = _xpyd_plan(tmp_path, p1_args=("--kv-transfer-config", kv, "--exit-after", 1.5, "--exit-code", 3))
    out = io.StringIO()
    with Supervisor(p, tmp_path, out=out, live=False, grace_s=2, max_restarts=1) as sup:
        assert sup.start_and_wait_healthy()
        t = _supervise(sup)
        assert wait_for(lambda: "left out" in out.getvalue(), 15), out.getvalue()
        sup.request_stop(signal.SIGTERM)
        t.join(5)
    started = [ln.split(" ", 1)[1] for ln in (tmp_path / "prefill-1.log").read_text().splitlines()
               if ln.startswith("kv-transfer-config ")]
    assert started == [kv, kv.replace('"llm-prefill-r1"', '"llm-prefill-r1-restart1"')]
    assert restart_argv(["vllm", f"--kv-transfer-config={kv}", "--port", "1"], 2) == [
        "vllm", "--kv-transfer-config=" + kv.replace("llm-prefill-r1", "llm-prefill-r1-restart2"), "--port", "1"]
    for argv in (["vllm", "--kv-transfer-config", kv], ["vllm", "--kv-transfer-config", "{bad"],
                 ["vllm", "--kv-transfer-config", '{"engine_id": 3}'], ["vllm", "--kv-transfer-config"]):
        assert restart_argv(argv, 0) == argv
    for argv in (["vllm", "--kv-transfer-config", "{bad"], ["vllm", "--kv-transfer-config", '{"engine_id": 3}'],
                 ["vllm", "--kv-transfer-config"], ["vllm", "--port", "1"]):
        assert restart_argv(argv, 1) == argv


def test_fail_fast_tears_down_on_an_instance_exit(tmp_path: Path) -> None:
    p, _ = _xpyd_plan(tmp_path, p1_args=("--exit-after", 1.0, "--exit-code", 3))
    out = io.StringIO()
    assert run(p, tmp_path, out=out, live=False, grace_s=2, handle_signals=False, fail_fast=True) == 1
    text = out.getvalue()
    assert re.search(r"error: prefill-1 exited with exit code 3 after it became healthy \(.*\); stopping all", text)
    assert "restarting" not in text


def test_the_last_instance_of_a_role_exiting_still_tears_down(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(2)]
    p = plan(replace_role(child("prefill-0", port=ports[0]), "prefill"),
             replace_role(child("decode-0", "--exit-after", 1.0, "--exit-code", 4, port=ports[1]), "decode"))
    out = io.StringIO()
    assert run(p, tmp_path, out=out, live=False, grace_s=2, handle_signals=False) == 1
    assert re.search(r"error: decode-0 exited with exit code 4 after it became healthy \(.*\); stopping all",
                     out.getvalue())


def test_an_unhealthy_vllm_omni_server_is_not_said_to_be_routed_around(tmp_path: Path) -> None:
    """A vllm-omni server (role ``omni``) answering 503 after readiness (one of its stages died):
    no router stands in front of it, so the line says it is left running."""
    port = free_port()
    p = plan(replace_role(child("omni", "--unhealthy-while", tmp_path / "sick", port=port), "omni"))
    out = io.StringIO()
    with Supervisor(p, tmp_path, out=out, live=False, grace_s=2, monitor_interval_s=0.1) as sup:
        assert sup.start_and_wait_healthy()
        t = _supervise(sup)
        (tmp_path / "sick").write_text("")
        assert wait_for(lambda: "omni unhealthy after readiness" in out.getvalue(), 10), out.getvalue()
        line = next(ln for ln in out.getvalue().splitlines() if "omni unhealthy after readiness" in ln)
        assert line.endswith("left running, nothing routes around it (`omni-pd status RUN_DIR` says why; "
                             "--fail-fast stops all)"), line
        assert "router" not in line and sup.failure is None and t.is_alive()  # left running
        sup.request_stop(signal.SIGTERM)
        t.join(5)


@pytest.mark.parametrize("fail_fast", [False, True])
def test_health_is_polled_again_after_readiness(tmp_path: Path, fail_fast: bool) -> None:
    p, _ = _xpyd_plan(tmp_path)
    out = io.StringIO()
    with Supervisor(p, tmp_path, out=out, live=False, grace_s=2, monitor_interval_s=0.1,
                    fail_fast=fail_fast) as sup:
        assert sup.start_and_wait_healthy()
        t = _supervise(sup)
        (tmp_path / "d0-sick").write_text("")
        assert wait_for(lambda: "decode-0 unhealthy after readiness" in out.getvalue(), 10), out.getvalue()
        if fail_fast:
            t.join(5)
            assert sup.failure is not None and sup.failure.process == "decode-0"
        else:
            (tmp_path / "d0-sick").unlink()
            assert wait_for(lambda: "decode-0 healthy again" in out.getvalue(), 10), out.getvalue()
            assert sup.failure is None and t.is_alive()
            sup.request_stop(signal.SIGTERM)
            t.join(5)
    assert f"GET http://127.0.0.1:{p.process('decode-0').health.url.split(':')[2]}" in out.getvalue()


def test_sigkilled_launcher_leaves_no_orphans(tmp_path: Path) -> None:
    pa, pb = free_port(), free_port()
    procs = [
        {"name": "prefill-0", "role": "prefill", "argv": [sys.executable, CHILD, "--port", str(pa), "--grandchild",
                                                          str(tmp_path / "gc.pid")],
         "health_url": f"http://127.0.0.1:{pa}/health", "ports": [pa]},
        {"name": "decode-0", "role": "decode", "argv": [sys.executable, CHILD, "--port", str(pb), "--ignore-term",
                                                        "--grandchild", str(tmp_path / "gc2.pid")],
         "health_url": f"http://127.0.0.1:{pb}/health", "ports": [pb]},
    ]
    proc, run_dir = _launch(tmp_path, procs, grace_s=1.0)
    _wait_healthy(proc, run_dir, tmp_path)
    pids = [int(ln.split()[0]) for ln in (run_dir / "pids").read_text().splitlines()]
    pids += [read_pid(tmp_path / f) for f in ("gc.pid", "gc2.pid")]
    assert len(pids) == 4 and all(alive(pid) for pid in pids)
    proc.kill()  # SIGKILL: no handler, no teardown of its own
    assert proc.wait(5) == -signal.SIGKILL
    # the watchdog: SIGTERM to each group, then SIGKILL after the grace (decode-0 ignores SIGTERM)
    assert wait_for(lambda: not any(alive(pid) for pid in pids), 10), [pid for pid in pids if alive(pid)]
    # a process counted gone may still be closing its sockets for a moment on a loaded machine
    assert wait_for(lambda: bindable(pa) and bindable(pb), 5), (pa, pb)


# --- the first Ctrl-C after a failure or during teardown is not the second (issue 16) ---


def _failed_supervisor(tmp_path: Path, out: io.StringIO, grace_s: float = 60.0,
                       quitter_args: tuple = ()) -> tuple[Supervisor, int, int]:
    """A supervisor whose ``quitter`` exited (a failure) while ``stubborn`` (ignores
    SIGTERM) still runs: returns it with the two pids."""
    p = plan(child("stubborn", "--ignore-term", port=free_port()),
             child("quitter", "--exit-after", 0.3, *quitter_args, depends_on=("stubborn",)))
    sup = Supervisor(p, tmp_path, out=out, live=False, grace_s=grace_s, watchdog=False)
    assert sup.start_and_wait_healthy()
    assert sup.wait() == 1 and sup.failure is not None
    return sup, sup.pids()["stubborn"], sup.pids()["quitter"]


def test_first_signal_after_a_failure_does_not_kill(tmp_path: Path) -> None:
    out = io.StringIO()
    sup, stubborn, _ = _failed_supervisor(tmp_path, out)
    try:
        sup.request_stop(signal.SIGINT)  # the first Ctrl-C: the normal teardown follows
        time.sleep(0.3)
        assert alive(stubborn)  # before the fix: SIGKILLed here, as if it were the second
        sup.request_stop(signal.SIGINT)  # the second one kills at once
        assert wait_for(lambda: not alive(stubborn), 5)
    finally:
        sup.shutdown()
    assert "received SIGINT: stopping" in out.getvalue()
    assert sup.exit_code == 1  # the failure, not the signal, decides the exit code


def test_first_signal_during_teardown_waits_for_the_grace_period(tmp_path: Path) -> None:
    import threading

    p = plan(child("stubborn", "--ignore-term", "--grandchild", tmp_path / "gc.pid", port=free_port()))
    out = io.StringIO()
    sup = Supervisor(p, tmp_path, out=out, live=False, grace_s=60, watchdog=False)
    assert sup.start_and_wait_healthy()
    pids = [sup.pids()["stubborn"], read_pid(tmp_path / "gc.pid")]
    t = threading.Thread(target=sup.shutdown)  # e.g. `launch --once` tearing down
    t.start()
    try:
        assert wait_for(lambda: "stopping 1 process group" in out.getvalue(), 5)
        sup.request_stop(signal.SIGINT)
        t.join(0.3)
        assert t.is_alive() and all(alive(pid) for pid in pids)  # still in the 60 s grace
        sup.request_stop(signal.SIGINT)
        t.join(10)
        assert not t.is_alive()
    finally:
        sup.request_stop(signal.SIGINT)
        t.join(10)
    text = out.getvalue()
    assert "received SIGINT while stopping: waiting up to 60 s (send it again to kill at once)" in text
    assert "SIGKILL to every process group (a second signal)" in text
    assert [pid for pid in pids if alive(pid)] == []


def test_a_reaped_process_group_is_not_signalled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a leader is reaped its pid may be reused: its group is signalled only while
    members of it still run (here none do)."""
    sent: list[tuple[int, int]] = []
    real = os.killpg

    def killpg(pgid: int, sig: int) -> None:
        sent.append((pgid, sig))
        real(pgid, sig)

    out = io.StringIO()
    sup, stubborn, quitter = _failed_supervisor(tmp_path, out)
    monkeypatch.setattr(os, "killpg", killpg)
    try:
        sup.request_stop(signal.SIGINT)
        sup.request_stop(signal.SIGINT)
    finally:
        sup.shutdown()
    assert (stubborn, signal.SIGKILL) in sent
    assert [s for s in sent if s[0] == quitter] == []


def test_a_reaped_leaders_group_members_are_still_stopped(tmp_path: Path) -> None:
    out = io.StringIO()
    sup, stubborn, _ = _failed_supervisor(tmp_path, out, grace_s=0.5,
                                          quitter_args=("--grandchild", tmp_path / "qgc.pid"))
    orphan = read_pid(tmp_path / "qgc.pid")  # still in the quitter's process group
    assert alive(orphan)
    sup.shutdown()
    assert not alive(orphan) and not alive(stubborn)


# --- process tree discovery (psutil): daemons and grace-period children (issue 16) ------


def test_a_double_forked_daemon_is_stopped_too(tmp_path: Path) -> None:
    """The daemon's parent exits at once, so at teardown it is no descendant of any
    child: the supervisor must have seen it while supervising."""
    p = plan(child("prefill-0", "--daemon", tmp_path / "daemon.pid", "--exit-after", 2.5, port=free_port()))
    rc = run(p, tmp_path, out=io.StringIO(), live=False, grace_s=2, handle_signals=False)
    assert rc == 1  # prefill-0 exited
    daemon = read_pid(tmp_path / "daemon.pid")
    assert wait_for(lambda: not alive(daemon), 2), "the re-parented daemon outlived the launch"


def test_a_child_spawned_during_the_grace_period_is_stopped_too(tmp_path: Path) -> None:
    p = plan(child("prefill-0", "--spawn-on-term", tmp_path / "late.pid", port=free_port()))
    out = io.StringIO()
    with Supervisor(p, tmp_path, out=out, live=False, grace_s=5, watchdog=False) as sup:
        assert sup.start_and_wait_healthy()
        sup.request_stop(signal.SIGTERM)
    late = read_pid(tmp_path / "late.pid")
    assert wait_for(lambda: not alive(late), 2), "a process started during the grace period survived"


def test_sigkilled_launcher_also_stops_daemons_and_setsid_children(tmp_path: Path) -> None:
    """The orphan watchdog finds what killpg misses by the launch's OMNI_PD_LAUNCH_ID."""
    pa = free_port()
    procs = [{"name": "prefill-0", "role": "prefill",
              "argv": [sys.executable, CHILD, "--port", str(pa), "--daemon", str(tmp_path / "daemon.pid"),
                       "--escaped-grandchild", str(tmp_path / "esc.pid")],
              "health_url": f"http://127.0.0.1:{pa}/health", "ports": [pa]}]
    proc, run_dir = _launch(tmp_path, procs, grace_s=1.0)
    _wait_healthy(proc, run_dir, tmp_path)
    others = [read_pid(tmp_path / f) for f in ("daemon.pid", "esc.pid")]
    try:
        assert all(alive(pid) for pid in others)
        proc.kill()
        assert proc.wait(5) == -signal.SIGKILL
        assert wait_for(lambda: not any(alive(pid) for pid in others), 10), [pid for pid in others if alive(pid)]
    finally:
        for pid in others:
            with __import__("contextlib").suppress(OSError):
                os.kill(pid, signal.SIGKILL)
