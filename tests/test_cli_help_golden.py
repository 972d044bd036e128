"""Every command's ``--help`` text and the exit status of a few command lines, pinned
(issue 38): the CLI was split from one module into a package of lazily imported command
modules, and what a user sees must not move with it.

The goldens (tests/golden/cli_help/*.txt) were written by the one-module CLI before the
split, through the console entry point (:func:`omni_pd.cli_entry.main`), with a fixed
terminal (``COLUMNS=100``, ``NO_COLOR=1``, ``TERM=dumb``). Regenerate with
``OMNI_PD_UPDATE_GOLDEN=1`` (then read the diff: a change is a change users see).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "cli_help"
UPDATE = os.environ.get("OMNI_PD_UPDATE_GOLDEN") == "1"

#: every command of ``omni-pd --help``, in its order
COMMANDS = ("expand", "migrate", "schema", "pipelines", "size", "connectors", "validate", "graph", "diff",
            "rules", "explain", "launch", "render", "status")

#: (golden name, argv, exit status); the golden holds stdout, then ``--- stderr ---`` and stderr
_RUNS: list[tuple[str, list[str], int]] = [
    ("root", ["--help"], 0),
    *((cmd, [cmd, "--help"], 0) for cmd in COMMANDS),
    ("no_args", [], 2),  # no_args_is_help: the root help, usage status
    ("unknown_command", ["nosuch"], 2),
    ("close_command", ["validat", "x.yaml"], 2),
    ("bad_choice", ["validate", "--format", "nope", "x.yaml"], 2),
    ("missing_argument", ["explain"], 2),
    ("unknown_option", ["graph", "--nope"], 2),
    ("missing_file_typer_path", ["validate", "--format", "text", "tests/no-such-file.yaml"], 2),
    ("explain_code", ["explain", "OPD006"], 0),
    ("validate_golden_quiet", ["validate", "-q", "--format", "text", "tests/golden/qwen3_omni_moe_pd.yaml"], 0),
    ("validate_case_findings", ["validate", "--format", "concise", "tests/cases/TC-01.yaml"], 1),
]

_RUNNER = r"""
import contextlib, io, json, sys
from omni_pd.cli_entry import main

res = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    res.append([rc, out.getvalue(), err.getvalue()])
print(json.dumps(res))
"""


@pytest.fixture(scope="module")
def results() -> dict[str, tuple[int, str]]:
    """Every run of :data:`_RUNS` in one fresh interpreter: name -> (exit status, text)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMNI_PD_DEBUG", "_OMNI_PD_COMPLETE", "FORCE_COLOR")}
    env.update(COLUMNS="100", LINES="40", NO_COLOR="1", TERM="dumb")
    out = subprocess.run([sys.executable, "-c", _RUNNER, json.dumps([argv for _, argv, _ in _RUNS])],
                         capture_output=True, text=True, cwd=REPO, env=env, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    return {name: (rc, f"{o}--- stderr ---\n{e}") for (name, _, _), (rc, o, e) in zip(_RUNS, res)}


@pytest.mark.parametrize("name, argv, status", _RUNS, ids=[r[0] for r in _RUNS])
def test_cli_text_and_status_are_pinned(results, name: str, argv: list[str], status: int) -> None:
    rc, text = results[name]
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        path.write_text(text, encoding="utf-8")
    assert (rc, text) == (status, path.read_text(encoding="utf-8"))


def test_root_help_lists_every_command_once() -> None:
    text = (GOLDEN / "root.txt").read_text(encoding="utf-8")
    listed = [line.split()[0] for line in text.split("Commands:\n", 1)[1].splitlines()
              if line.startswith("  ") and not line.startswith("   ")]
    assert listed == list(COMMANDS)
