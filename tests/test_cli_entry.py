"""The console entry point's fast path (omni_pd/cli_entry.py, issue 38): a plain
``omni-pd validate [-q] FILE...`` runs without typer and prints, byte for byte, what the
typer app prints, with the same exit status; anything else goes to the typer app."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omni_pd.cli_entry import fast_validate_args

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "qwen3_omni_moe_pd.yaml"

#: every validate input the goldens and cases hold, one run each, then runs over many
_FILES = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "golden").rglob("*.yaml")) + \
    sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "cases").glob("*.yaml"))
_RUNS = [["validate", f] for f in _FILES] + [
    ["validate", "-q", _FILES[0]],
    ["validate", "tests/cases/TC-01.yaml", "--quiet"],
    ["validate", *_FILES[:6]],
    ["validate", "-q", "tests/cases"],
    ["validate", "tests/cases", "tests/golden/xpyd"],
    ["validate"],  # the bundled preset
    ["validate", "tests/no-such-file.yaml"],
    ["validate", "tests/no-such-file.yaml", _FILES[0]],
    ["validate", "README.md"],
    ["validate", "tests"],
]

_COMPARE = r"""
import contextlib, io, json, os, sys
from omni_pd import cli, cli_entry

def run(main, argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return [rc, out.getvalue(), err.getvalue()]

res = []
for argv in json.loads(sys.argv[1]):
    assert cli_entry.fast_validate_args(argv) is not None, argv
    res.append({"argv": argv, "fast": run(cli_entry.main, argv), "typer": run(cli.main, argv)})
print(json.dumps(res))
"""


def test_fast_path_prints_what_the_typer_app_prints_on_every_golden_and_case() -> None:
    out = subprocess.run([sys.executable, "-c", _COMPARE, json.dumps(_RUNS)], capture_output=True, text=True,
                         cwd=REPO, check=True, env={k: v for k, v in __import__("os").environ.items()
                                                    if k not in ("OMNI_PD_DEBUG", "_OMNI_PD_COMPLETE")})
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(res) == len(_RUNS)
    differ = [(r["argv"], r["fast"], r["typer"]) for r in res if r["fast"] != r["typer"]]
    assert differ == []
    # the runs cover every exit status validate gives for files: clean, findings, unreadable
    assert {r["fast"][0] for r in res} >= {0, 1, 2}


def test_plain_validate_runs_without_typer_click_or_rich() -> None:
    code = ("import json, sys\nfrom omni_pd.cli_entry import main\nrc = main(['validate', '-q', sys.argv[1]])\n"
            "print(json.dumps({'rc': rc, 'mods': sorted(m for m in sys.modules)}))\n")
    out = subprocess.run([sys.executable, "-c", code, str(GOLDEN)], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["rc"] == 0
    assert [m for m in res["mods"] if m.split(".")[0] in ("typer", "click", "rich", "jsonschema", "omni_pd.cli")] == []
    assert "omni_pd.cli" not in res["mods"]


@pytest.mark.parametrize("entry", ["omni_pd.cli_entry", "omni_pd.cli"])
def test_validate_parses_without_the_pydantic_model_on_either_path(entry: str, tmp_path: Path) -> None:
    """Issue 38: validate parses with the deploy model's compiled projection
    (omni_pd/compile/model_lite.py), so neither the fast path nor the typer command imports
    the deploy model's pydantic classes, on a clean file and on one with type errors (OPD101), a
    ``base_config`` chain and a nested ``engine_args.kv_transfer_config``; the fast path imports
    no pydantic, typer or rich at all (the typer app imports pydantic for its own adapters)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("pipeline: qwen3_omni_moe\nasync_chunk: 'no'\nstages:\n"
                   "  - {stage_id: '0', tensor_parallel_size: 0, devices: 'x'}\n"
                   "  - {stage_id: 1, engine_args: {kv_transfer_config: {kv_port: abc}}}\n", encoding="utf-8")
    child = tmp_path / "child.yaml"
    child.write_text(f"base_config: {GOLDEN}\nstages:\n  - {{stage_id: 0, max_num_seqs: '8'}}\n", encoding="utf-8")
    code = (f"import json, sys\nfrom {entry} import main\nrcs = []\n"
            "for f in sys.argv[1:]:\n"
            "    try:\n        rcs.append(main(['validate', '-q', f]))\n"
            "    except SystemExit as e:\n        rcs.append(e.code)\n"
            "print(json.dumps({'rc': rcs, 'mods': sorted(m for m in sys.modules)}))\n")
    out = subprocess.run([sys.executable, "-c", code, str(GOLDEN), str(bad), str(child)], capture_output=True,
                         text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["rc"] == [0, 1, 0]  # findings: exit 1
    assert "OPD101" in out.stdout + out.stderr
    if entry == "omni_pd.cli_entry":  # the typer app imports pydantic itself (typer/_adapters.py)
        unwanted = ("pydantic", "pydantic_core", "annotated_types", "typer", "click", "rich")
        assert [m for m in res["mods"] if m.split(".")[0] in unwanted] == []
    assert "omni_pd.compile.model" not in res["mods"] and "omni_pd.compile.model_lite" in res["mods"]


def test_the_console_script_is_the_entry_point() -> None:
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'omni-pd = "omni_pd.cli_entry:main"' in text


@pytest.mark.parametrize("argv, expected", [
    (["validate", "a.yaml"], (["a.yaml"], False)),
    (["validate"], ([], False)),
    (["validate", "-q", "a.yaml", "b"], (["a.yaml", "b"], True)),
    (["validate", "a.yaml", "--quiet"], (["a.yaml"], True)),
    (["validate", "-"], None),  # stdin: the typer path (a repeated - is its usage error)
    (["validate", "--format", "json", "a.yaml"], None),
    (["validate", "--help"], None),
    (["validate", "--", "a.yaml"], None),
    (["validate", "-qq", "a.yaml"], None),
    (["validate", "--platform=cuda", "a.yaml"], None),
    (["expand", "a.yaml"], None),
    (["--version"], None),
    ([], None),
])
def test_which_command_lines_take_the_fast_path(argv, expected) -> None:
    assert fast_validate_args(argv) == expected


def test_debug_and_completion_go_to_the_typer_app(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_PD_DEBUG", "1")
    assert fast_validate_args(["validate", "a.yaml"]) is None
    monkeypatch.delenv("OMNI_PD_DEBUG")
    monkeypatch.setenv("_OMNI_PD_COMPLETE", "bash_complete")
    assert fast_validate_args(["validate", "a.yaml"]) is None


def test_fast_path_restores_the_collector_threshold() -> None:
    import gc

    from omni_pd import cli_entry

    before = gc.get_threshold()
    assert cli_entry.main(["validate", "-q", str(GOLDEN)]) == 0
    assert gc.get_threshold() == before


def test_pydantic_plugin_lookup_is_stood_in_only_while_plugins_are_off() -> None:
    """validate builds the deploy model with a stand-in for pydantic's plugin loader (its
    import costs importlib.metadata); after the block the real loader is what pydantic
    finds, and it answers as before."""
    code = ("import json, os, sys\nfrom omni_pd.cli_entry import main\nrc = main(['validate', '-q', sys.argv[1]])\n"
            "seen = {'rc': rc, 'metadata': 'importlib.metadata' in sys.modules,\n"
            "        'loader': 'pydantic.plugin._loader' in sys.modules}\n"
            "from pydantic.plugin import _loader\n"
            "seen.update(real=hasattr(_loader, 'PYDANTIC_ENTRY_POINT_GROUP'), plugins=list(_loader.get_plugins()),\n"
            "            env=os.environ.get('PYDANTIC_DISABLE_PLUGINS'))\n"
            "print(json.dumps(seen))\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    out = subprocess.run([sys.executable, "-c", code, str(GOLDEN)], capture_output=True, text=True, check=True, env=env)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {
        "rc": 0, "metadata": False, "loader": False, "real": True, "plugins": [], "env": None}
