"""The command line as a package (issue 38): a command's module is imported only when that
command runs or shows its help, ``omni-pd --help`` imports none, the app tests read
(``omni_pd.cli.app``) has every command, and expand's work keeps the command's defaults
when ``size --write`` calls it."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_MODS = r"""
import contextlib, io, json, sys
from omni_pd.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    rc = main(json.loads(sys.argv[1]))
print(json.dumps({"rc": rc, "cmds": sorted(m for m in sys.modules if m.startswith("omni_pd.cli.")),
                  "out": out.getvalue()}))
"""


def _run(argv: list[str]) -> dict:
    p = subprocess.run([sys.executable, "-c", _MODS, json.dumps(argv)], capture_output=True, text=True, cwd=REPO,
                       check=True)
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_root_help_imports_no_command_module() -> None:
    res = _run(["--help"])
    assert res["rc"] == 0 and "validate    Check deploy configs" in res["out"]
    assert [m for m in res["cmds"] if m.startswith("omni_pd.cli.commands.")] == []


@pytest.mark.parametrize("argv, module", [
    (["explain", "OPD006"], "explain"),
    (["rules"], "rules"),
    (["graph", "--help"], "graph"),
    (["validate", "--format", "json", "tests/golden/qwen3_omni_moe_pd.yaml"], "validate"),
])
def test_a_command_imports_its_own_module_only(argv: list[str], module: str) -> None:
    res = _run(argv)
    assert res["rc"] == 0
    assert [m for m in res["cmds"] if m.startswith("omni_pd.cli.commands.")] == \
        [f"omni_pd.cli.commands.{module}"]


def test_validate_through_the_app_skips_expand_launch_and_rich() -> None:
    res = _run(["validate", "--format", "text", "-q", "tests/golden/qwen3_omni_moe_pd.yaml"])
    assert res["rc"] == 0
    assert not [m for m in res["cmds"] if m.startswith(("omni_pd.cli.expand_run", "omni_pd.cli.shared"))]


def test_the_registered_app_has_every_command_of_the_table() -> None:
    import typer.main

    from omni_pd.cli import COMMANDS, app, callback

    assert [i.name for i in app.registered_commands] == list(COMMANDS)
    assert [i.callback for i in app.registered_commands] == [callback(n) for n in COMMANDS]
    group = typer.main.get_command(app)
    assert list(group.commands) == list(COMMANDS)
    assert "nosuch" not in group.commands and group.commands.get("nosuch") is None
    with pytest.raises(AttributeError):
        __import__("omni_pd.cli", fromlist=["x"]).no_such_name


def test_run_expand_has_the_expand_commands_defaults() -> None:
    """``size --write`` calls run_expand with a few options; every other one must be what
    ``omni-pd expand`` would use when it is not given."""
    from omni_pd.cli.commands.expand import expand
    from omni_pd.cli.expand_run import run_expand

    cmd = {n: p.default.default for n, p in inspect.signature(expand).parameters.items()}
    run = {n: p.default for n, p in inspect.signature(run_expand).parameters.items() if n != "hide"}
    assert list(cmd) == list(run)
    assert cmd == run
    assert run["kv_host"] == "127.0.0.1" and run["npu_connector"] == "MooncakeConnectorV1"


def test_run_expand_hides_only_what_it_is_asked_to_and_reports_every_code(tmp_path, capsys) -> None:
    """The ``size --write`` path: a hidden code is left out of what is printed, still
    returned (size words its own note from it), and nothing stays hidden afterwards."""
    from omni_pd.cli.expand_run import run_expand

    # the bundled preset with two prefill replicas: its npu overlay keeps one (OPD904, a warning)
    found = run_expand(output=tmp_path / "a.yaml", prefill_replicas=2)
    assert "OPD904" in found and "warning[OPD904]" in capsys.readouterr().err
    again = run_expand(output=tmp_path / "b.yaml", prefill_replicas=2, hide=frozenset({"OPD904"}))
    assert again == found and "OPD904" not in capsys.readouterr().err
    assert (tmp_path / "b.yaml").read_text() == (tmp_path / "a.yaml").read_text()
    run_expand(output=tmp_path / "c.yaml", prefill_replicas=2)  # nothing stays hidden
    assert "warning[OPD904]" in capsys.readouterr().err
