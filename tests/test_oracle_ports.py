"""The Mooncake bootstrap ports omni-pd preflights are the ones vllm-omni 0.30.0 binds.

Runs where the oracle venv exists (``OMNI_PD_ORACLE_PYTHON``, built by ``.ci/oracle_venv.sh``):
one subprocess runs vllm-omni's own ``StageRuntime._prepare_replica_vllm_config`` (through
tests/oracle/bootstrap_probe.py) on ``expand``'s output, resolved by vllm-omni's serve-path
resolver, and every port it writes (``bootstrap_addr`` and the replica's env) must equal what
``omni-pd launch`` preflights for that file. On the output omni-pd wrote before it read
``bootstrap_port`` (``mooncake_bootstrap_port: 25201``), vllm-omni bound 8998 and this failed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.compile.targets import target
from omni_pd.io import load_file, parse_text
from omni_pd.launch.plan import LaunchOptions, plan_document
from omni_pd.resources import preset_path

ROOT = Path(__file__).resolve().parents[1]
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")

pytestmark = pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")

CASES = {f"r{n}_tp{tp}_{c[:4].lower()}": (n, tp, c) for n in (1, 3) for tp in (1, 2)
         for c in ("MooncakeConnector", "NixlConnector") if not (c == "NixlConnector" and n > 1)}


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    d = tmp_path_factory.mktemp("bootstrap")
    files = {}
    for name, (n, tp, conn) in CASES.items():
        src = preset_path("qwen3_omni_moe").read_text().replace(
            '    devices: "0"\n', f'    devices: "0"\n    num_replicas: {n}\n', 1)
        res = expand_document(parse_text(src, "qwen3_omni_moe.yaml"), ExpandOptions(connector=conn, tp=tp))
        files[name] = d / f"{name}.yaml"
        files[name].write_text(res.text)
    proc = subprocess.run([ORACLE, str(ROOT / "tests" / "oracle" / "bootstrap_probe.py"), *map(str, files.values())],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = {Path(r["file"]).stem: r for r in map(json.loads, (x for x in proc.stdout.splitlines() if x.startswith("{")))}
    return files, out


@pytest.mark.parametrize("name", list(CASES))
def test_preflighted_bootstrap_ports_are_the_ones_vllm_omni_writes(probed, name):
    files, out = probed
    n, tp, conn = CASES[name]
    r = out[name]
    assert "error" not in r, r
    planned = plan_document(load_file(files[name]), str(files[name]), LaunchOptions(model="m"))
    written = [int(x["bootstrap_addr"].rsplit(":", 1)[1]) for x in r["replicas"] if x["bootstrap_addr"]]
    assert planned.plan is not None
    preflight = [u.port for u in planned.plan.processes[0].ports if u.purpose.startswith("Mooncake bootstrap")]
    assert written == preflight
    if conn == "MooncakeConnector":
        assert written == [25201 + i for i in range(n)]
        # the env the runtime gives each prefill replica is the port it binds
        assert [x["env_port"] for x in r["replicas"] if x["kv_role"] == "kv_producer"] == [str(p) for p in written]
    else:
        assert written == []
    # engine ids: the per-replica template of the target facts
    tmpl = target("0.30").mooncake_bootstrap("vllm-omni").engine_id
    base = {0: "omni-thinker-prefill", 1: "omni-thinker-decode"}
    assert [x["engine_id"] for x in r["replicas"]] == [
        tmpl.format(engine_id=base[s], stage_id=s, replica_id=i) for s in (0, 1) for i in range(n)]
