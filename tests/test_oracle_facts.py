"""The upstream facts behind issue 11's rules, checked against vLLM / vllm-omni 0.30.0's own
code in the oracle venv (``OMNI_PD_ORACLE_PYTHON``): EC connector registry and the extra
keys each reads (OPD614/OPD615), NIXL's and Mooncake's pipeline-parallel handling (OPD612),
MultiConnector's merge and layout facts (OPD602), the keys a nested ``parallel_config``
may hold (OPD103). A change upstream fails here with the fact that moved.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")
pytestmark = pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")


@lru_cache(maxsize=1)
def facts() -> dict:
    proc = subprocess.run([ORACLE, str(ROOT / "tests" / "oracle" / "issue11_facts_probe.py")], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("ISSUE11-FACTS ")), None)
    assert line, proc.stderr[-2000:]
    return json.loads(line.split(" ", 1)[1])


def _yaml(name: str) -> dict:
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / name)


def test_ec_connectors_and_their_options_match_vllm_0_30() -> None:
    from omni_pd.check.rules.ec_connector import ec_fact

    f = facts()
    table = _yaml("ec_connectors.yaml")
    assert sorted(n for n in table["connectors"] if ec_fact(n, (0, 30))) == f["ec_registered"]
    for name, keys in f["ec_keys"].items():
        assert sorted(ec_fact(name, (0, 30))["extra_keys"]) == keys, name
    assert all(k not in keys for keys in f["ec_keys"].values() for k in table["never_upstream"])


def test_pipeline_parallel_facts_match_vllm_0_30() -> None:
    from omni_pd.check.rules.pipeline_parallel import pp_fact

    f = facts()
    assert f["nixl_consumer_pp_refused"] and f["nixl_pull_reads_pp_rank0_only"]
    assert pp_fact("NixlConnector", (0, 30))["decode"] is False and pp_fact("NixlConnector", (0, 30))["prefill"] is False
    assert f["nixl_push_pp_hma_refused"]
    push = pp_fact("NixlPushConnector", (0, 30))
    assert (push["prefill"], push["decode"], push["requires"]) == (True, False, ["no_hybrid"])
    assert f["mooncake_remote_pp"] and pp_fact("MooncakeConnector", (0, 30))["decode"] is True


def test_multi_connector_facts_match_vllm_0_30() -> None:
    f = facts()
    assert f["multi_key_clash"] and f["multi_first_wins"]
    table = {row["since"]: row["required"] for row in _yaml("multi_connector.yaml")["layouts"]}["0.30"]
    for name, layouts in f["layouts"].items():
        assert table[name]["layout"] in layouts, name


def test_multi_connector_release_rows_match_vllm_0_30() -> None:
    """0.30 is the first release read without the ``broken`` rows' bugs (first_fixed_read):
    it merges a second child's kv_transfer_params (so LMCacheMPConnector's {} and
    ExampleHiddenStatesConnector's path no longer raise; both still return them), NIXL's
    replicated-PCP ranks report sends done, and HMA children get request_finished_all_groups."""
    f = facts()
    assert not f["multi_one_producer_refused"] and f["multi_key_clash"]
    assert f["lmcache_mp_empty_params"] and f["hidden_states_params"]
    assert f["nixl_replicated_pcp_reports_sent"] and f["multi_hma_dispatch"]
    rows = {row["id"]: row for row in _yaml("multi_connector.yaml")["broken"]}
    assert {r["first_fixed_read"] for r in rows.values()} == {"0.30"}
    assert _yaml("multi_connector.yaml")["params_merge"]["first_merging_read"] == "0.30"


def test_parallel_config_keys_match_vllm_omni_0_30() -> None:
    from omni_pd.check.rules.schema import PARALLEL_CONFIG_KEYS

    assert sorted(PARALLEL_CONFIG_KEYS) == facts()["parallel_config_keys"]
