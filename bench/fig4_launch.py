"""Figure 4: launcher overhead of `omni-pd launch` in the CPU end-to-end setup.

    python bench/fig4_launch.py [--rounds 3] [--e2e-python PATH]

Each round runs ``omni-pd launch pd.yaml --once`` (1P1D NixlConnector, the tiny model of
tests/e2e/make_tiny_model.py, ``--platform cpu``) as a user would, and measures:

* ``launch_s``: wall time from spawning ``omni-pd launch`` to its "all ... healthy"
  line (CLI start, validation, plan, preflight, both engines, the router);
* ``engine_s``: the slowest engine's own time from its start to ``/health`` 200, from
  ``<run-dir>/timings.json`` (the supervisor's record).

The figure is ``launch_s / engine_s`` (median over rounds); target <= 1.1x, i.e. the
engines start concurrently and everything the launcher adds (its own start, validation,
preflight, the router after the engines) stays within a tenth of the slowest engine.
The result replaces the figure-4 section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, child_env, loadavg, machine, omni_pd_command, quick_mode, skip  # noqa: E402

RESULTS = ROOT / "bench" / "RESULTS.md"
BEGIN, END = "<!-- figure 4: begin -->", "<!-- figure 4: end -->"
TARGET = 1.1


#: why the cheap mode of an e2e script does not run where the e2e venv is not given
E2E_SKIP = "OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)"


def e2e_python(explicit: str | None, quick: bool = False) -> str:
    """The e2e venv's python: ``--e2e-python``, ``$OMNI_PD_E2E_PYTHON``, else the one
    .ci/e2e_venv.sh builds (in the cheap mode: skip instead of building it)."""
    if quick and not explicit and not os.environ.get("OMNI_PD_E2E_PYTHON"):
        skip(E2E_SKIP)
    if explicit:
        return explicit
    if os.environ.get("OMNI_PD_E2E_PYTHON"):
        return os.environ["OMNI_PD_E2E_PYTHON"]
    return subprocess.run(["bash", str(ROOT / ".ci" / "e2e_venv.sh")], check=True, capture_output=True,
                          text=True).stdout.strip()


def one_round(py: str, model: Path, pd: Path, work: Path, i: int) -> dict:
    vllm = str(Path(py).parent / "vllm")
    run_dir = work / f"run{i}"
    argv = omni_pd_command() + ["launch", str(pd), "--model", str(model), "--served-model-name", "tiny",
                                "--platform", "cpu", "--vllm", vllm, "--port", "18900",
                                "--engine-port-base", "18910", "--run-dir", str(run_dir), "--once"]
    for k, v in {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                 "VLLM_CACHE_ROOT": str(work / "vllm-cache"), "VLLM_PLUGINS": ""}.items():
        argv += ["--env", f"{k}={v}"]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
    launch_s = None
    tail: list[str] = []
    for line in proc.stdout:  # type: ignore[union-attr]
        tail = (tail + [line.rstrip()])[-30:]
        if launch_s is None and re.search(r"all \d+ process(es)? healthy after", line):
            launch_s = time.monotonic() - t0
    rc = proc.wait()
    if launch_s is None or rc != 0:
        raise RuntimeError(f"launch failed (exit {rc}):\n" + "\n".join(tail))
    t = json.loads((run_dir / "timings.json").read_text())
    engines = {k: v for k, v in t["ready_s"].items() if k != "router"}
    return {"launch_s": launch_s, "engine_s": max(engines.values()), "engines": engines,
            "router_s": t["ready_s"].get("router"), "ratio": launch_s / max(engines.values())}


def render(rounds: list[dict], mach: dict, load_end, argv: list[str]) -> str:
    ratio = statistics.median(r["ratio"] for r in rounds)
    ok = "meets" if ratio <= TARGET else "**misses**"
    rows = ["| round | `omni-pd launch` to all healthy | slowest engine's own start | router | ratio |",
            "|---|---|---|---|---|"]
    for i, r in enumerate(rounds, 1):
        rows.append(f"| {i} | {r['launch_s']:.1f} s | {r['engine_s']:.1f} s | {r['router_s']:.2f} s | "
                    f"{r['ratio']:.3f}x |")
    return "\n".join([
        BEGIN, "## Figure 4: launcher overhead", "",
        f"* Command: `python bench/{Path(__file__).name} {' '.join(argv)}`".rstrip() + "",
        f"* Machine: {mach['cpu']}, {mach['cores']} cores, {mach['memory_gib']} GiB; {mach['date']}; "
        f"commit {mach['commit']}; load at start {mach['loadavg']}, at end {load_end}",
        "* Setup: 1P1D NixlConnector (`kv_buffer_device: cpu`), tiny random Qwen2 model, `--enforce-eager`, "
        "both engines started at once by the launcher, then the PD router.", "",
        *rows, "",
        f"**Median {ratio:.3f}x, target <= {TARGET}x: {ok}.** The launcher's own share (CLI start, validation, "
        "preflight, router start after the engines) is the difference between the two columns; the engines "
        "start concurrently, so the slowest one sets the time.", END])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--e2e-python")
    ap.add_argument("--no-write", action="store_true", help="print, do not update bench/RESULTS.md")
    ap.add_argument("--quick", action="store_true",
                    help="one round, nothing written (also $OMNI_PD_BENCH_QUICK=1); skips without the e2e venv")
    a = ap.parse_args(argv)
    if quick_mode(a.quick):
        a.rounds, a.no_write = 1, True
    py = e2e_python(a.e2e_python, quick_mode(a.quick))
    mach = machine()
    work = Path(tempfile.mkdtemp(prefix="omni-pd-fig4-"))
    try:
        model = work / "tiny"
        subprocess.run([py, str(ROOT / "tests" / "e2e" / "make_tiny_model.py"), str(model)], check=True,
                       capture_output=True)
        pd = work / "pd.yaml"
        subprocess.run(omni_pd_command() + ["expand", "-q", str(ROOT / "tests" / "fixtures" / "llm.yaml"),
                                            "--pipeline", "llm", "--connector", "NixlConnector",
                                            "--kv-buffer-device", "cpu", "--port-base", "18950", "-o", str(pd)],
                       check=True)
        rounds = []
        for i in range(a.rounds):
            r = one_round(py, model, pd, work, i)
            print(f"round {i + 1}: launch {r['launch_s']:.1f} s, slowest engine {r['engine_s']:.1f} s, "
                  f"ratio {r['ratio']:.3f}", flush=True)
            rounds.append(r)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    section = render(rounds, mach, loadavg(), argv if argv is not None else sys.argv[1:])
    print(section)
    if not a.no_write and RESULTS.is_file():
        text = RESULTS.read_text(encoding="utf-8")
        new = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _: section, text, flags=re.S)
        RESULTS.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
