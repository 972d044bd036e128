"""The package layering docs/layout.md describes: compile -> upstream -> check -> launch -> cli.

Every ``omni_pd`` import (module level or inside a function) is read from the source
with :mod:`ast`; a later layer may import an earlier one, never the reverse, and no
module imports itself back through a cycle. No module is over 800 lines (issue 38).
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "omni_pd"
#: layer of each top-level part of the package; foundations are 0
LAYER = {"diagnostics": 0, "io": 0, "io_errors": 0, "io_write": 0, "resources": 0, "compile": 1, "upstream": 2, "check": 3, "launch": 4, "render": 4, "cli": 5,
         "cli_options": 5, "cli_graph": 5, "cli_validate": 5, "cli_entry": 5, "__main__": 5,
         "sizing": 4,  # sizing: the AIConfigurator adapter at the edge, beside launch
         "status": 4}  # status: reads a running deployment (launch plan, render addresses), beside launch


def _modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        if "oracle_standins" in f.parts:
            continue
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                names = [n.module] + [f"{n.module}.{a.name}" for a in n.names]
            elif isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            edges[m] |= {x for x in names if x in mods and x != m}
    return edges


def _part(mod: str) -> str:
    return mod.split(".")[1] if "." in mod else mod


def test_no_layer_imports_a_later_one() -> None:
    mods = _modules()
    unknown = sorted({_part(m) for m in mods if m != "omni_pd"} - set(LAYER))
    assert not unknown, f"new top-level parts need a layer in tests/test_layout.py: {unknown}"
    upward = sorted((a, b) for a, bs in _imports(mods).items() for b in bs
                    if a != "omni_pd" and b != "omni_pd" and LAYER[_part(b)] > LAYER[_part(a)])
    assert upward == []


def test_no_import_cycles() -> None:
    edges = _imports(_modules())
    # package __init__ files discovering their own plug-in modules are not cycles of code
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert cycles == []


#: the most lines a module of omni_pd/ may have (issue 38: split a larger one by job)
MAX_MODULE_LINES = 800
#: modules allowed over MAX_MODULE_LINES: being split on other branches (issue 38);
#: remove each entry when its split has merged (the test fails once it is under the limit)
OVER_LIMIT_ALLOWED = {"omni_pd/cli.py", "omni_pd/launch/plan.py"}


def test_no_module_is_over_800_lines() -> None:
    sizes = {str(f.relative_to(PKG.parent)): len(f.read_text(encoding="utf-8").splitlines())
             for f in PKG.rglob("*.py")}
    over = {m: n for m, n in sorted(sizes.items()) if n > MAX_MODULE_LINES}
    assert sorted(set(over) - OVER_LIMIT_ALLOWED) == [], f"split these by job: {over}"
    stale = sorted(m for m in OVER_LIMIT_ALLOWED if m not in over)
    assert stale == [], f"no longer over {MAX_MODULE_LINES} lines (or gone): drop from OVER_LIMIT_ALLOWED: {stale}"
