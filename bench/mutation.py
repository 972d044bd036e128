"""Mutation testing of omni-pd's core with mutmut 3, one module at a time (issue 16).

A mutant is one small deliberate change (``>`` to ``>=``, a constant changed, a call
dropped); it is *killed* when at least one test fails on it and *survives* when the tests
still pass. The survivor rate is the share of mutants no test noticed.

Each module is run in its own scratch copy of the committed tree (``git archive HEAD``
into ``.cache/mutation/<module>/``): mutmut writes its mutated tree (``mutants/``) there,
the work tree is never modified nor read (colleagues' uncommitted edits stay out), and each module gets only the tests that cover it (the
``TARGETS`` table), never the whole suite. Inside that subset mutmut runs, per mutant, only
the tests that called the mutated function, fastest first, stopping at the first failure.
Everything runs under ``nice -n 19`` with one worker (``--max-children 1``).

    python bench/mutation.py                          # every module in TARGETS
    python bench/mutation.py omni_pd/launch/smoke.py  # one module (or several)
    python bench/mutation.py --list                   # the table
    python bench/mutation.py --show omni_pd/launch/smoke.py   # diff of each survivor

Results (killed / survived / no tests / timeout per module, wall time) are printed as a
Markdown table and stored in ``.cache/mutation/results.json``; bench/MUTATION.md is the
report written from them. Needs ``pip install mutmut==3.8.1`` (the ``mutation`` extra).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = ROOT / ".cache" / "mutation"
RESULTS = SCRATCH / "results.json"

#: every rule runs on every validate call, so each rule mutant meets every validate test; the
#: golden of every rule example (whole output) is in test_rule_branches.py, which makes
#: test_rules.py's example checks a subset: one file keeps a rule module near 30 min here
RULE_TESTS = ["tests/test_rule_branches.py"]
#: module -> the smallest test files that cover it (mutmut narrows further per mutant)
TARGETS: dict[str, list[str]] = {
    "omni_pd/launch/smoke.py": ["tests/test_smoke.py", "tests/test_smoke_units.py", "tests/test_smoke_faults.py",
                                "tests/test_epd_launch.py"],
    # test_launch_plan alone leaves the Ascend HCCL ports and the encoder leg unreached (coverage)
    "omni_pd/launch/plan.py": ["tests/test_launch_plan.py", "tests/test_xpyd.py", "tests/test_epd_launch.py",
                               "tests/test_ascend_launch.py"],
    "omni_pd/launch/preflight.py": ["tests/test_preflight.py", "tests/test_launch_plan.py", "tests/test_epd_launch.py"],
    "omni_pd/compile/connectors/__init__.py": ["tests/test_connectors.py", "tests/test_expand.py"],
    "omni_pd/compile/connectors/base.py": ["tests/test_connectors.py", "tests/test_expand.py"],
    "omni_pd/compile/connectors/mooncake.py": ["tests/test_connectors.py", "tests/test_expand.py"],
    "omni_pd/compile/connectors/nixl.py": ["tests/test_connectors.py", "tests/test_expand.py"],
    "omni_pd/compile/connectors/nixl_push.py": ["tests/test_connectors.py"],
    "omni_pd/compile/connectors/lmcache.py": ["tests/test_connectors_branches.py", "tests/test_connectors.py",
                                            "tests/test_rules.py"],
    # configure/ports/port_span called directly there; test_ascend_expand reaches them through the npu pass
    "omni_pd/compile/connectors/ascend_mooncake.py": ["tests/test_connectors_branches.py", "tests/test_connectors.py",
                                                    "tests/test_ascend_expand.py"],
    # class attributes only (no function body for mutmut to mutate): listed so a method added later is measured
    "omni_pd/compile/connectors/ascend_layerwise.py": ["tests/test_connectors_branches.py",
                                                     "tests/test_connectors.py"],
    "omni_pd/check/rules/pd_pair.py": RULE_TESTS,
    "omni_pd/check/rules/topology.py": RULE_TESTS + ["tests/test_rule_branches_topology.py"],
    "omni_pd/check/rules/ports.py": RULE_TESTS + ["tests/test_rule_branches_ports.py"],
    "omni_pd/check/rules/devices.py": RULE_TESTS + ["tests/test_rule_branches_devices.py"],
    "omni_pd/check/rules/runtime.py": RULE_TESTS + ["tests/test_rule_branches_runtime.py"],
    "omni_pd/check/rules/schema.py": RULE_TESTS + ["tests/test_rule_branches_schema.py"],
    "omni_pd/check/rules/capability.py": RULE_TESTS + ["tests/test_rule_branches_capability.py"],
    # the capability family's modules split out of capability.py (issue 38): the same tests reach them
    **{f"omni_pd/check/rules/{m}.py": RULE_TESTS + ["tests/test_rule_branches_capability.py"]
       for m in ("multi_connector", "hetero_tp", "pipeline_parallel", "lmcache_pd", "ec_connector")},
    # Rule.explain/diag, the registry, Context's locating and parallel-size helpers, run_rules' OPD000:
    # every rule test reaches them; test_rules.py covers explain and the registry
    "omni_pd/check/rules/__init__.py": RULE_TESTS + ["tests/test_rules.py", "tests/test_rules_registry.py"],
    "omni_pd/check/rules/encoder.py": RULE_TESTS + ["tests/test_rule_branches_encoder.py"],
    "omni_pd/compile/alloc.py": ["tests/test_alloc_branches.py", "tests/test_expand.py"],
    # test_expand.py (CLI goldens, ~20 s per surviving mutant here) left out: 1159 mutants
    # took over 90 min with it; the goldens still run in the fast suite. test_xpyd.py reaches
    # the xPyD, per-side TP and overlay branches (the three reach every line of the module)
    "omni_pd/compile/passes/pd_split.py": ["tests/test_passes_branches.py", "tests/test_talker_pd.py",
                                           "tests/test_xpyd.py"],
    "omni_pd/compile/passes/ascend.py": ["tests/test_passes_branches.py", "tests/test_ascend_expand.py"],
    "omni_pd/compile/passes/encoder_split.py": ["tests/test_passes_branches.py", "tests/test_encoder_split.py",
                                                "tests/test_epd.py"],
}
#: copied into each scratch tree (besides omni_pd/ and tests/)
COPY = ["presets", "schemas", "pyproject.toml"]
#: the revision mutated (``--rev``); its committed files, never the work tree
REV = "HEAD"
_STATUS = re.compile(r"^\s*(\S+):\s+(.+?)\s*$")


def slug(module: str) -> str:
    return module.removesuffix(".py").replace("/", ".")


#: decorators that only register a function (they return it unchanged); see :func:`undecorate`
REGISTERING = {"rule"}


def undecorate(source: str) -> str:
    """``source`` with each top-level ``@rule(...)`` decorator moved below its function as
    ``name = rule(...)(name)``: the same registration, in the same order.

    mutmut 3 never mutates a decorated function (it cannot copy one safely in general), so
    without this the body of every check in ``omni_pd/check/rules/`` (all ``@rule``) would be
    skipped and only the rules' helpers measured. ``rule(...)`` returns the function it is
    given and its arguments are plain values, so evaluating them after the ``def`` instead
    of before changes nothing. Applied to the scratch copy only."""
    import libcst as cst  # installed with mutmut

    def registering(d: cst.Decorator) -> bool:
        f = d.decorator
        return isinstance(f, cst.Call) and isinstance(f.func, cst.Name) and f.func.value in REGISTERING

    body: list = []
    for stmt in cst.parse_module(source).body:
        if isinstance(stmt, cst.FunctionDef) and stmt.decorators and all(registering(d) for d in stmt.decorators):
            name = stmt.name.value
            body.append(stmt.with_changes(decorators=[], leading_lines=[
                *stmt.leading_lines, *(line for d in stmt.decorators for line in d.leading_lines)]))
            value: cst.BaseExpression = cst.Name(name)
            for d in reversed(stmt.decorators):  # the innermost decorator applies first
                value = cst.Call(func=d.decorator, args=[cst.Arg(value)])
            body.append(cst.SimpleStatementLine([cst.Assign([cst.AssignTarget(cst.Name(name))], value)]))
        else:
            body.append(stmt)
    return cst.parse_module(source).with_changes(body=body).code


def prepare(module: str, tests: list[str]) -> Path:
    """A fresh scratch tree for ``module`` with a ``setup.cfg`` that mutates only it."""
    work = SCRATCH / slug(module)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    # the committed tree (HEAD), not the work tree: colleagues' uncommitted edits stay out
    archive = subprocess.run(["git", "archive", "--format=tar", REV, "omni_pd", "tests", *COPY], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=archive, check=True)
    src = work / module
    src.write_text(undecorate(src.read_text(encoding="utf-8")), encoding="utf-8")
    tests = [t for t in tests if (work / t).exists()]
    sel = "\n    ".join(tests)
    (work / "setup.cfg").write_text(
        "[mutmut]\n"
        "source_paths = omni_pd\n"
        f"only_mutate = {module}\n"
        f"pytest_add_cli_args_test_selection =\n    {sel}\n"
        "pytest_add_cli_args =\n    -p\n    no:cacheprovider\n    -q\n"
        "also_copy =\n    presets\n    schemas\n"
        "use_git_change_detection = false\n"
        # mutmut stops a mutant after (estimated test time + 1 s) x multiplier of wall time
        # (and twice that of CPU time); its default 15 let each endless-loop mutant of
        # alloc's while loops run ~15 min on two shared cores. 2 was too tight: under load
        # encoder_split had 19 "timeouts" at 6.2 s for tests measured at 2.1 s, crash-type
        # mutants that most likely just ran slowly. Timeouts
        # are reported apart from kills (the table's "other" column).
        "timeout_multiplier = 5\n",
        encoding="utf-8")
    return work


def _rev() -> str:
    return subprocess.run(["git", "rev-parse", "--short", REV], cwd=ROOT, capture_output=True, text=True,
                          check=False).stdout.strip()


def statuses(work: Path) -> dict[str, str]:
    """mutant name -> status, from ``mutmut results --all true``."""
    out = subprocess.run([sys.executable, "-m", "mutmut", "results", "--all", "true"], cwd=work,
                         capture_output=True, text=True, check=False).stdout
    res: dict[str, str] = {}
    for line in out.splitlines():
        m = _STATUS.match(line)
        if m and "__mutmut_" in m.group(1):
            res[m.group(1)] = m.group(2)
    return res


def run(module: str) -> dict:
    tests = TARGETS[module]
    rev = _rev()  # the revision archived below; HEAD may move while the run takes minutes
    work = prepare(module, tests)
    # bytecode (and resources.load_data's JSON caches, written only when bytecode is) stays on:
    # the scratch tree is fresh, and without the caches every validate call re-parses the
    # bundled YAML (rule modules that read EC facts ran ~10x slower)
    env = dict(os.environ, OMNI_PD_OFFLINE="1", HYPOTHESIS_PROFILE="default")
    t0 = time.monotonic()
    proc = subprocess.run(["nice", "-n", "19", sys.executable, "-m", "mutmut", "run", "--max-children", "1"],
                          cwd=work, env=env, capture_output=True, text=True, check=False)
    seconds = time.monotonic() - t0
    (work / "mutmut-run.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    st = statuses(work)
    count = {k: sum(1 for v in st.values() if v == k) for k in sorted(set(st.values()))}
    total = len(st)
    alive = [n for n, v in st.items() if v in ("survived", "no tests")]
    return {"module": module, "rev": rev, "tests": [t for t in tests if (work / t).exists()], "mutants": total,
            "by_status": count, "survivors": sorted(alive),
            "survivor_rate": round(len(alive) / total, 4) if total else None,
            "seconds": round(seconds, 1), "exit": proc.returncode}


def show(module: str) -> None:
    work = SCRATCH / slug(module)
    for name, status in statuses(work).items():
        if status in ("survived", "no tests"):
            print(f"# {status}")
            subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=work, check=False)


def table(rows: list[dict]) -> str:
    lines = ["| module | mutants | killed | survived | no tests | other | survivor rate | seconds |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        c = r["by_status"]
        other = r["mutants"] - c.get("killed", 0) - c.get("survived", 0) - c.get("no tests", 0)
        rate = "-" if r["survivor_rate"] is None else f"{100 * r['survivor_rate']:.1f}%"
        lines.append(f"| {r['module']} | {r['mutants']} | {c.get('killed', 0)} | {c.get('survived', 0)} | "
                     f"{c.get('no tests', 0)} | {other} | {rate} | {r['seconds']:.0f} |")
    return "\n".join(lines)


def quick_check() -> int:
    """The cheap mode: every module of :data:`TARGETS` and every test file it names exists
    (a moved module or test would otherwise surface only in a run of hours). Exit 1 and
    the missing paths otherwise."""
    missing = sorted({p for m, tests in TARGETS.items() for p in (m, *tests)
                      if not (ROOT / p.split("::")[0]).exists()})
    for p in missing:
        print(f"mutation: missing {p}")
    print(f"mutation: {len(TARGETS)} modules, {len({t for ts in TARGETS.values() for t in ts})} test files; "
          f"{'all present' if not missing else f'{len(missing)} missing'} (no mutants run in the cheap mode)")
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("modules", nargs="*", help="modules to run (default: every module in TARGETS)")
    ap.add_argument("--list", action="store_true", help="print the module -> tests table")
    ap.add_argument("--show", action="store_true", help="print the diff of each survivor of the modules")
    ap.add_argument("--rev", default="HEAD", help="git revision whose committed files are mutated (default HEAD)")
    ap.add_argument("--quick", action="store_true",
                    help="check the TARGETS table against the tree and stop (also $OMNI_PD_BENCH_QUICK=1): "
                         "mutants take minutes per module")
    a = ap.parse_args(argv)
    if a.quick or os.environ.get("OMNI_PD_BENCH_QUICK", "") not in ("", "0"):
        return quick_check()
    global REV
    REV = a.rev
    mods = a.modules or list(TARGETS)
    unknown = [m for m in mods if m not in TARGETS]
    if unknown:
        ap.error(f"not in TARGETS: {', '.join(unknown)}")
    if a.list:
        for m in mods:
            print(m, " ".join(TARGETS[m]))
        return 0
    if a.show:
        for m in mods:
            show(m)
        return 0
    SCRATCH.mkdir(parents=True, exist_ok=True)
    rows = []
    for m in mods:
        r = run(m)
        rows.append(r)
        old = json.loads(RESULTS.read_text(encoding="utf-8")) if RESULTS.exists() else {}  # another run may have written
        old[m] = r
        RESULTS.write_text(json.dumps(old, indent=1), encoding="utf-8")
        print(table([r]).splitlines()[-1], flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
