"""Figure 3: scaling of expand + validate with the number of stages (8 ... 1024).

For each size N, a synthetic N-stage chain (``bench/synth.py``: Thinker, Talker,
N-2 generation stages, one device and one claimed port (``VLLM_PORT``) per stage on
a host with that many devices, a platform overlay placing every stage) goes through what
``omni-pd expand in.yaml | omni-pd validate /dev/stdin --inventory hosts.yaml`` does,
in process, imports excluded:

    parse (load the input) -> expand_document -> parse (the output) -> validate_document

Time is the CPU time of the chain (``time.process_time``): its cost, which a busy
machine distorts less than wall time (also recorded). Each measurement is a fresh child process (``--child N``), so one size's garbage and
caches never reach another's; the sizes are interleaved round by round. Reported per
size: median/min/max seconds of the whole chain and of each phase, microseconds per
stage, peak RSS of the child (``ru_maxrss``; includes the imports, whose share is shown
in parentheses) and the tracemalloc peak of one chain (Python allocations only, from a
separate child so tracing slows nothing timed).
Target: t(1024) / t(128) <= 10 (linear growth gives 8).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

TARGET = 10.0
SIZES = (8, 16, 32, 64, 128, 256, 512, 1024)
PHASES = ("parse", "expand", "reparse", "validate")


# --- the child: one size, one measurement ------------------------------------------------

def child(n: int, mode: str) -> dict:
    import gc
    import resource
    import time

    import synth
    from omni_pd.compile.expand import expand_document
    from omni_pd.io import parse_text
    from omni_pd.check.validate import ValidateOptions, validate_document

    cat = synth.catalogue(n)
    text = synth.deploy_yaml(n)
    inv = synth.inventory(n)
    opts = ValidateOptions(inventory=inv)
    rss_floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def chain() -> tuple[dict, float, object]:
        t = [time.process_time()]
        w0 = time.perf_counter()
        doc = parse_text(text, f"synth{n}.yaml")
        t.append(time.process_time())
        res = expand_document(doc, catalogue=cat)
        t.append(time.process_time())
        out = parse_text(res.text, f"synth{n}_pd.yaml")
        t.append(time.process_time())
        v = validate_document(out, opts)
        t.append(time.process_time())
        return {p: t[i + 1] - t[i] for i, p in enumerate(PHASES)}, time.perf_counter() - w0, (res, v)

    with synth.installed(cat):
        if mode == "tracemalloc":
            import tracemalloc

            tracemalloc.start()
            chain()
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            return {"n": n, "tracemalloc_peak": peak}
        gc.collect()
        full0 = gc.get_stats()[2]["collections"]
        phases, wall, (res, v) = chain()
        full = gc.get_stats()[2]["collections"] - full0
    errors = sorted({d.code for d in v.diagnostics if d.severity.value == "error"})  # type: ignore[attr-defined]
    return {"n": n, "phases": phases, "total": sum(phases.values()), "wall": wall, "gc_full_collections": full,
            "stages_out": len(res.config.stages), "output_bytes": len(res.text),  # type: ignore[attr-defined]
            "errors": errors, "diagnostics": len(v.diagnostics),  # type: ignore[attr-defined]
            "rss_floor_kib": rss_floor, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}


def _run_child(n: int, mode: str) -> dict:
    r = common.run_once([sys.executable, str(Path(__file__).resolve()), "--child", str(n), "--mode", mode],
                        capture=True, timeout=3600)
    if r.rc != 0:
        raise SystemExit(f"figure 3: child for N={n} failed (exit {r.rc}):\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# --- the parent -------------------------------------------------------------------------

def _slope(xs: list[int], ys: list[float]) -> float:
    """Least-squares exponent k of t ~ N^k."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def run(sizes: tuple[int, ...], reps: int) -> dict:
    runs: dict[int, list[dict]] = {n: [] for n in sizes}
    for r in range(reps):
        order = list(sizes) if r % 2 == 0 else list(reversed(sizes))
        for n in order:
            runs[n].append(_run_child(n, "time"))
            print(f"  figure 3 rep {r + 1}/{reps}: N={n}: {runs[n][-1]['total']:.3f} s CPU "
                  f"({runs[n][-1]['wall']:.3f} s wall)", flush=True)
    per: dict[int, dict] = {}
    for n in sizes:
        tm = _run_child(n, "tracemalloc")
        rs = runs[n]
        per[n] = {
            "total": common.Stats.of([x["total"] for x in rs]).as_dict(),
            "wall": common.Stats.of([x["wall"] for x in rs]).as_dict(),
            "phases": {p: common.Stats.of([x["phases"][p] for x in rs]).as_dict() for p in PHASES},
            "stages_out": rs[0]["stages_out"], "output_bytes": rs[0]["output_bytes"],
            "errors": rs[0]["errors"], "diagnostics": rs[0]["diagnostics"],
            "maxrss_kib": max(x["maxrss_kib"] for x in rs), "rss_floor_kib": min(x["rss_floor_kib"] for x in rs),
            "tracemalloc_peak": tm["tracemalloc_peak"],
            "gc_full_collections": rs[0]["gc_full_collections"],
        }
        print(f"figure 3: N={n}: CPU {common.Stats.of([x['total'] for x in rs]).fmt()}, "
              f"peak RSS {per[n]['maxrss_kib'] / 1024:.0f} MiB, traced peak {tm['tracemalloc_peak'] / 2**20:.1f} MiB", flush=True)
    out: dict = {"target": TARGET, "reps": reps, "sizes": list(sizes), "per_size": {str(k): v for k, v in per.items()}}
    if 128 in per and 1024 in per:
        # paired like figures 1 and 2: each rep's 1024 over the same rep's 128, median
        pairs = [b["total"] / a["total"] for a, b in zip(runs[128], runs[1024])]
        q = common.Stats.of(pairs).median
        out["ratio_1024_128"] = q
        out["ratio_1024_128_reps"] = pairs
        out["wall_ratio_1024_128"] = common.Stats.of([b["wall"] / a["wall"] for a, b in zip(runs[128], runs[1024])]).median
        out["ratio_1024_128_phases"] = {p: per[1024]["phases"][p]["median"] / per[128]["phases"][p]["median"]
                                        for p in PHASES}
        out["met"] = q <= TARGET
        print(f"figure 3: t(1024)/t(128) = {q:.1f} (target <= {TARGET:.0f}: {'met' if q <= TARGET else 'MISSED'})",
              flush=True)
        out["gc_full_collections"] = {n: per[n]["gc_full_collections"] for n in (128, 1024)}
    big = [n for n in sizes if n >= 64]
    if len(big) >= 2:
        out["exponent"] = _slope(big, [per[n]["total"]["median"] for n in big])
    return out


def render(r: dict) -> str:
    per = {int(k): v for k, v in r["per_size"].items()}
    lines = ["## Figure 3: scaling of expand + validate with the number of stages", "",
             f"Target: t(1024) / t(128) <= {r['target']:.0f} (linear: 8), t = CPU time of the chain (the cost; "
             "wall time, which also counts waiting for a core on a busy machine, is shown beside it). Synthetic N-stage chains "
             "(`bench/synth.py`: one device and one claimed port (`VLLM_PORT`) per stage on a host with that many devices, "
             "Thinker at TP 2, a platform overlay placing every stage). Time = in-process "
             "parse -> `expand_document` -> parse of the output -> `validate_document` with an inventory, imports "
             f"excluded; a fresh child process per measurement, {r['reps']} per size, sizes interleaved.", "",
             "| N stages in | stages out | CPU median (min-max) | wall median | µs CPU per stage | parse | expand | re-parse "
             "| validate | full GCs | peak RSS (floor) | tracemalloc peak | validate errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, v in sorted(per.items()):
        t, ph = v["total"], v["phases"]
        lines.append(
            f"| {n} | {v['stages_out']} | {t['median']:.3f} s ({t['min']:.3f}-{t['max']:.3f}) | {v['wall']['median']:.3f} s | "
            f"{t['median'] / n * 1e6:.0f} | " + " | ".join(f"{ph[p]['median']:.3f} s" for p in PHASES)
            + f" | {v.get('gc_full_collections', '')} | {v['maxrss_kib'] / 1024:.0f} MiB ({v['rss_floor_kib'] / 1024:.0f}) | "
            f"{v['tracemalloc_peak'] / 2**20:.1f} MiB | {', '.join(v['errors']) or 'none'} |")
    lines.append("")
    if "ratio_1024_128" in r:
        ph = ", ".join(f"{p} {q:.1f}" for p, q in r["ratio_1024_128_phases"].items())
        reps = ", ".join(f"{x:.1f}" for x in r.get("ratio_1024_128_reps", []))
        lines.append(f"**t(1024) / t(128) = {r['ratio_1024_128']:.1f}** (median of the per-rep ratios {reps}; "
                     f"per phase, from the medians: {ph}; wall time {r['wall_ratio_1024_128']:.1f}): target "
                     f"{'met' if r['met'] else '**missed**'}.")
    if "exponent" in r:
        lines.append(f"Fitted growth t ~ N^{r['exponent']:.2f} over N >= 64 (1.00 = linear).")
    lines += ["", "\"full GCs\": CPython's full (generation 2) garbage collections during the chain; each scans "
              "the whole heap, so they grow a little faster than the work and are the part of the time that "
              "is not omni-pd's own code. The measurement is CPU-bound and single-threaded; on a machine shared "
              "with other jobs even CPU time drifts by 10-30%, so compare ratios from one run.", "", FIXED, ""]
    return "\n".join(lines)


FIXED = """\
Fixed on the way (regression tests: `tests/test_linear.py`):

* `expand` was quadratic: `emit.apply_pd_split` deep-copied the round-trip tree with
  `copy.deepcopy`, and ruamel.yaml's `CommentedSeq.__deepcopy__` (0.18, 0.19) re-copies the
  sequence's comment and position attributes once per item (and drops the memo), so copying
  `stages:` cost O(n^2) (4x the stages: 11x the function calls). `omni_pd.io.copy_tree` copies the same
  tree in linear time with the same result.
* `validate` crashed from about 1000 stages: rule OPD204's recursive cycle check hit Python's
  recursion limit on a long `edges:` chain (`internal error in rule OPD204: RecursionError`);
  it is iterative now (Kahn's algorithm)."""


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="time", choices=("time", "tracemalloc"), help=argparse.SUPPRESS)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="the smallest size once (also $OMNI_PD_BENCH_QUICK=1)")
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.child, a.mode)))
    elif common.quick_mode(a.quick):
        print(render(run((min(SIZES),), 1)))
    else:
        print(render(run(tuple(int(x) for x in a.sizes.split(",")), a.reps)))
