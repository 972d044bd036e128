"""Every benchmark script in bench/ still runs (issue 38): each in its cheap mode
(``OMNI_PD_BENCH_QUICK=1``: one round, the smallest input, nothing written to
bench/RESULTS.md), so a change that breaks a figure script is seen here rather than
the next time someone reruns the figure. A script that needs a heavy environment (the
vllm-omni oracle venv, the CPU e2e venv, a peer tool) skips with the reason it prints
(``SKIP: ...``, exit 77) unless that environment's variable is set, as the other heavy
tests do; the engine-starting ones (the CPU e2e venv) only with ``OMNI_PD_BENCH_ENGINES=1``,
since this module runs beside the engine tests. Numbers are never asserted: the machine is shared."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
#: bench/ modules that other scripts import and that have no command line of their own
LIBRARIES = {"common.py", "synth.py"}
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if p.name not in LIBRARIES)
#: files a benchmark writes in its full mode and must leave alone in its cheap mode
WRITTEN = ("RESULTS.md", "results.json", "router_load.json", "MUTATION.md")
SKIP_STATUS = 77


def _stamp() -> dict[str, tuple[int, int] | None]:
    out = {}
    for name in WRITTEN:
        p = BENCH / name
        out[name] = (p.stat().st_mtime_ns, p.stat().st_size) if p.exists() else None
    return out


def test_every_script_is_covered() -> None:
    assert "fig1_verdict.py" in SCRIPTS and "coldstart_peers.py" in SCRIPTS
    assert all((BENCH / lib).is_file() for lib in LIBRARIES)


@pytest.mark.parametrize("script", SCRIPTS)
def test_cheap_mode_runs(script: str) -> None:
    python = sys.executable
    if script == "oracle_verdict.py" and os.environ.get("OMNI_PD_ORACLE_PYTHON"):
        python = os.environ["OMNI_PD_ORACLE_PYTHON"]  # it runs inside the oracle venv
    env = {k: v for k, v in os.environ.items() if k not in ("OMNI_PD_DEBUG", "PYTHONPROFILEIMPORTTIME")}
    env["OMNI_PD_BENCH_QUICK"] = "1"
    if os.environ.get("OMNI_PD_BENCH_ENGINES") != "1":
        # the scripts that start vLLM / vllm-omni engines skip here: this module runs on the worker beside
        # the engine tests (tests/conftest.py work_unit), and a second full omni pipeline does not fit
        # beside theirs (nor in this test's timeout); OMNI_PD_BENCH_ENGINES=1 runs them too
        env.pop("OMNI_PD_E2E_PYTHON", None)
    before = _stamp()
    r = subprocess.run([python, str(BENCH / script)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert _stamp() == before, f"{script} wrote a results file in its cheap mode"
    if r.returncode == SKIP_STATUS:
        reason = next((ln[len("SKIP: "):] for ln in reversed(r.stdout.splitlines()) if ln.startswith("SKIP: ")), "")
        assert reason, f"{script} exited {SKIP_STATUS} without a SKIP: line"
        pytest.skip(f"bench/{script}: {reason}")
    assert r.returncode == 0, f"{script} exited {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-3000:]}"
