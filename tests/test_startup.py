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


def test_opd103_near_miss_lookup_answers_as_difflib_does() -> None:
    """close_match skips the candidates whose length rules them out before difflib sees
    them; the answer must stay difflib's own on every cutoff OPD103 uses (deterministic
    typos of every known stage key: deletions, insertions, substitutions, swaps, plus
    unrelated words)."""
    import random
    import string
    from difflib import get_close_matches

    from omni_pd.check.rules.schema import _known_stage_keys, close_match

    known = _known_stage_keys()
    rnd = random.Random(13)
    words = ["", "x", "tp", "stage_id", "tensor_paralel_size", "gpu_memory_utilisation", "max_num_seq"]
    for k in known:
        for op in range(4):
            w, pos, c = list(k), rnd.randrange(len(k)), rnd.choice(string.ascii_lowercase + "_")
            if op == 0:
                del w[pos]
            elif op == 1:
                w.insert(pos, c)
            elif op == 2:
                w[pos] = c
            elif pos + 1 < len(w):
                w[pos], w[pos + 1] = w[pos + 1], w[pos]
            words.append("".join(w))
    words += ["".join(rnd.choice(string.ascii_lowercase + "_") for _ in range(rnd.randrange(1, 30))) for _ in range(300)]
    found = 0
    for cutoff in (0.6, 0.75, 0.8, 0.88, 0.9):
        for w in words:
            want = get_close_matches(w, known, n=1, cutoff=cutoff)
            assert close_match(w, known, cutoff) == (want[0] if want else None), (w, cutoff)
            found += bool(want)
    assert found > len(known)  # the typos do find their keys
