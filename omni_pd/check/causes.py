"""Root cause first: a finding that follows from another is listed right after it.

A misspelt key (OPD103, ``tensor_paralel_size``) leaves the key meant at its default, and
every rule that reads that key then judges the default: prefill TP 2 against decode TP 1
(OPD306), a device list one entry too long (OPD401). Sorted by line, those can come before
the typo that causes them, and the user fixes the wrong thing. Each finding names what it
depends on as data (:class:`omni_pd.diagnostics.Diagnostic`):

- ``shadows``: the key paths the finding leaves at their default (OPD103: the key meant);
- ``reads``: the key paths whose values the finding judged, set or defaulted.

A finding that reads a path another finding shadows is *caused* by it. :func:`order_by_cause`
moves it to directly after its cause (causes keep their place in the sorted list), notes on
it what it follows from, and notes on the cause what it leads to. Nothing is dropped: the
counts, the exit status and SARIF stay the same, only the order and the notes change.

Paths are compared as the rules see them: ``("stages", i, key)``, with an ``engine_args`` or
``runtime`` block inside a stage read as the stage itself (vllm-omni 0.30 flattens both into
the stage's engine arguments, config/stage_config.py ``load_deploy_config``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from omni_pd.diagnostics import Diagnostic, Location

#: blocks of a stage entry whose keys are the stage's own (flattened by vllm-omni)
_STAGE_BLOCKS = frozenset({"engine_args", "runtime"})


def key_of(path: Sequence[Any]) -> tuple[Any, ...]:
    """``path`` as compared across findings: ``("stages", i, "engine_args", k)`` and
    ``("stages", i, "runtime", k)`` are ``("stages", i, k)``; other paths are unchanged."""
    p = tuple(path)
    if len(p) >= 4 and p[0] == "stages" and isinstance(p[1], int) and p[2] in _STAGE_BLOCKS:
        return p[:2] + p[3:]
    return p


def _dotted(path: Sequence[Any]) -> str:
    return Location(file="", path=tuple(path)).dotted()


def _where(d: Diagnostic) -> str:
    return f"{d.code} at {d.location}" if d.location is not None else d.code


def order_by_cause(diags: Sequence[Diagnostic]) -> list[Diagnostic]:
    """``diags`` (already sorted) with every caused finding moved right after its cause.

    A finding is caused by the first finding (in ``diags`` order) that shadows a path it
    reads; a finding never causes itself, and a chain (a caused finding that shadows in
    turn) is followed depth first. The caused finding gets the note ``follows from CODE at
    file:line:col, which leaves `path` unset (its default)``; the cause gets ``this leaves
    `path` unset (its default); the findings listed next follow from that: CODE at ...``.
    Returns a new list; the input is not changed. Pure; O(findings x paths)."""
    shadowed: dict[tuple, int] = {}
    for i, d in enumerate(diags):
        for p in d.shadows:
            shadowed.setdefault(key_of(p), i)
    if not shadowed:
        return list(diags)
    cause_of: dict[int, tuple[int, tuple]] = {}
    for j, d in enumerate(diags):
        for p in d.reads:
            i = shadowed.get(key_of(p))
            if i is not None and i != j:
                cause_of[j] = (i, key_of(p))
                break
    # a cycle (a shadows what b reads and b what a reads) has no root: all of it stays in place
    in_cycle: set[int] = set()
    for j in cause_of:
        seen, k = [j], cause_of[j][0]
        while k in cause_of and k not in seen:
            seen.append(k)
            k = cause_of[k][0]
        if k in seen:
            in_cycle.update(seen[seen.index(k):])
    for j in in_cycle:
        cause_of.pop(j)
    effects: dict[int, list[int]] = {}
    for j, (i, _) in sorted(cause_of.items()):
        effects.setdefault(i, []).append(j)

    def noted(i: int) -> Diagnostic:
        d = diags[i]
        notes = list(d.notes)
        if i in cause_of:
            c, path = cause_of[i]
            notes.append(f"follows from {_where(diags[c])}, which leaves `{_dotted(path)}` unset (its default)")
        if i in effects:
            keys = sorted({_dotted(cause_of[j][1]) for j in effects[i]})
            notes.append(f"this leaves {', '.join(f'`{k}`' for k in keys)} unset (its default); the findings "
                         f"listed next follow from that: {', '.join(_where(diags[j]) for j in effects[i])}")
        return replace(d, notes=notes) if notes != d.notes else d

    out: list[Diagnostic] = []

    def emit(i: int) -> None:
        out.append(noted(i))
        for j in effects.get(i, ()):
            emit(j)

    for i in range(len(diags)):
        if i not in cause_of:
            emit(i)
    return out
