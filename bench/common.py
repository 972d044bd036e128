"""Shared helpers of the benchmarks: timing subprocesses side by side, statistics,
machine facts. Standard library only (the benchmarks add no dependency).

Timing discipline (the machine may be noisy): commands compared with each other run
alternately in one loop, the order flipped every round (A B, B A, A B, ...), after
unmeasured warm-up runs; a figure is the median over rounds, and a ratio is the
median of the per-round ratios (each round's A over the same round's B), so a slow
stretch of the machine hits both sides of a ratio.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
GOLDEN = ROOT / "tests" / "golden" / "qwen3_omni_moe_pd.yaml"


def child_env() -> dict[str, str]:
    """The environment of every timed child: ours without ``PYTHONDONTWRITEBYTECODE``,
    so imports use (and warm-up writes) ``__pycache__`` bytecode as on a normal
    install, for both sides of every comparison."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    env.pop("OMNI_PD_DEBUG", None)
    return env


@dataclass
class Run:
    """One timed child process: wall seconds, exit status, peak RSS (KiB), CPU seconds
    (user + system, from the child's rusage: less sensitive to a busy machine than wall
    time, which also counts waiting for a core)."""

    seconds: float
    rc: int
    maxrss_kib: int
    cpu: float = 0.0
    stdout: str = ""
    stderr: str = ""


def run_once(argv: list[str], *, env: dict[str, str] | None = None, capture: bool = False,
             cwd: Path = ROOT, timeout: float | None = None) -> Run:
    """Run ``argv`` once; wall time from just before spawn to reaping (what a user
    waits), peak RSS from the child's own rusage (``wait4``)."""
    env = env or child_env()
    if capture:  # not for timing: communicate() reaps the child, so no rusage
        t0 = time.perf_counter()
        p = subprocess.run(argv, capture_output=True, env=env, cwd=cwd, text=True, timeout=timeout)
        return Run(time.perf_counter() - t0, p.returncode, 0, 0.0, p.stdout, p.stderr)
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd)
    _, status, ru = os.wait4(proc.pid, 0)
    dt = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here; Popen must not wait again
    return Run(dt, proc.returncode, int(ru.ru_maxrss), ru.ru_utime + ru.ru_stime)


@dataclass
class Stats:
    median: float
    min: float
    max: float
    n: int

    @classmethod
    def of(cls, xs: list[float]) -> "Stats":
        return cls(statistics.median(xs), min(xs), max(xs), len(xs))

    def fmt(self, unit: str = "s", scale: float = 1.0, digits: int = 3) -> str:
        f = f"{{:.{digits}f}}"
        return f"{f.format(self.median * scale)} {unit} (min {f.format(self.min * scale)}, max {f.format(self.max * scale)}, n={self.n})"

    def as_dict(self) -> dict:
        return {"median": self.median, "min": self.min, "max": self.max, "n": self.n}


@dataclass
class ABResult:
    """Times per command name and the per-round ratios ``name / baseline``."""

    times: dict[str, list[float]] = field(default_factory=dict)
    rss: dict[str, list[int]] = field(default_factory=dict)
    rcs: dict[str, list[int]] = field(default_factory=dict)
    cpu: dict[str, list[float]] = field(default_factory=dict)

    def stats(self, name: str, *, cpu: bool = False) -> Stats:
        return Stats.of((self.cpu if cpu else self.times)[name])

    def ratios(self, name: str, baseline: str, *, cpu: bool = False) -> list[float]:
        t = self.cpu if cpu else self.times
        return [a / b for a, b in zip(t[name], t[baseline]) if b > 0]

    def ratio(self, name: str, baseline: str, *, cpu: bool = False) -> Stats:
        return Stats.of(self.ratios(name, baseline, cpu=cpu))


def alternate(commands: dict[str, list[str]], rounds: int, *, warmup: int = 1,
              label: str = "", progress: bool = True) -> ABResult:
    """Run every command of ``commands`` once per round, alternating the order
    (round 0: given order, round 1: reversed, ...), after ``warmup`` unmeasured
    runs of each."""
    names = list(commands)
    env = child_env()
    for _ in range(warmup):
        for n in names:
            run_once(commands[n], env=env)
    res = ABResult({n: [] for n in names}, {n: [] for n in names}, {n: [] for n in names}, {n: [] for n in names})
    for r in range(rounds):
        order = names if r % 2 == 0 else list(reversed(names))
        for n in order:
            run = run_once(commands[n], env=env)
            res.times[n].append(run.seconds)
            res.rss[n].append(run.maxrss_kib)
            res.rcs[n].append(run.rc)
            res.cpu[n].append(run.cpu)
        if progress:
            line = "  ".join(f"{n} {res.times[n][-1]:.3f}s" for n in names)
            print(f"  {label}round {r + 1}/{rounds}: {line}", flush=True)
    return res


# --- machine facts --------------------------------------------------------------------

def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def machine() -> dict:
    """CPU model, cores, memory, OS, Python, load, date and the commit measured."""
    head = _git("rev-parse", "--short", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    mem = _mem_total_gib()
    return {
        "cpu": _cpu_model(),
        "cores": cores,
        "memory_gib": round(mem, 1) if mem else None,
        "os": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()} ({sys.executable})",
        "loadavg": [round(x, 2) for x in load] if load else None,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": (head + (" + uncommitted changes" if dirty else "")) if head else None,
    }


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# --- locating the two sides -----------------------------------------------------------

def omni_pd_command() -> list[str]:
    """How a user starts omni-pd with this interpreter: the console script installed
    next to it (not a pyenv shim or wrapper, which would add its own start-up), else
    the same entry point through ``python -c``."""
    exe = Path(sys.executable).parent / "omni-pd"
    if exe.is_file() and os.access(exe, os.X_OK):
        return [str(exe)]
    return [sys.executable, "-c", "import sys; from omni_pd.cli import main; sys.exit(main())"]


def oracle_python(explicit: str | None = None) -> str | None:
    """The vllm-omni 0.30.0 oracle venv's python: ``--oracle-python``, then
    ``$OMNI_PD_ORACLE_PYTHON``, then ``.cache/oracle/venv030`` (built by
    ``bash .ci/oracle_venv.sh``). None when none exists."""
    for c in (explicit, os.environ.get("OMNI_PD_ORACLE_PYTHON"),
              str(ROOT / ".cache" / "oracle" / "venv030" / "bin" / "python")):
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


def fmt_ms(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 10 else f"{s:.1f} s"


def replace_section(results: Path, begin: str, end: str, section: str) -> None:
    """Put ``section`` (which starts with ``begin`` and ends with ``end``) into the
    Markdown file ``results`` in place of the text between those markers, or at its end
    when the markers are not there yet; nothing when the file does not exist."""
    import re

    if not results.is_file():
        return
    text = results.read_text(encoding="utf-8")
    if begin in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: section, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    results.write_text(text, encoding="utf-8")


# --- the cheap mode every script has (tests/test_bench_quick.py) ----------------------

#: set to 1 for every script's cheap mode (as ``--quick``): one round, the smallest input,
#: nothing written to bench/RESULTS.md
QUICK_ENV = "OMNI_PD_BENCH_QUICK"
#: exit status of a script that cannot run here (a missing venv or tool); its last line
#: on stdout is ``SKIP: <reason>`` (tests/test_bench_quick.py turns it into a skip)
SKIP_STATUS = 77


def quick_mode(flag: bool = False) -> bool:
    """True for the cheap mode: ``--quick`` given (``flag``) or ``$OMNI_PD_BENCH_QUICK`` set."""
    return flag or os.environ.get(QUICK_ENV, "") not in ("", "0")


def skip(reason: str) -> None:
    """Stop a script that cannot run here: ``SKIP: reason`` on stdout, exit :data:`SKIP_STATUS`."""
    print(f"SKIP: {reason}", flush=True)
    sys.exit(SKIP_STATUS)


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now (the cheap modes run beside other runs of the
    same script, so they do not use the fixed default ports)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
