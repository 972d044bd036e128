"""Run the omni-pd benchmarks and write bench/RESULTS.md (issue 6).

    python bench/run.py            # figures 1-3, full rounds (about 10-15 minutes)
    python bench/run.py --quick    # fewer rounds and sizes (a smoke run, a few minutes)
    python bench/run.py --only 2,3 --no-write
    OMNI_PD_BENCH_QUICK=1 python bench/run.py   # the cheap mode: one round, the smallest size, nothing written

Run it with the Python that has omni-pd installed (its ``omni-pd`` console script is
used). Figure 1 also needs the vllm-omni 0.30.0 oracle venv (``bash .ci/oracle_venv.sh``;
found via ``--oracle-python``, ``$OMNI_PD_ORACLE_PYTHON`` or ``.cache/oracle/venv030``)
and is skipped without it. Not part of the test run. Standard library only.

Figures: 1 time to verdict vs vllm-omni (target >= 20x faster), 2 CLI cold start vs
``python3 -c pass`` (target <= 5x), 3 scaling of expand + validate to 1024 stages
(target t(1024)/t(128) <= 10). Figure 4 (launcher overhead) is measured elsewhere;
its section of RESULTS.md is kept as found when this script rewrites the file.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import fig1_verdict  # noqa: E402
import fig2_coldstart  # noqa: E402
import fig3_scaling  # noqa: E402

RESULTS = common.BENCH / "RESULTS.md"
RAW = common.BENCH / "results.json"
FIG4_BEGIN, FIG4_END = "<!-- figure 4: begin -->", "<!-- figure 4: end -->"
FIG4_PLACEHOLDER = f"""{FIG4_BEGIN}
## Figure 4: launcher overhead

*To be measured (launcher benchmark, added separately). `bench/run.py` keeps this section,
between the two figure-4 markers, as it finds it when it rewrites this file.*
{FIG4_END}"""

PLAN = {  # figure -> (full, quick) settings
    1: ({"rounds": 5}, {"rounds": 2}),
    2: ({"rounds": 30}, {"rounds": 8}),
    3: ({"sizes": fig3_scaling.SIZES, "reps": 5}, {"sizes": (8, 64, 128, 1024), "reps": 1}),
}


def _kept_section(begin: str, end: str) -> str | None:
    """The section between ``begin`` and ``end`` of the current RESULTS.md, or None."""
    if RESULTS.is_file():
        m = re.search(re.escape(begin) + r".*?" + re.escape(end), RESULTS.read_text(encoding="utf-8"), re.S)
        if m:
            return m.group(0)
    return None


def _figure4_section() -> str:
    """The figure 4 section of the current RESULTS.md, or the placeholder."""
    if RESULTS.is_file():
        m = re.search(re.escape(FIG4_BEGIN) + r".*?" + re.escape(FIG4_END), RESULTS.read_text(encoding="utf-8"), re.S)
        if m:
            return m.group(0)
    return FIG4_PLACEHOLDER


def _summary(results: dict) -> list[str]:
    rows = ["| figure | measured | target | |", "|---|---|---|---|"]
    r1 = results.get(1)
    if r1 and "cases" in r1:
        for case, c in r1["cases"].items():
            rows.append(f"| 1 time to verdict, {case} | omni-pd {c['speedup']['median']:.1f}x faster than vllm-omni "
                        f"| >= {r1['target']:.0f}x | {'met' if c['met'] else '**missed**'} |")
    elif r1:
        rows.append(f"| 1 time to verdict | not run ({r1['skipped']}) | >= 20x | |")
    r2 = results.get(2)
    if r2:
        rows.append(f"| 2 cold start | {r2['ratio']['median']:.1f}x `python3 -c pass` "
                    f"({r2['omni']['median'] * 1000:.0f} ms vs {r2['python']['median'] * 1000:.0f} ms) "
                    f"| <= {r2['target']:.0f}x | {'met' if r2['met'] else '**missed**'} |")
    r3 = results.get(3)
    if r3 and "ratio_1024_128" in r3:
        rows.append(f"| 3 scaling | t(1024)/t(128) = {r3['ratio_1024_128']:.1f} CPU time (t ~ N^{r3.get('exponent', float('nan')):.2f}) "
                    f"| <= {r3['target']:.0f} | {'met' if r3['met'] else '**missed**'} |")
    m = re.search(r"\*\*Median ([0-9.]+)x, target <= ([0-9.]+)x: (\w+)", _figure4_section())
    if m:  # figure 4 is measured by bench/fig4_launch.py; its section is kept as found
        rows.append(f"| 4 launcher overhead | `omni-pd launch` to all healthy = {m.group(1)}x the slowest engine's "
                    f"own start (bench/fig4_launch.py) | <= {m.group(2)}x | {'met' if m.group(3) == 'meets' else '**missed**'} |")
    for label, m in zip(("5 one file, cold start", "5 110 files, one process"),
                        re.findall(r"omni-pd / yamllint = \*\*([0-9.]+)x\*\* CPU \(target <= ([0-9.]+)x: ([^)]+)\)",
                                   _kept_section("<!-- figure 5: begin -->", "<!-- figure 5: end -->") or "")):
        rows.append(f"| {label} | omni-pd {m[0]}x yamllint's CPU time (bench/fig5_peers.py) | <= {m[1]}x | {m[2]} |")
    return rows


def render(results: dict, argv: list[str], mach: dict, started: float, load_end: list | None) -> str:
    cmd = "python bench/run.py" + ("" if not argv else " " + " ".join(shlex.quote(a) for a in argv))
    lines = [
        "# omni-pd benchmarks (issue 6)", "",
        "Written by `bench/run.py`; rerun it to refresh every figure (figure 4's section is kept). "
        "Ratios are measured side by side in one run: the two sides alternate, the order flips every "
        "round, and a ratio is the median of the per-round ratios, so a noisy machine slows both sides "
        "of each ratio alike. Raw numbers: `bench/results.json`.", "",
        f"* Command: `{cmd}` (with {mach['python']})",
        f"* Machine: {mach['cpu']}, {mach['cores']} cores, {mach['memory_gib']} GiB memory, {mach['os']}",
        f"* Date: {mach['date']}; wall time of the run {time.time() - started:.0f} s",
        f"* Commit: {mach['commit']}",
        f"* Load average (1, 5, 15 min) at start: {mach['loadavg']}, at end: {load_end}"
        + (" (**busy machine**: absolute times are inflated; the ratios are the figures)"
           if mach["loadavg"] and max(mach["loadavg"][0], (load_end or [0])[0]) > 0.5 * max(mach["cores"], 1) else ""),
        "* Timed children run without `PYTHONDONTWRITEBYTECODE`, so both sides of every comparison "
        "import from bytecode caches, as an installed tool does.", "",
        "## Summary", "", *_summary(results), "",
    ]
    for fig, mod in ((1, fig1_verdict), (2, fig2_coldstart), (3, fig3_scaling)):
        if fig in results:
            lines.append(mod.render(results[fig]))
    lines += [_figure4_section(), ""]
    fig5 = _kept_section("<!-- figure 5: begin -->", "<!-- figure 5: end -->")
    if fig5:  # measured by bench/fig5_peers.py (issue 13); kept as found
        lines += [fig5, ""]
    cold = _kept_section("<!-- cold start (issue 38): begin -->", "<!-- cold start (issue 38): end -->")
    if cold:  # measured by bench/coldstart_peers.py (issue 38); kept as found
        lines += [cold, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description="Run omni-pd's benchmarks (figures 1-3) and write bench/RESULTS.md.")
    ap.add_argument("--quick", action="store_true", help="fewer rounds and sizes: a smoke run of a few minutes")
    ap.add_argument("--only", default="1,2,3", help="comma-separated figures to run (default 1,2,3)")
    ap.add_argument("--oracle-python", help="python of the vllm-omni 0.30.0 oracle venv (figure 1)")
    ap.add_argument("--rounds", type=int, help="override the rounds of figures 1 and 2")
    ap.add_argument("--sizes", help="override the stage counts of figure 3, e.g. 8,128,1024")
    ap.add_argument("--reps", type=int, help="override the measurements per size of figure 3")
    ap.add_argument("--no-write", action="store_true", help="print RESULTS.md instead of writing it")
    a = ap.parse_args(argv)
    cheap = common.quick_mode()  # $OMNI_PD_BENCH_QUICK: one round, the smallest size, nothing written
    if cheap:
        a.quick, a.rounds, a.sizes, a.reps, a.no_write = True, 1, str(min(fig3_scaling.SIZES)), 1, True
    figs = sorted({int(x) for x in a.only.split(",") if x.strip()})
    started = time.time()
    mach = common.machine()
    print(f"omni-pd benchmarks: figures {figs}{' (quick)' if a.quick else ''} on {mach['cpu']}, "
          f"{mach['cores']} cores, load {mach['loadavg']}", flush=True)
    results: dict[int, dict] = {}
    for fig in figs:
        cfg = dict(PLAN[fig][1 if a.quick else 0])
        if fig in (1, 2) and a.rounds:
            cfg["rounds"] = a.rounds
        if fig == 1:
            results[1] = fig1_verdict.run(cfg["rounds"], oracle=common.oracle_python(a.oracle_python))
        elif fig == 2:
            results[2] = fig2_coldstart.run(cfg["rounds"], quick=cheap)
        elif fig == 3:
            sizes = tuple(int(x) for x in a.sizes.split(",")) if a.sizes else cfg["sizes"]
            results[3] = fig3_scaling.run(sizes, a.reps or cfg["reps"])
    text = render(results, argv, mach, started, common.loadavg())
    print("\n" + "\n".join(_summary(results)), flush=True)
    if a.no_write and cheap:
        print("\n(cheap mode: RESULTS.md not written)")
    elif a.no_write:
        print("\n" + text)
    else:
        RESULTS.write_text(text, encoding="utf-8")
        RAW.write_text(json.dumps({"machine": mach, "argv": argv, "results": results}, indent=1, default=str) + "\n",
                       encoding="utf-8")
        print(f"\nwrote {RESULTS.relative_to(common.ROOT)} and {RAW.relative_to(common.ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
