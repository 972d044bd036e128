"""Cold start of `omni-pd validate FILE` against yamllint and check-jsonschema (issue 38).

One file (the expanded preset, tests/golden/qwen3_omni_moe_pd.yaml), one fresh process per
tool per round, the three tools alternating in one loop with the order flipped every round
(bench/common.py ``alternate``). The figure is CPU time (user + sys of the child), and a
ratio is the median of the per-round ratios omni-pd / peer, so a busy stretch of the
machine slows both sides of a ratio alike. Goal (issue 38): omni-pd at most 1.5x yamllint.

    python bench/coldstart_peers.py              # 15 rounds after one warm-up, prints a table
    python bench/coldstart_peers.py --quick      # one round, no warm-up (tests/test_bench_quick.py)
    python bench/coldstart_peers.py --json out.json

Peers are found next to this interpreter or on PATH (``pip install yamllint
check-jsonschema``); a missing peer is left out of the table (and said so). Standard
library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import GOLDEN, ROOT, alternate, loadavg, machine, omni_pd_command  # noqa: E402

SCHEMA = ROOT / "schemas" / "omni-pd-deploy.schema.json"
TARGET = 1.5  # omni-pd / yamllint CPU time, one file, cold start (issue 38)


def quick_mode(flag: bool = False) -> bool:
    """True for the cheap mode: ``--quick`` or ``OMNI_PD_BENCH_QUICK=1``."""
    return flag or os.environ.get("OMNI_PD_BENCH_QUICK", "") not in ("", "0")


def peer(name: str) -> str | None:
    """The console script ``name`` next to this interpreter, else on PATH, else None."""
    here = Path(sys.executable).parent / name
    return str(here) if here.is_file() else shutil.which(name)


def commands(file: Path = GOLDEN) -> tuple[dict[str, list[str]], list[str]]:
    """The timed command lines by tool (omni-pd first), and the peers not found."""
    cmds = {"omni-pd": omni_pd_command() + ["validate", str(file)]}
    missing = []
    yl, cj = peer("yamllint"), peer("check-jsonschema")
    if yl:
        cmds["yamllint"] = [yl, str(file)]
    else:
        missing.append("yamllint")
    if cj:
        cmds["check-jsonschema"] = [cj, "--schemafile", str(SCHEMA), str(file)]
    else:
        missing.append("check-jsonschema")
    return cmds, missing


def measure(rounds: int, warmup: int = 1) -> dict:
    """Time the tools side by side; CPU and wall medians per tool and omni-pd's ratios."""
    cmds, missing = commands()
    res = alternate(cmds, rounds, warmup=warmup, label="cold start ", progress=False)
    out = {"rounds": rounds, "missing": missing, "tools": {}, "ratios": {}, "exit_codes": res.rcs}
    for name in cmds:
        out["tools"][name] = {"cpu": res.stats(name, cpu=True).as_dict(), "wall": res.stats(name).as_dict()}
        if name != "omni-pd":
            out["ratios"][name] = res.ratio("omni-pd", name, cpu=True).as_dict()
    return out


def render(r: dict, mach: dict, load_end) -> str:
    """The result as Markdown (a table and one line per ratio)."""
    ms = lambda s: f"{s * 1000:.0f} ms"  # noqa: E731
    lines = [f"* Machine: {mach['cpu']}, {mach['cores']} cores; {mach['date']}; commit {mach['commit']}; "
             f"load at start {mach['loadavg']}, at end {load_end}; {r['rounds']} rounds", "",
             "| tool | CPU median (min-max) | wall median |", "|---|---|---|"]
    for name, t in r["tools"].items():
        c, w = t["cpu"], t["wall"]
        lines.append(f"| {name} | {ms(c['median'])} ({ms(c['min'])}-{ms(c['max'])}) | {ms(w['median'])} |")
    lines.append("")
    for name, q in r["ratios"].items():
        goal = f" (goal <= {TARGET:g}x: {'met' if q['median'] <= TARGET else 'missed'})" if name == "yamllint" else ""
        lines.append(f"* omni-pd / {name} = **{q['median']:.2f}x** CPU, median of {q['n']} per-round ratios "
                     f"(min {q['min']:.2f}, max {q['max']:.2f}){goal}")
    for name in r["missing"]:
        lines.append(f"* {name}: not found (pip install {name}); left out")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print it; exit 1 when omni-pd's run did not exit 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="one round, no warm-up (a smoke run)")
    ap.add_argument("--json", type=Path, help="also write the figures here as JSON")
    a = ap.parse_args(argv)
    quick = quick_mode(a.quick)
    mach = machine()
    r = measure(1 if quick else a.rounds, warmup=0 if quick else 1)
    print(render(r, mach, loadavg()))
    if a.json:
        a.json.write_text(json.dumps({"machine": mach, **r}, indent=1) + "\n", encoding="utf-8")
    return 0 if all(rc == 0 for rc in r["exit_codes"]["omni-pd"]) else 1


if __name__ == "__main__":
    sys.exit(main())
