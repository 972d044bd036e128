"""``launch`` preflight checks one by one on hand-built plans (issue 16): each check's
exact diagnostic, plans with TP > 1 / several engines per GPU / several ports per process,
and the branches tests/test_launch_plan.py (plans from real configs) never reaches.
Found by ``python bench/mutation.py omni_pd/launch/preflight.py``."""

from __future__ import annotations

import socket
import sys

import pytest

from omni_pd.diagnostics import Severity
from omni_pd.launch import preflight as pf
from omni_pd.launch.spec import LaunchPlan, PortUse, ProcessSpec

E, I = Severity.ERROR, Severity.INFO


def plan(*procs: ProcessSpec) -> LaunchPlan:
    return LaunchPlan(runtime="vllm", model="m", connector="NixlConnector", entrypoint="http://127.0.0.1:1",
                      config="c.yaml", processes=tuple(procs))


def proc(name: str, **kw) -> ProcessSpec:
    kw.setdefault("argv", (sys.executable, "-c", "pass"))
    return ProcessSpec(name=name, **kw)


def view(diags) -> list[tuple]:
    return [(d.code, d.severity, d.message, d.help) for d in diags]


@pytest.fixture
def listener():
    """A port something listens on (127.0.0.1)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    yield s.getsockname()[1]
    s.close()


# --- OPD960 ports ---------------------------------------------------------------------------------------

def test_bind_error_and_port_free(listener) -> None:
    e = pf.bind_error("127.0.0.1", listener)
    assert isinstance(e, OSError) and e.errno == 98
    assert pf.port_free("127.0.0.1", listener) == (False, "EADDRINUSE (Address already in use)")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    free = s.getsockname()[1]
    s.close()
    assert pf.bind_error("127.0.0.1", free) is None
    assert pf.port_free("127.0.0.1", free) == (True, "")


def test_bind_error_on_ipv6_loopback_uses_an_ipv6_socket() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    assert pf.bind_error("::1", 0) is None


def test_every_port_of_a_process_is_tried_not_only_the_first(listener) -> None:
    """A NIXL prefill with DP 2 binds two side-channel ports: the taken second one is found."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    first = s.getsockname()[1]
    s.close()
    p = proc("prefill", ports=(PortUse(first, "kv side channel"), PortUse(listener, "kv side channel")))
    assert view(pf.check_ports(plan(p))) == [(
        "OPD960", E, f"port {listener} on 127.0.0.1 (prefill kv side channel) cannot be bound: "
                     "EADDRINUSE (Address already in use)",
        f"stop what holds it (`ss -ltnp 'sport = :{listener}'`) or move it: `omni-pd expand --port-base N` "
        "(connector ports)")]


def test_a_taken_http_port_names_the_launch_options(listener) -> None:
    [d] = pf.check_ports(plan(proc("router", ports=(PortUse(listener, "http"),))))
    assert d.help == f"stop what holds it (`ss -ltnp 'sport = :{listener}'`) or move it: `--port`/`--engine-port-base`"


def test_a_port_planned_for_two_processes_is_reported_once_per_extra_user() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    a = proc("prefill", ports=(PortUse(port, "http"),))
    b = proc("decode", ports=(PortUse(port, "kv side channel"),))
    c = proc("router", ports=(PortUse(port, "http"),))
    assert view(pf.check_ports(plan(a, b, c))) == [
        ("OPD960", E, f"port {port} on 127.0.0.1 is planned for both prefill (http) and decode (kv side channel)",
         "give each process its own port (see `omni-pd launch --help`)"),
        ("OPD960", E, f"port {port} on 127.0.0.1 is planned for both prefill (http) and router (http)",
         "give each process its own port (see `omni-pd launch --help`)")]


def test_one_process_listing_a_port_twice_and_other_hosts_are_not_conflicts() -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    a = proc("prefill", ports=(PortUse(port, "http"), PortUse(port, "metrics")))
    assert pf.check_ports(plan(a)) == []


def test_planned_clashes_are_pure_and_cover_one_process_http_and_side_channel() -> None:
    # no socket is touched: 8100 need not be free for the plan-internal check
    a = proc("prefill-0", ports=(PortUse(8100, "http"), PortUse(8100, "NIXL side channel")))
    b = proc("decode-0", ports=(PortUse(8200, "http"), PortUse(8000, "NIXL side channel")))
    c = proc("router", ports=(PortUse(8000, "http"),))
    assert view(pf.plan_checks(plan(a, b, c))) == [
        ("OPD960", E, "port 8100 on 127.0.0.1 is planned for both prefill-0 (http) and prefill-0 (NIXL side channel)",
         "give each process its own port (see `omni-pd launch --help`)"),
        ("OPD960", E, "port 8000 on 127.0.0.1 is planned for both decode-0 (NIXL side channel) and router (http)",
         "give each process its own port (see `omni-pd launch --help`)")]


# --- OPD961 executables ----------------------------------------------------------------------------------

def test_missing_and_non_executable_argv0(tmp_path) -> None:
    noexec = tmp_path / "vllm"
    noexec.write_text("#!/bin/sh\n")
    noexec.chmod(0o644)
    ok = tmp_path / "ok"
    ok.write_text("#!/bin/sh\n")
    ok.chmod(0o755)
    procs = [proc("a", argv=("no-such-exe-omni-pd", "serve")), proc("b", argv=(str(noexec),)),
             proc("c", argv=(str(ok),)), proc("d", argv=("sh", "-c", "true"))]
    help_ = "install vLLM (`pip install vllm`) or pass its path with `--vllm PATH`"
    assert view(pf.check_executables(plan(*procs))) == [
        ("OPD961", E, "a: executable `no-such-exe-omni-pd` not found", help_),
        ("OPD961", E, f"b: executable `{noexec}` not found", help_)]


# --- OPD962 modules ----------------------------------------------------------------------------------------

def test_missing_modules_per_interpreter_with_pip_names() -> None:
    py = sys.executable
    p1 = proc("prefill", python=py, modules=("json", "mooncake.engine", "nixl"))
    p2 = proc("decode", python=py, modules=("vllm_omni", "no_such_mod_opd", "no_such_pkg_opd.engine"))
    p3 = proc("router", python=None, modules=("not_checked_without_python",))
    p4 = proc("x", python=py, modules=())
    got = view(pf.check_modules(plan(p1, p2, p3, p4)))
    want = {"mooncake.engine": "mooncake-transfer-engine", "nixl": "nixl", "vllm_omni": "vllm-omni",
            "no_such_mod_opd": "no_such_mod_opd", "no_such_pkg_opd.engine": "no_such_pkg_opd.engine"}
    import importlib.util

    def gone(m: str) -> bool:
        try:
            return importlib.util.find_spec(m) is None
        except ImportError:  # a dotted name whose parent is missing
            return True

    missing = sorted(m for m in want if gone(m))
    assert got == [("OPD962", E, f"module `{m}` is not importable by {py}", f"`{py} -m pip install {want[m]}`")
                   for m in missing]
    assert "no_such_mod_opd" in missing and "no_such_pkg_opd.engine" in missing


def test_an_interpreter_that_is_not_there(tmp_path) -> None:
    py = str(tmp_path / "bin" / "python")
    assert view(pf.check_modules(plan(proc("e", python=py, modules=("vllm", "nixl"))))) == [
        ("OPD962", E, f"interpreter `{py}` not found, so nixl, vllm cannot be checked",
         "pass the vLLM environment's python with `--python PATH`")]


def test_an_interpreter_that_hangs_is_an_info(tmp_path) -> None:
    py = tmp_path / "python"
    py.write_text("#!/bin/sh\nexec sleep 30\n")
    py.chmod(0o755)
    [d] = pf.check_modules(plan(proc("e", python=str(py), modules=("vllm",))), timeout_s=0.3)
    assert (d.code, d.severity) == ("OPD965", I)
    assert d.message.startswith(f"could not run {py}: Command '[") and "timed out after 0.3 seconds" in d.message


# --- OPD963/964/965 devices ------------------------------------------------------------------------------

GIB = 1024


def test_memory_is_summed_per_gpu_over_every_engine_on_it() -> None:
    """Two engines on GPU 0 (0.5 + 0.4 of 80 GiB = 72 GiB) with 70 GiB free: over; TP 2
    prefill on GPUs 0,1 counts on each."""
    inv = [(0, 80 * GIB, 70 * GIB), (1, 80 * GIB, 79 * GIB)]
    a = proc("prefill", devices="0,1", memory_fraction=0.5)
    b = proc("decode", devices="0", memory_fraction=0.4)
    assert view(pf.check_devices(plan(a, b), "cuda", inv)) == [
        ("OPD964", E, "GPU 0: engines ask 72.0 GiB, 70.0 GiB of 80.0 GiB is free",
         "lower gpu_memory_utilization or free the GPU")]
    assert pf.check_devices(plan(a), "cuda", inv) == []


def test_a_gpu_that_is_not_there_and_odd_device_tokens() -> None:
    inv = [(0, 1000, 1000), (1, 1000, 1000)]
    a = proc("decode", devices="1,3", memory_fraction=0.5)
    b = proc("x", devices="cpu", memory_fraction=0.5)
    assert view(pf.check_devices(plan(a, b), "cuda", inv)) == [
        ("OPD963", E, "decode is given GPU 3, this machine has [0, 1]",
         "change the stage's `devices:` (re-run `omni-pd expand --prefill-devices ...`)")]


def test_memory_exactly_free_is_enough() -> None:
    inv = [(0, 1000, 500)]
    assert pf.check_devices(plan(proc("a", devices="0", memory_fraction=0.5)), "cuda", inv) == []
    assert [d.code for d in pf.check_devices(plan(proc("a", devices="0", memory_fraction=0.501)), "cuda", inv)] == \
        ["OPD964"]


def test_devices_are_checked_only_on_cuda_and_only_for_processes_with_devices(monkeypatch) -> None:
    monkeypatch.setattr(pf, "gpu_inventory", lambda: None)
    a = proc("a", devices="0")
    assert pf.check_devices(plan(a), "cpu") == []
    assert pf.check_devices(plan(proc("r")), "cuda") == []
    assert view(pf.check_devices(plan(a), "cuda")) == [
        ("OPD965", I, "nvidia-smi not found: devices and device memory not checked", None)]


def test_gpu_inventory_parses_nvidia_smi(monkeypatch, tmp_path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho \"$@\" > " + str(tmp_path / "args") + "\n"
                   "printf '0, 81559, 80000\\nnot a row\\n1, 81559, 1234\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert pf.gpu_inventory() == [(0, 81559, 80000), (1, 81559, 1234)]
    assert (tmp_path / "args").read_text().split() == [
        "--query-gpu=index,memory.total,memory.free", "--format=csv,noheader,nounits"]


def test_gpu_inventory_without_nvidia_smi(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert pf.gpu_inventory() is None


# --- OPD967 directories -----------------------------------------------------------------------------------

def test_dirs_that_are_files_or_under_a_file(tmp_path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    ok_new = tmp_path / "new" / "deeper"
    a = proc("encoder", writable_dirs=(str(f), str(f / "sub"), str(ok_new), str(tmp_path)))
    b = proc("prefill", writable_dirs=(str(f),))
    help_ = "pick a writable directory both the encoder and prefill see (expand --ec-storage-path)"
    assert view(pf.check_dirs(plan(a, b))) == [
        ("OPD967", E, f"encoder must write encoder outputs to {f}: {f} is not a directory", help_),
        ("OPD967", E, f"encoder must write encoder outputs to {f / 'sub'}: {f} is not a directory", help_)]
    assert not ok_new.exists()  # probed, not created


def test_preflight_runs_every_check_in_order(listener, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(pf, "gpu_inventory", lambda: None)
    f = tmp_path / "file"
    f.write_text("x")
    p = proc("prefill", argv=("no-such-exe-omni-pd",), python=sys.executable, modules=("no_such_mod_opd",),
             devices="0", ports=(PortUse(listener, "http"),), writable_dirs=(str(f),))
    assert [d.code for d in pf.preflight(plan(p), "cuda")] == ["OPD961", "OPD962", "OPD965", "OPD960", "OPD967"]


def test_pip_names_and_every_interpreter_checked(tmp_path) -> None:
    """A stand-in interpreter that reports every module it is asked about as missing; a
    missing interpreter first does not stop the check of the next one."""
    py = tmp_path / "python"
    py.write_text('#!/bin/sh\nshift 2\necho "$@"\n')
    py.chmod(0o755)
    gone = str(tmp_path / "gone" / "python")
    got = view(pf.check_modules(plan(proc("a", python=gone, modules=("vllm",)),
                                     proc("b", python=str(py), modules=("omni_pd", "vllm_omni", "mooncake.engine")))))
    assert [m for _, _, m, _ in got] == [
        f"interpreter `{gone}` not found, so vllm cannot be checked",
        f"module `mooncake.engine` is not importable by {py}", f"module `omni_pd` is not importable by {py}",
        f"module `vllm_omni` is not importable by {py}"]
    assert [h for *_, h in got][1:] == [f"`{py} -m pip install mooncake-transfer-engine`",
                                        f"`{py} -m pip install omni-pd`", f"`{py} -m pip install vllm-omni`"]


def test_a_missing_gpu_does_not_stop_the_memory_sum_of_the_next_one() -> None:
    inv = [(0, 1000, 100), (1, 1000, 100)]
    got = view(pf.check_devices(plan(proc("a", devices="3,0", memory_fraction=0.5),
                                     proc("b", devices="x,1", memory_fraction=0.5)), "cuda", inv))
    assert [m for _, _, m, _ in got] == ["a is given GPU 3, this machine has [0, 1]",
                                         "GPU 0: engines ask 0.5 GiB, 0.1 GiB of 1.0 GiB is free",
                                         "GPU 1: engines ask 0.5 GiB, 0.1 GiB of 1.0 GiB is free"]


def test_pip_package_of_a_transport_module_and_its_top_package() -> None:
    assert [pf.pip_package(m) for m in ("mooncake.engine", "mooncake", "nixl", "vllm_omni", "omni_pd", "other")] == [
        "mooncake-transfer-engine", "mooncake-transfer-engine", "nixl", "vllm-omni", "omni-pd", "other"]


def test_inventory_read_from_nvidia_smi_when_not_given(monkeypatch) -> None:
    monkeypatch.setattr(pf, "gpu_inventory", lambda: [(0, 1000, 100)])
    assert [d.code for d in pf.check_devices(plan(proc("a", devices="0", memory_fraction=0.5)), "cuda")] == ["OPD964"]


def test_every_directory_is_checked_after_a_good_or_repeated_one(tmp_path) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    a = proc("encoder", writable_dirs=(str(tmp_path), str(f)))
    b = proc("prefill", writable_dirs=(str(f), str(f / "x")))
    assert [d.message.split(":")[0] for d in pf.check_dirs(plan(a, b))] == [
        f"encoder must write encoder outputs to {f}", f"prefill must write encoder outputs to {f / 'x'}"]


# --- data parallel (issue 16) -------------------------------------------------------------------------------

DP_RPC = "data-parallel RPC (--data-parallel-rpc-port)"


def test_a_taken_data_parallel_rpc_port_names_the_option_that_moves_it(listener) -> None:
    [d] = pf.check_ports(plan(proc("decode-0", ports=(PortUse(listener, DP_RPC),))))
    assert d.message == (f"port {listener} on 127.0.0.1 (decode-0 {DP_RPC}) cannot be bound: "
                         "EADDRINUSE (Address already in use)")
    assert d.help == (f"stop what holds it (`ss -ltnp 'sport = :{listener}'`) or move it: `--engine-port-base` (a "
                      "data_parallel_size > 1 engine's data-parallel RPC port is its HTTP port + 300) or the stage's "
                      "`data_parallel_rpc_port`")


_HTTP = {"prefill-0": 8100, "prefill-1": 8101, "decode-0": 8200}


def _dp(name: str, vllm_port: str | None, host: str = "127.0.0.1", dp: bool = True) -> ProcessSpec:
    http = _HTTP[name]
    return proc(name, env={} if vllm_port is None else {"VLLM_PORT": vllm_port},
                ports=(PortUse(http, "http"),) + ((PortUse(http + 300, DP_RPC, host),) if dp else ()))


@pytest.mark.parametrize("a,b,clash", [
    ("30000", "30000", True), ("30000", "30004", True), ("30004", "30000", True),
    ("30000", "30005", False), ("30005", "30000", False), ("30000", None, False), ("x", "x", False),
])
def test_dp_engines_drawing_overlapping_vllm_port_ranges(a, b, clash) -> None:
    diags = pf.shared_vllm_port(plan(_dp("prefill-0", a), _dp("decode-0", b)))
    if not clash:
        assert diags == []
        return
    assert view(diags) == [(
        "OPD960", E, f"prefill-0 (VLLM_PORT={a}) and decode-0 (VLLM_PORT={b}) have data_parallel_size > 1 on "
                     "127.0.0.1: vLLM draws each one's data-parallel ports from VLLM_PORT upward (5 of them) before "
                     "binding them, so both pick the same ports",
        "leave VLLM_PORT unset for these engines (vLLM then asks the kernel for free ports), or set it per stage "
        "(the stage's env) at least 5 apart")]


def test_vllm_port_draws_only_count_dp_engines_on_one_host() -> None:
    assert pf.shared_vllm_port(plan(_dp("prefill-0", "30000"), _dp("decode-0", "30000", dp=False))) == []
    assert pf.shared_vllm_port(plan(_dp("prefill-0", "30000"), _dp("decode-0", "30000", host="10.0.0.2"))) == []
    three = pf.shared_vllm_port(plan(_dp("prefill-0", "30000"), _dp("prefill-1", "30010"), _dp("decode-0", "30002")))
    assert [d.message.split(" have ")[0] for d in three] == ["prefill-0 (VLLM_PORT=30000) and decode-0 (VLLM_PORT=30002)"]
    # plan_checks and check_ports run it
    assert view(pf.plan_checks(plan(_dp("prefill-0", "30000"), _dp("decode-0", "30000")))) == \
        view(pf.shared_vllm_port(plan(_dp("prefill-0", "30000"), _dp("decode-0", "30000"))))
    assert [d.message for d in pf.check_ports(plan(_dp("prefill-0", "30000"), _dp("decode-0", "30000")))
            if "VLLM_PORT" in d.message] != []

# --- branches the mutation run found unpinned (bench/MUTATION.md, launch/preflight.py): a second clash or
# busy port after a first, a process between two DP engines, a second interpreter after one that hangs,
# the not-writable directory messages (the tests run as root, for whom os.access always grants W_OK, so
# the refusal is simulated) ------------------------------------------------------------------------------

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
