"""What ``omni-pd validate`` pays for at start-up (issue 13, bench figure 5): it imports only
what validating needs, typer reads real annotations (not strings it must compile), and the
collector threshold raised for a run is restored. Speed itself is measured in bench/, never
asserted here."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "qwen3_omni_moe_pd.yaml"


def test_validate_imports_no_launch_router_expand_or_emit_machinery() -> None:
    code = ("import json, sys\nfrom omni_pd.cli import main\nrc = main(['validate', '-q', sys.argv[1]])\n"
            "print(json.dumps({'rc': rc, 'mods': sorted(m for m in sys.modules)}))\n")
    out = subprocess.run([sys.executable, "-c", code, str(GOLDEN)], capture_output=True, text=True, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["rc"] == 0
    mods = set(res["mods"])
    assert "omni_pd.check.validate" in mods and "omni_pd.check.rules.schema" in mods
    unwanted = sorted(m for m in mods if m.startswith(("omni_pd.launch", "omni_pd.upstream", "omni_pd.compile.expand",
                                                       "omni_pd.compile.emit", "omni_pd.compile.passes",
                                                       "omni_pd.compile.graph", "omni_pd.compile.diff",
                                                       "aiohttp", "rich", "jsonschema")))
    assert unwanted == []


def test_command_annotations_are_objects_typer_need_not_compile() -> None:
    from omni_pd import cli

    for info in cli.app.registered_commands:
        for name, ann in info.callback.__annotations__.items():
            assert not isinstance(ann, str), (info.callback.__name__, name, ann)


def test_main_raises_the_collector_threshold_for_the_run_and_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from omni_pd import cli

    seen = []
    monkeypatch.setattr(cli, "_run", lambda argv: seen.append(gc.get_threshold()) or 7)
    before = gc.get_threshold()
    assert cli.main(["--version"]) == 7
    assert gc.get_threshold() == before
    assert seen == [(max(cli.GC_THRESHOLD_0, before[0]),) + before[1:]]


def test_validate_builds_the_deploy_model_without_scanning_for_pydantic_plugins() -> None:
    """The deploy model's classes are built with pydantic's plugin lookup off (a scan of
    every installed distribution's entry points), and the variable that turns it off is
    gone again after the run (processes started later must not inherit it)."""
    code = ("import json, os, sys\nfrom omni_pd.cli import main\nrc = main(['validate', '-q', sys.argv[1]])\n"
            "from pydantic.plugin import _loader\n"
            "print(json.dumps({'rc': rc, 'scanned': _loader._plugins is not None,\n"
            "                  'env': os.environ.get('PYDANTIC_DISABLE_PLUGINS')}))\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    out = subprocess.run([sys.executable, "-c", code, str(GOLDEN)], capture_output=True, text=True, check=True, env=env)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"rc": 0, "scanned": False, "env": None}
