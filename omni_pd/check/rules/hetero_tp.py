"""Heterogeneous tensor parallelism across the PD pair (OPD603, capability family):
which connector can pair prefill TP with decode TP, from the table
:func:`omni_pd.compile.tp_pairs.connector_tp_problem` shares with ``expand``. Sources: vLLM
``kv_connector/v1/nixl`` (tp_mapping.py) and the PRs named in the rule (issue 38 split it
out of omni_pd/check/rules/capability.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules.capability import _pair_yaml, connector_row

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode


def hetero_tp_problem(ctx: Context, p: "StageNode", d: "StageNode") -> str | None:
    """Why the connector cannot pair prefill TP with decode TP, or None: the table of
    :func:`omni_pd.compile.tp_pairs.connector_tp_problem` (the one ``expand
    --prefill-tp/--decode-tp`` refuses with), fed the stages' TPs as validate reads them
    and the model's facts when ``--model-info`` gives them."""
    from omni_pd.compile.tp_pairs import connector_tp_problem

    name = connector_row(ctx, p) or connector_row(ctx, d)
    m = ctx.model
    return connector_tp_problem(name, ctx.stage_tp(p), ctx.stage_tp(d), ctx.target,
                                num_kv_heads=m.num_kv_heads if m is not None else None,
                                mla=bool(m is not None and m.is_mla), hybrid=bool(m is not None and m.is_hybrid),
                                sparse_attention=m.sparse_attention if m is not None else None)


_TP18 = _pair_yaml("NixlConnector", ", tensor_parallel_size: 1", ", tensor_parallel_size: 8").replace(
    'devices: "1"', 'devices: "1,2,3,4,5,6,7,8"')
_TP21 = _pair_yaml("NixlConnector", ", tensor_parallel_size: 2", ", tensor_parallel_size: 1").replace(
    'devices: "0"', 'devices: "0,1"').replace('devices: "1"', 'devices: "2"')
_TP88 = _pair_yaml("NixlConnector", ", tensor_parallel_size: 8", ", tensor_parallel_size: 8").replace(
    'devices: "0"', 'devices: "0,1,2,3,4,5,6,7"').replace('devices: "1"', 'devices: "8,9,10,11,12,13,14,15"')


@rule("OPD603", "hetero-tp", Severity.ERROR,
      "the connector cannot pair these prefill and decode tensor parallel sizes",
      fail=_pair_yaml("NixlConnector", ", tensor_parallel_size: 4", ", tensor_parallel_size: 2").replace(
          'devices: "0"', 'devices: "0,1,2,3"').replace('devices: "1"', 'devices: "4,5"'),
      passing=_pair_yaml("NixlConnector", ", tensor_parallel_size: 2", ", tensor_parallel_size: 2").replace(
          'devices: "0"', 'devices: "0,1"').replace('devices: "1"', 'devices: "2,3"'),
      example_context={"vllm_version": "0.13"}, labels=("CAP-HETERO-TP",),
      examples=(
          Example("decode TP 8 > 4 KV heads over NIXL on vLLM 0.23 (before vllm#45879)", _TP18, True,
                  {"vllm_version": "0.23", "model": {"num_kv_heads": 4, "attention": "GQA"}}, contains="vllm#45879"),
          Example("vLLM 0.24 not pinned for vllm#45879: warning", _TP18, True,
                  {"vllm_version": "0.24", "model": {"num_kv_heads": 4, "attention": "GQA"}},
                  severity=Severity.WARNING, contains="not pinned"),
          Example("vLLM 0.25 carries vllm#45879: decode TP 8 > 4 KV heads pairs", _TP18, False,
                  {"vllm_version": "0.25", "model": {"num_kv_heads": 4, "attention": "GQA"}}),
          Example("prefill TP 2 > 1 KV head with decode TP 1 still fails on vLLM 0.30", _TP21, True,
                  {"vllm_version": "0.30", "model": {"num_kv_heads": 1, "attention": "GQA"}},
                  contains="prefill TP 2 > num_key_value_heads 1"),
          Example("MiniMax-M3 MSA (NHD-native) over NIXL with unequal TP", _TP18, True,
                  {"vllm_version": "0.30", "model": {"num_kv_heads": 4, "attention": "GQA", "sparse_attention": "msa",
                                                     "model_type": "minimax_m3"}}, contains="NHD"),
          Example("MiniMax-M3 MSA with equal TP", _TP88, False,
                  {"vllm_version": "0.30", "model": {"num_kv_heads": 4, "attention": "GQA", "sparse_attention": "msa",
                                                     "model_type": "minimax_m3"}}),
      ))
def hetero_tp(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Heterogeneous TP per connector and version: NIXL 0.11-0.13 decode TP a multiple
    of prefill TP, 0.18+ either way if divisible; Mooncake equal TP before 0.22, then
    divisible; P2pNccl equal; vllm-ascend MooncakeConnectorV1 P_tp >= D_tp and
    P_tp % D_tp == 0; differing TPs above ``num_key_value_heads`` fail (needs
    ``--model-info``). Sources: vLLM ``vllm/distributed/kv_transfer/kv_connector/utils.py``
    ``TransferTopology.tp_ratio`` (0.30; ``v1/nixl_connector.py`` in 0.11-0.13),
    ``v1/mooncake/mooncake_connector.py`` ``_get_tp_ratio``; vllm-ascend
    ``docs/source/developer_guide/feature_guide/disaggregated_prefill.md`` (limits);
    https://github.com/ai-dynamo/dynamo/issues/2295,
    https://github.com/vllm-project/vllm/issues/14952,
    https://github.com/vllm-project/vllm/issues/45330. Model facts per release
    (``presets/targets/hetero_tp.yaml``): prefill TP above decode TP and above
    ``num_key_value_heads`` fails on every release; decode TP above prefill TP and above
    ``num_key_value_heads`` fails over NIXL until vllm#45879 (0.23 and before: error; 0.24:
    warning, not pinned; 0.25+: pairs); MiniMax-M3's MSA attention keeps KV NHD, so
    unequal TP over NIXL reads permuted heads (https://github.com/vllm-project/vllm/issues/46204,
    fix https://github.com/vllm-project/vllm/pull/46223 unmerged): error on every release."""
    from omni_pd.compile.tp_pairs import kv_head_split_problem

    pair = ctx.pd_pair
    if pair is None or not (pair[0].kv and pair[1].kv):
        return
    p, d = pair
    msg = hetero_tp_problem(ctx, p, d)
    ptp, dtp = ctx.stage_tp(p), ctx.stage_tp(d)
    rel = [ctx.sloc(p, "tensor_parallel_size", value=True, label=f"prefill (stage {p.stage_id}) TP {ptp}")]
    if msg:
        yield r.diag(msg, ctx.sloc(d, "tensor_parallel_size", value=True), related=rel,
                     help=f"give decode (stage {d.stage_id}) `tensor_parallel_size: {ptp}` or prefill (stage {p.stage_id}) "
                          f"`tensor_parallel_size: {dtp}` (equal TP), or pick TPs the connector pairs")
        return
    m = ctx.model
    name = connector_row(ctx, p) or connector_row(ctx, d)
    split = kv_head_split_problem(name, ptp, dtp, ctx.target, m.num_kv_heads if m is not None else None,
                                  bool(m is not None and m.is_mla))
    if split is not None and split[0] == "unpinned":
        yield r.diag(split[1], ctx.sloc(d, "tensor_parallel_size", value=True), related=rel, severity=Severity.WARNING,
                     notes=["source: https://github.com/vllm-project/vllm/pull/45879"],
                     help=f"give decode (stage {d.stage_id}) `tensor_parallel_size: {ptp}`, or target vLLM 0.25+ "
                          "(`--vllm-version 0.25`), which carries the fix")
