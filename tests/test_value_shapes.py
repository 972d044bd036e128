"""The shape sweep (issue 22): every value a rule reads that the runtime accepts in more
than one shape, each shape in one table.

One row: (rule, key, shape, config, context, expected). ``expected`` is None (the rule
says nothing: the runtime accepts the shape) or the exact finding (severity, message)
when the runtime refuses the shape. The accepted shapes are the upstream parsers', read in
the oracle venv (vLLM 0.30.0 + vllm-omni 0.30.0, /work/main/.cache/oracle/venv030):

- vLLM ``vllm/config/kv_transfer.py`` ``KVTransferConfig`` (a pydantic dataclass, lax
  mode: vllm/config/utils.py ``config``): ``kv_port: int`` (line 90) takes ``21001``,
  ``"21001"``, ``" 21001"`` and ``21001.0``; ``kv_rank: int | None`` (79) and
  ``kv_parallel_size: int`` (84) take ``"0"``; ``kv_buffer_size: float`` (71) takes
  ``"1e9"``; ``engine_id: str | None`` (64) REFUSES ``7`` ("Input should be a valid
  string"); vllm-omni stringifies it only for diffusion stages (vllm_omni/engine/
  stage_runtime.py:641-645).
- vLLM ``vllm/config/model.py`` ``ModelConfig.max_model_len: int`` (215): ``"32768"``
  is coerced, ``"32k"`` is not (human-readable ints are an argparse ``type=`` only,
  vllm/engine/arg_utils.py:372-384 ``human_readable_int`` / ``human_readable_int_or_auto``,
  so on the command line ``32k``, ``32K`` and ``auto`` are accepted); ``dtype`` and
  ``kv_cache_dtype`` default to ``auto``.
- vllm-omni ``vllm_omni/config/stage_config.py`` ``StageDeployConfig`` (385): ``devices:
  str | None`` (399), read as ``str(devices).split(",")`` (engine/stage_init_utils.py
  1411, 1720: an int ``0`` is ``"0"``, spaces are stripped; a YAML list stringifies to
  ``"[0, 1]"``, whose tokens are not device ids); ``num_replicas`` goes through
  ``int(num_replicas)`` (stage_config.py:659), so ``"2"`` is 2.
- Environment values (``env:``) reach the engine as strings (``os.environ``): ``5600`` and
  ``"5600"`` are one value; vLLM ``vllm/envs.py`` ``int(os.getenv(...))``.
- vllm-ascend ``kv_port`` (a string or an int in its guides: vllm-ascend 0.23.0.post1
  docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md) and the
  ``prefill``/``decode`` ``dp_size``/``tp_size`` of its extra config (``int(...)`` in
  mooncake_connector.py).
- LMCache's per-rank PD peer ports: a list in ``kv_connector_extra_config``
  (``lmcache.pd_peer_init_port``), ``"7300,7301"`` or ``7300`` in the environment
  (LMCache lmcache/v1/config.py ``_to_int_list``); the list length against TP is OPD608.
"""

from __future__ import annotations

import pytest

from omni_pd.check.validate import ValidateOptions, validate_text

E, W = "error", "warning"

_LLM = "pipeline: llm_pd\nasync_chunk: false\nstages:\n"
_OMNI = "pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"


def _pair(conn: str, p: str = "", d: str = "", pk: str = "", dk: str = "", *, head: str = _LLM,
          pid: str = "p0", did: str = "d0", pdev: str = '"0"', ddev: str = '"1"') -> str:
    """A 1P1D pair on one host: ``p``/``d`` stage keys, ``pk``/``dk`` kv_transfer_config keys."""
    return (head + f"  - {{stage_id: 0, devices: {pdev}{p}, kv_transfer_config: {{kv_connector: {conn}, "
            f"kv_role: kv_producer, engine_id: {pid}{pk}}}}}\n"
            f"  - {{stage_id: 1, devices: {ddev}{d}, kv_transfer_config: {{kv_connector: {conn}, "
            f"kv_role: kv_consumer, engine_id: {did}{dk}}}}}\n")


_NIXL_PORTS = ', env: {{VLLM_NIXL_SIDE_CHANNEL_PORT: {0}}}'
_ASC = ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
        "  - {{stage_id: 0, devices: {dev}, tensor_parallel_size: {tp}, env: {{HCCL_IF_BASE_PORT: {h0}}}, kv_transfer_config: "
        "{{kv_connector: MooncakeConnectorV1, kv_role: kv_producer, kv_port: {k0}, engine_id: p, "
        "kv_connector_extra_config: {{prefill: {{dp_size: {dp}, tp_size: {tps}}}, decode: {{dp_size: 1, tp_size: 2}}}}}}}}\n"
        "  - {{stage_id: 1, devices: \"2,3\", tensor_parallel_size: 2, env: {{HCCL_IF_BASE_PORT: \"61032\"}}, kv_transfer_config: "
        "{{kv_connector: MooncakeConnectorV1, kv_role: kv_consumer, kv_port: {k1}, engine_id: d, "
        "kv_connector_extra_config: {{prefill: {{dp_size: 1, tp_size: 2}}, decode: {{dp_size: 1, tp_size: 2}}}}}}}}\n")


def _asc(dev='"0,1"', tp="2", h0='"61000"', k0="36000", k1="36002", dp="1", tps="2") -> str:
    return _ASC.format(dev=dev, tp=tp, h0=h0, k0=k0, k1=k1, dp=dp, tps=tps)


def _lmc(v: str, where: str = "extra") -> str:
    kv = ("{kv_connector: LMCacheConnectorV1, kv_role: kv_producer, engine_id: p0"
          + (f", kv_connector_extra_config: {{lmcache.pd_peer_init_port: {v}}}" if where == "extra" else "") + "}")
    env = f", env: {{LMCACHE_PD_PEER_INIT_PORT: {v}}}" if where == "env" else ""
    return (_LLM + f"  - {{stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2{env}, kv_transfer_config: {kv}}}\n"
            "  - {stage_id: 1, devices: \"2\", kv_transfer_config: {kv_connector: LMCacheConnectorV1, kv_role: kv_consumer, engine_id: d0}}\n")


_SIDES = dict(p=_NIXL_PORTS.format(5600), d=_NIXL_PORTS.format(5700))

#: (rule, key, shape, config, validate options, expected finding or None)
SHAPES: list[tuple[str, str, str, str, dict, tuple[str, str] | None]] = [
    # kv_port: KVTransferConfig.kv_port: int, lax -> every spelling of one int is that int
    *[("OPD104", "kv_port", shape, _pair("NixlConnector", pk=f", kv_port: {a}", dk=f", kv_port: {b}", head=_OMNI), {}, None)
      for shape, a, b in [("int/int", "21001", "22001"), ("int/str", "21001", '"22001"'),
                          ("str/str", '"21001"', '"22001"'), ("float/int", "21001.0", "22001")]],
    *[("OPD501", "kv_port", shape, _pair("MooncakeConnectorV1", pk=f", kv_port: {a}", dk=f", kv_port: {b}", head=_OMNI),
       {"platform": "npu"}, None) for shape, a, b in [("int", "36000", "36002"), ("str", '"36000"', '"36002"'),
                                                      ("int/str", "36000", '"36002"')]],
    ("OPD504", "kv_port", "str, padded", _pair("NixlConnector", pk=', kv_port: " 21001"', head=_OMNI), {}, None),
    ("OPD101", "kv_port", "str, not a number", _pair("NixlConnector", pk=', kv_port: "abc"', head=_OMNI), {},
     (E, "`kv_port` must be an integer, found 'abc'")),
    # extra-config ports are passed through verbatim: the mix is the finding
    ("OPD104", "kv_connector_extra_config.http_port", "int/str",
     _pair("P2pNcclConnector", pk=", kv_connector_extra_config: {http_port: 8100}",
           dk=', kv_connector_extra_config: {http_port: "8200"}', head=_OMNI), {},
     (W, "port fields mix int and str: `kv_connector_extra_config.http_port` is a string ('8200') while other port "
         "fields are integers")),
    # Mooncake bootstrap port: vllm-omni int()s the extra-config value
    *[("OPD502", "bootstrap_port", shape, _pair("MooncakeConnector", pk=f", kv_connector_extra_config: {{bootstrap_port: {v}}}",
                                                p=f', env: {{VLLM_MOONCAKE_BOOTSTRAP_PORT: {e}}}', head=_OMNI), {}, None)
      for shape, v, e in [("int/env str", "25201", '"25201"'), ("str/env int", '"25201"', "25201")]],
    # engine_id: str | None; an int is refused by KVTransferConfig (OPD101), and is not "missing" (OPD702)
    ("OPD101", "engine_id", "str", _pair("MooncakeConnector", head=_OMNI), {}, None),
    ("OPD101", "engine_id", "quoted int", _pair("MooncakeConnector", pid='"7"', did='"8"', head=_OMNI), {}, None),
    ("OPD101", "engine_id", "int", _pair("MooncakeConnector", pid="7", did='"8"', head=_OMNI), {},
     (E, "`engine_id` must be a string, found 7")),
    ("OPD702", "engine_id", "int", _pair("MooncakeConnector", pid="7", did='"8"', head=_OMNI), {}, None),
    ("OPD702", "engine_id", "absent", _pair("MooncakeConnector", head=_OMNI).replace("engine_id: p0", "kv_buffer_device: cpu"),
     {}, (W, "prefill stage 0 has no engine_id: vllm-omni cannot send remote_engine_id to decode")),
    # env ports: os.environ holds strings, int() in vllm/envs.py
    *[("OPD501", "VLLM_NIXL_SIDE_CHANNEL_PORT", shape, _pair("NixlConnector", p=_NIXL_PORTS.format(a), d=_NIXL_PORTS.format(b)),
       {}, None) for shape, a, b in [("int", "5600", "5700"), ("str", '"5600"', '"5700"'), ("int/str", "5600", '"5700"')]],
    ("OPD501", "VLLM_NIXL_SIDE_CHANNEL_PORT", "int = str",
     _pair("NixlConnector", p=_NIXL_PORTS.format(5600), d=_NIXL_PORTS.format('"5600"')), {},
     (E, "port 5600 on the shared host bound by stage 0 (NIXL side channel, 5600) and stage 1 (NIXL side channel, 5600)")),
    ("OPD501", "HCCL_IF_BASE_PORT", "int", _asc(h0="61000"), {"platform": "npu"}, None),
    ("OPD501", "HCCL_IF_BASE_PORT", "int = str", _asc(h0="61032"), {"platform": "npu"},
     (E, "port 61032 on the shared host bound by stage 0 (HCCL listener (HCCL_IF_BASE_PORT), 61032) and stage 1 "
         "(HCCL listener (HCCL_IF_BASE_PORT), 61032)")),
    # vllm-ascend kv_port and its extra-config sizes
    *[("OPD506", "kv_port", shape, _asc(k0=k0, k1=k1), {"platform": "npu"}, None)
      for shape, k0, k1 in [("int", "36000", "36002"), ("str", '"36000"', '"36002"')]],
    ("OPD506", "kv_port", "str inside the transport range", _asc(k0='"30000"', k1='"30002"'), {"platform": "npu"},
     (E, "stage 0: MooncakeConnectorV1 kv_port range 30000-30001 overlaps AscendDirectTransport's random ports "
         "[20000, 36000) on a 16-NPU node")),
    *[(code, "prefill.tp_size/dp_size", shape, _asc(dp=dp, tps=tps), {"platform": "npu"}, None)
      for code in ("OPD303", "OPD612") for shape, dp, tps in [("int", "1", "2"), ("str", '"1"', '"2"')]],
    # devices: str(devices).split(","): int and "a, b" are device lists, a YAML list is not
    *[("OPD401", "devices", shape, _pair("NixlConnector", pdev=pd, ddev=dd, **_SIDES), {}, None)
      for shape, pd, dd in [("int", "0", "1"), ("str", '"0"', '"1"')]],
    ("OPD401", "devices", "str with spaces, TP 2", _asc(dev='"0, 1"'), {"platform": "npu"}, None),
    ("OPD101", "devices", "list", _pair("NixlConnector", pdev="[0]", ddev='"1"', **_SIDES), {},
     (E, "`devices` must be a string, found a list")),
    ("OPD403", "devices", "int = str", _pair("NixlConnector", pdev="1", ddev='"1"', **_SIDES), {},
     (W, "prefill (stage 0) and decode (stage 1) share GPU 1; disaggregation gives no isolation")),
    # parallel sizes: int or a numeric string (vllm-omni int()s num_replicas; pydantic coerces sizes)
    *[("OPD402", "tensor_parallel_size", shape, _asc(tp=tp), {"platform": "npu"}, None)
      for shape, tp in [("int", "2"), ("str", '"2"')]],
    ("OPD402", "num_replicas", "str", _pair("NixlConnector", d=', num_replicas: "2"' + _NIXL_PORTS.format(5700), ddev='"1,2"',
                                            p=_NIXL_PORTS.format(5600)), {}, None),
    # max_model_len / max_num_batched_tokens: human-readable on the command line only
    *[("OPD101", "max_model_len", f"--max-model-len {v}", _pair("NixlConnector", **_SIDES), {"cli": {"max_model_len": v}}, None)
      for v in ("32768", "32k", "32K", "auto")],
    ("OPD101", "max_num_batched_tokens", "--max-num-batched-tokens 8k", _pair("NixlConnector", **_SIDES),
     {"cli": {"max_num_batched_tokens": "8k"}}, None),
    ("OPD101", "max_model_len", "str in the file", _pair("NixlConnector", p=', max_model_len: "32768"', d=_NIXL_PORTS.format(5700)),
     {}, None),
    ("OPD101", "max_model_len", "32k in the file", _pair("NixlConnector", p=", max_model_len: 32k", d=_NIXL_PORTS.format(5700)),
     {}, (E, "`max_model_len` must be an integer, found '32k'")),
    # dtype: auto is ModelConfig's default, written or not
    *[("OPD313", "dtype", shape, _pair("NixlConnector", p=a, d=b), {}, None)
      for shape, a, b in [("auto/auto", ", dtype: auto", ", dtype: auto"), ("auto/unset", ", dtype: auto", ""),
                          ("AUTO/auto", ", dtype: AUTO", ", dtype: auto")]],
    ("OPD313", "dtype", "bfloat16/auto", _pair("NixlConnector", p=", dtype: bfloat16", d=", dtype: auto"), {},
     (W, "decode (stage 1) sets dtype auto (the checkpoint's dtype), prefill (stage 0) uses bfloat16: they load "
         "the same weight dtype only if that is auto (the checkpoint's dtype)")),
    *[("OPD605", "kv_cache_dtype", shape, _pair("NixlConnector", p=a, d=b), {}, None)
      for shape, a, b in [("auto/auto", ", kv_cache_dtype: auto", ", kv_cache_dtype: auto"),
                          ("auto/unset", ", kv_cache_dtype: auto", "")]],
    # kv_buffer_size / kv_rank: float / int fields, lax
    *[("OPD101", key, "str", _pair("NixlConnector", pk=f", {key}: {v}", dk=f", {key}: {v}", **_SIDES), {}, None)
      for key, v in [("kv_buffer_size", '"1e9"'), ("kv_rank", '"0"'), ("kv_parallel_size", '"2"')]],
    # LMCache per-rank ports: a list per TP rank, "a,b" or a list in the environment
    ("OPD608", "lmcache.pd_peer_init_port", "list of TP", _lmc("[7300, 7301]"), {}, None),
    ("OPD504", "lmcache.pd_peer_init_port", "list of TP", _lmc("[7300, 7301]"), {}, None),
    ("OPD504", "LMCACHE_PD_PEER_INIT_PORT", "\"a,b\"", _lmc('"7300,7301"', "env"), {}, None),
    ("OPD608", "LMCACHE_PD_PEER_INIT_PORT", "\"a,b\"", _lmc('"7300,7301"', "env"), {}, None),
]


def _ids(row) -> str:
    return f"{row[0]}-{row[1]}-{row[2]}"


@pytest.mark.parametrize("code,key,shape,text,opts,expected", SHAPES, ids=[_ids(r) for r in SHAPES])
def test_each_shape_the_runtime_accepts_passes_and_each_it_refuses_is_the_finding(code, key, shape, text, opts,
                                                                                   expected) -> None:
    res = validate_text(text, "t.yaml", ValidateOptions(**opts))
    assert [d.message for d in res.diagnostics if d.code == "OPD000"] == []
    got = [(d.severity.value, d.message) for d in res.diagnostics
           if d.code == code and d.severity.value in (E, W)]
    if expected is None:
        assert got == [], f"{code} on {key} written as {shape}"
    else:
        assert expected in got, got


def test_every_row_is_distinct() -> None:
    ids = [_ids(r) for r in SHAPES]
    assert len(ids) == len(set(ids))
