"""Preflight branches the mutation run (bench/MUTATION.md, launch/preflight.py) found unpinned:
a second clash or busy port after a first one, a process skipped between two DP engines,
a second interpreter after one that hangs, and the not-writable directory messages (the
tests run as root, for whom ``os.access`` always grants W_OK, so the refusal is simulated)."""

from __future__ import annotations

import socket
import sys

import pytest

from omni_pd.diagnostics import Severity
from omni_pd.launch import preflight as pf
from omni_pd.launch.plan import DP_RPC
from omni_pd.launch.spec import LaunchPlan, PortUse, ProcessSpec

E, I = Severity.ERROR, Severity.INFO


def plan(*procs: ProcessSpec) -> LaunchPlan:
    return LaunchPlan(runtime="vllm", model="m", connector="NixlConnector", entrypoint="http://127.0.0.1:1",
                      config="c.yaml", processes=tuple(procs))


def proc(name: str, **kw) -> ProcessSpec:
    kw.setdefault("argv", (sys.executable, "-c", "pass"))
    return ProcessSpec(name=name, **kw)


@pytest.fixture
def held():
    """Two ports something listens on (127.0.0.1)."""
    socks = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        socks.append(s)
    yield [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()


def test_every_clash_of_one_process_is_reported_not_only_the_first() -> None:
    a = proc("prefill-0", ports=(PortUse(8100, "http"), PortUse(5600, "NIXL side channel")))
    b = proc("decode-0", ports=(PortUse(8100, "http"), PortUse(5600, "NIXL side channel")))
    assert [d.message for d in pf.planned_port_clashes(plan(a, b))] == [
        "port 8100 on 127.0.0.1 is planned for both prefill-0 (http) and decode-0 (http)",
        "port 5600 on 127.0.0.1 is planned for both prefill-0 (NIXL side channel) and decode-0 (NIXL side channel)"]


def test_a_process_without_data_parallel_between_two_dp_engines_does_not_end_the_check() -> None:
    def dp(name: str, http: int, vllm_port: str) -> ProcessSpec:
        return proc(name, env={"VLLM_PORT": vllm_port},
                    ports=(PortUse(http, "http"), PortUse(http + 300, DP_RPC)))

    router = proc("router", ports=(PortUse(8000, "http"),))
    [d] = pf.shared_vllm_port(plan(dp("prefill-0", 8100, "30000"), router, dp("decode-0", 8200, "30001")))
    assert d.message.startswith("prefill-0 (VLLM_PORT=30000) and decode-0 (VLLM_PORT=30001) have data_parallel_size")


def test_a_busy_port_after_a_repeated_one_is_still_tried(held) -> None:
    busy_a, busy_b = held
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    free = s.getsockname()[1]
    s.close()
    # decode repeats prefill's port (a plan clash, reported by plan_checks), then lists a busy one
    a = proc("prefill", ports=(PortUse(free, "kv side channel"),))
    b = proc("decode", ports=(PortUse(free, "kv side channel"), PortUse(busy_a, "kv side channel")))
    bind = [d.message for d in pf.check_ports(plan(a, b)) if "cannot be bound" in d.message]
    assert bind == [f"port {busy_a} on 127.0.0.1 (decode kv side channel) cannot be bound: "
                    "EADDRINUSE (Address already in use)"]


def test_a_busy_port_planned_twice_is_tried_once(held) -> None:
    busy = held[0]
    a = proc("prefill", ports=(PortUse(busy, "http"),))
    b = proc("decode", ports=(PortUse(busy, "http"),))
    bind = [d.message for d in pf.check_ports(plan(a, b)) if "cannot be bound" in d.message]
    assert bind == [f"port {busy} on 127.0.0.1 (prefill http) cannot be bound: EADDRINUSE (Address already in use)"]


def test_an_interpreter_after_one_that_hangs_is_still_checked(tmp_path) -> None:
    hung = tmp_path / "python"  # checked first: interpreters are checked in plan order
    hung.write_text("#!/bin/sh\nexec sleep 30\n")
    hung.chmod(0o755)
    diags = pf.check_modules(plan(proc("e", python=str(hung), modules=("vllm",)),
                                  proc("p", python=sys.executable, modules=("omni_pd_no_such_module",))),
                             timeout_s=0.3)
    assert [(d.code, d.severity) for d in diags] == [("OPD965", I), ("OPD962", E)]
    assert diags[1].message == f"module `omni_pd_no_such_module` is not importable by {sys.executable}"


def _no_write(monkeypatch) -> None:
    """``os.access`` as a non-root user sees a read-only directory: W_OK refused, the rest granted."""
    real = pf.os.access
    monkeypatch.setattr(pf.os, "access", lambda p, mode: False if mode & pf.os.W_OK else real(p, mode))


def test_an_existing_directory_that_is_not_writable(tmp_path, monkeypatch) -> None:
    _no_write(monkeypatch)
    d = tmp_path / "ec"
    d.mkdir()
    [diag] = pf.check_dirs(plan(proc("encoder", writable_dirs=(str(d),))))
    assert (diag.code, diag.severity, diag.message) == (
        "OPD967", E, f"encoder must write encoder outputs to {d}: {d} is not writable by this user")
    assert diag.help == "pick a writable directory both the encoder and prefill see (expand --ec-storage-path)"


def test_a_missing_directory_under_a_parent_that_is_not_writable(tmp_path, monkeypatch) -> None:
    _no_write(monkeypatch)
    d = tmp_path / "ec" / "cache"
    [diag] = pf.check_dirs(plan(proc("encoder", writable_dirs=(str(d),))))
    assert diag.message == (f"encoder must write encoder outputs to {d}: it does not exist and {tmp_path} is not "
                            "writable, so it cannot be created")
