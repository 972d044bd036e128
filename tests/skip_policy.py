"""What a skip (or xfail) reason may say: short, and no path outside the project.

A skip line is read in ``pytest -ra`` summaries and CI logs: one short sentence that
says what is missing and how to get it. Paths outside the checkout (a home directory,
a temporary directory, ``../shared``) are written relative or by their variable
(``$OMNI_PD_CACHE``), so the line is the same on every machine. ``conftest.py`` turns a
skip that breaks this into a failure.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

#: the longest skip reason accepted (characters)
MAX_REASON = 200

_ABS_PATH = re.compile(r"(?<![\w.~$-])/(?:[\w.+-]+/)*[\w.+-]+")


def reason_problems(reason: str, repo: Path) -> list[str]:
    """Every way ``reason`` breaks the policy (empty when it keeps it)."""
    out: list[str] = []
    if len(reason) > MAX_REASON:
        out.append(f"skip reason is {len(reason)} characters (at most {MAX_REASON})")
    root = str(repo.resolve())
    for m in _ABS_PATH.finditer(reason):
        p = m.group(0)
        if p in ("/dev/zero", "/dev/stdin", "/dev/null") or p == root or p.startswith(root + "/"):
            continue
        out.append(f"skip reason names a path outside the project: {p}")
    return out


REPO = Path(__file__).resolve().parents[1]


def enforce(report) -> None:
    """Turn a skipped ``report`` whose reason breaks the policy into a failure."""
    if not report.skipped or not isinstance(report.longrepr, tuple) or len(report.longrepr) != 3:
        return
    reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    problems = reason_problems(reason, REPO)
    if problems:
        report.outcome = "failed"
        report.longrepr = "; ".join(problems) + f"\nreason was: {reason[:300]}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    enforce(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    enforce(outcome.get_result())
