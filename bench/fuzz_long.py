"""Long fuzz run of ``omni-pd expand`` / ``validate`` (issue 6), and the cost of hostile inputs.

    python bench/fuzz_long.py                      # 10,000 examples (OMNI_PD_FUZZ_EXAMPLES overrides)
    python bench/fuzz_long.py --examples 20000 --seed 7
    python bench/fuzz_long.py --hostile-only       # time and peak memory of each hostile input

Every example is one input from ``tests/fuzz_strategies.py`` (mutated real deploy
configs, generated deploy-shaped documents) written to a file and run through three
command lines in process: one ``expand`` variant (``-q``, NIXL on vLLM 0.13, ``--tp 2``
on 0.32 ...), ``validate``, and one ``validate`` variant (``--all-platforms``, JSON,
SARIF with ``--platform npu``). Unlike the pytest suite, a contract violation does not stop the run: each
distinct violation (numbers and quoted values masked) is kept with the first input
that showed it, and the run ends with a summary and exit status 1 if any was found.

``--hostile`` (on by default after the fuzz run) runs each hostile input of
``fuzz_strategies.HOSTILE`` through ``expand`` and ``validate`` in a fresh
subprocess and reports exit status, CPU seconds, wall seconds and peak RSS (the
child's ``VmHWM``, including the interpreter and imports, next to a ``validate`` of the
bundled preset as the baseline). Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

_CHILD = r"""
import resource, sys, time
t0 = time.process_time(); w0 = time.perf_counter()
from omni_pd.cli import main
rc = main(sys.argv[1:])
cpu = time.process_time() - t0
wall = time.perf_counter() - w0
try:  # VmHWM: this process's peak RSS (ru_maxrss keeps the parent's peak across fork + exec)
    peak = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
except (OSError, StopIteration):
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
sys.stderr.write(f"\n@@cost {cpu:.3f} {wall:.3f} {peak}\n")
sys.exit(rc)
"""


def fuzz(examples: int, seed: int | None, report: Path | None) -> int:
    """Run ``examples`` fuzz examples; print and return the number of distinct violations."""
    from hypothesis import HealthCheck, Phase, given, seed as hseed, settings

    from fuzz_strategies import SEEDS, command_pairs, fuzz_inputs, problem_signature, run_input

    folder = Path(tempfile.mkdtemp(prefix="omni-pd-fuzz-"))
    found: dict[str, tuple[str, object]] = {}
    stats = {"examples": 0, "rc": {}}

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(inp=fuzz_inputs(), pair=command_pairs())
    def one(inp, pair) -> None:
        stats["examples"] += 1
        problems, outcomes = run_input(inp, folder, [pair[0], ["validate"], pair[1]])
        key = ",".join(str(o.rc) for o in outcomes)
        stats["rc"][key] = stats["rc"].get(key, 0) + 1
        for p in problems:
            sig = problem_signature(p)
            if sig not in found:
                found[sig] = (p, inp)
                print(f"\n!! new violation after {stats['examples']} examples: {p}\n{inp!r}\n", flush=True)
        if stats["examples"] % 500 == 0:
            print(f"  {stats['examples']} examples, {time.perf_counter() - t0:.0f} s, "
                  f"{len(found)} distinct violations", flush=True)

    if seed is not None:
        one = hseed(seed)(one)
    print(f"fuzzing {examples} examples over {len(SEEDS)} seed configs "
          f"(commands: an expand variant, validate, a validate variant)", flush=True)
    t0 = time.perf_counter()
    c0 = time.process_time()
    one()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(f"\n{stats['examples']} examples in {wall:.0f} s wall, {cpu:.0f} s CPU "
          f"({1000 * wall / max(stats['examples'], 1):.1f} ms per example, 3 commands each)")
    top = sorted(stats["rc"].items(), key=lambda kv: -kv[1])[:8]
    print("exit statuses (expand, validate, validate variant):",
          ", ".join(f"{k}: {v}" for k, v in top))
    print(f"distinct contract violations: {len(found)}")
    for sig, (p, inp) in found.items():
        print(f"  - {p}\n    input: {inp!r}"[:2000])
    if report is not None:
        report.write_text(json.dumps({"examples": stats["examples"], "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                                      "exit_statuses": stats["rc"], "violations": [p for p, _ in found.values()]},
                                     indent=2) + "\n")
    return len(found)


def hostile() -> None:
    """Print exit status, CPU, wall and peak RSS of expand/validate on each hostile input."""
    from fuzz_strategies import HOSTILE

    folder = Path(tempfile.mkdtemp(prefix="omni-pd-hostile-"))
    rows = []

    def measure(args: list[str], stdin: bytes | None = None) -> tuple[int, float, float, int, str]:
        r = subprocess.run([sys.executable, "-c", _CHILD] + args, capture_output=True, input=stdin, cwd=ROOT,
                           timeout=600)
        err = r.stderr.decode("utf-8", "replace")
        cost = [ln for ln in err.splitlines() if ln.startswith("@@cost")]
        cpu, wall, rss = (float(cost[-1].split()[1]), float(cost[-1].split()[2]), int(cost[-1].split()[3])) if cost else (0, 0, 0)
        first = next((ln for ln in err.splitlines() + r.stdout.decode("utf-8", "replace").splitlines()
                      if ln.startswith("error[")), "")
        return r.returncode, cpu, wall, rss, first

    base = measure(["validate"])
    print(f"\nbaseline `validate` of the bundled preset: exit {base[0]}, {base[1]:.2f} s CPU, peak RSS {base[3] / 1024:.0f} MiB")
    print("\n| input | size | command | exit | CPU s | wall s | peak RSS MiB | first diagnostic |")
    print("|---|---|---|---|---|---|---|---|")
    for h in HOSTILE:
        data = h.build()
        path = folder / f"{h.name}.yaml"
        path.write_bytes(data)
        del data
        for cmd in ("expand", "validate"):
            rc, cpu, wall, rss, first = measure([cmd, str(path)])
            rows.append((h.name, cmd, rc, cpu, wall, rss))
            print(f"| {h.name} | {path.stat().st_size} B | {cmd} | {rc} | {cpu:.2f} | {wall:.2f} | {rss / 1024:.0f} | {first[:90]} |",
                  flush=True)
        path.unlink()
    big = b"stages: []\n" + b"x: 1\n" * (12 * 1024 * 1024 // 5)
    rc, cpu, wall, rss, first = measure(["validate", "/dev/stdin"], stdin=big)
    print(f"| 12 MiB on a pipe (/dev/stdin) | {len(big)} B | validate | {rc} | {cpu:.2f} | {wall:.2f} | {rss / 1024:.0f} | {first[:90]} |")
    if os.path.exists("/dev/zero"):
        rc, cpu, wall, rss, first = measure(["validate", "/dev/zero"])
        print(f"| /dev/zero | endless | validate | {rc} | {cpu:.2f} | {wall:.2f} | {rss / 1024:.0f} | {first[:90]} |")
    plats = open(ROOT / "presets" / "qwen3_omni_moe.yaml", "rb").read() + b"".join(
        b"  p%d: {stages: [{stage_id: 0}]}\n" % i for i in range(14_000))
    path = folder / "qwen3_omni_moe.yaml"  # the name selects the pipeline, so expand goes all the way
    path.write_bytes(plats)
    for cmd in (["expand", "-q"], ["validate", "--all-platforms"]):
        rc, cpu, wall, rss, first = measure(cmd + [str(path)])
        print(f"| 14,000 platform overlays (98k nodes) | {len(plats)} B | {' '.join(cmd)} | {rc} | {cpu:.2f} | {wall:.2f} | "
              f"{rss / 1024:.0f} | {first[:90]} |", flush=True)
    path.unlink()
    dense = b"stages: []\nx:\n" + b"".join(b"  k%d: %d\n" % (i, i) for i in range(200_000))
    dense = dense[: 1024 * 1024 - 64]
    dense = dense[: dense.rfind(b"\n") + 1]
    path = folder / "dense_1MiB.yaml"
    path.write_bytes(dense)
    for cmd in ("expand", "validate"):
        rc, cpu, wall, rss, first = measure([cmd, str(path)])
        print(f"| just under 1 MiB of keys | {len(dense)} B | {cmd} | {rc} | {cpu:.2f} | {wall:.2f} | {rss / 1024:.0f} | {first[:90]} |")


def main(argv: list[str] | None = None) -> int:
    """Command line: ``--examples N`` (default ``$OMNI_PD_FUZZ_EXAMPLES`` or 10000),
    ``--seed S``, ``--json FILE``, ``--no-hostile``, ``--hostile-only``, ``--quick``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=int(os.environ.get("OMNI_PD_FUZZ_EXAMPLES", "10000")))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write a summary here")
    ap.add_argument("--no-hostile", action="store_true")
    ap.add_argument("--hostile-only", action="store_true")
    ap.add_argument("--quick", action="store_true",
                    help="two examples, seed 0, no hostile inputs (also $OMNI_PD_BENCH_QUICK=1)")
    a = ap.parse_args(argv)
    if a.quick or os.environ.get("OMNI_PD_BENCH_QUICK", "") not in ("", "0"):
        a.examples, a.seed, a.no_hostile, a.hostile_only = 2, 0 if a.seed is None else a.seed, True, False
    bad = 0
    if not a.hostile_only:
        bad = fuzz(a.examples, a.seed, a.json)
    if not a.no_hostile:
        hostile()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
