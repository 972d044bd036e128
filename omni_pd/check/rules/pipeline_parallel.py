"""Pipeline parallelism per KV connector, side and vLLM release (OPD612, CAP-PP,
capability family). Facts: ``presets/targets/kv_pp.yaml`` (:func:`pp_fact`); sources per
row in that file (issue 38 split it out of omni_pd/check/rules/capability.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules._shared import follow_same_as, row_for
from omni_pd.check.rules.capability import _kv_nodes, loaded_rows

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode


def _pp_table() -> dict[str, Any]:
    """``presets/targets/kv_pp.yaml``: connector -> rows (see the file's header)."""
    from omni_pd.resources import data_dir, load_data

    return dict(load_data(data_dir("presets") / "targets" / "kv_pp.yaml")["connectors"])


def pp_fact(name: str, version: tuple[int, int]) -> dict[str, Any] | None:
    """The kv_pp.yaml row for connector ``name`` on vLLM ``version`` (None: no row).

    Shape: ``{prefill: bool | None, decode: bool | None, requires: [...], why, fix,
    sources}``; ``same_as`` names are followed."""
    return row_for(follow_same_as(_pp_table(), name), version)



def _pd_sides(ctx: Context) -> list[tuple["StageNode", str]]:
    """(stage, side) for every KV stage: the PD pair's roles, else the stage's kv_role
    (kv_both counts as both sides)."""
    pair = ctx.pd_pair
    out: list[tuple["StageNode", str]] = []
    for n in _kv_nodes(ctx):
        role = (n.kv or {}).get("kv_role")
        if pair is not None and n is pair[0]:
            out.append((n, "prefill"))
        elif pair is not None and n is pair[1]:
            out.append((n, "decode"))
        elif role == "kv_producer":
            out.append((n, "prefill"))
        elif role == "kv_consumer":
            out.append((n, "decode"))
        elif role == "kv_both":
            out += [(n, "prefill"), (n, "decode")]
    return out


_PP = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
       "  - {{stage_id: 0, devices: \"{pd}\", pipeline_parallel_size: {pp}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_producer, engine_id: p{pe}}}}}\n"
       "  - {{stage_id: 1, devices: \"{dd}\", pipeline_parallel_size: {dp}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_consumer, engine_id: d{de}}}}}\n")


def _pp_yaml(c: str, pp: int, dp: int, pe: str = "", de: str = "") -> str:  # pragma: no mutate block (runs at import only)
    pd = ",".join(str(i) for i in range(pp))
    dd = ",".join(str(i) for i in range(pp, pp + dp))
    return _PP.format(c=c, pp=pp, dp=dp, pd=pd, dd=dd, pe=pe, de=de)


_ASCEND_PEER = ", kv_connector_extra_config: {{prefill: {{tp_size: 1, dp_size: 1{p}}}, decode: {{tp_size: 1, dp_size: 1}}}}"


@rule("OPD612", "pp-unsupported", Severity.ERROR,
      "the KV connector does not support pipeline parallelism on this side (prefill / decode) in this vLLM",
      fail=_pp_yaml("NixlConnector", 2, 2), passing=_pp_yaml("NixlPushConnector", 2, 1),
      example_context={"vllm_version": "0.30"}, labels=("CAP-PP",),
      examples=(
          Example("pull NIXL, PP on prefill only", _pp_yaml("NixlConnector", 2, 1), True, {"vllm_version": "0.30"},
                  contains="stage 0 PP 2"),
          Example("NixlPullConnector is the pull connector", _pp_yaml("NixlPullConnector", 1, 2), True,
                  {"vllm_version": "0.30"}, contains="stage 1 PP 2"),
          Example("push NIXL, PP on decode", _pp_yaml("NixlPushConnector", 1, 2), True, {"vllm_version": "0.30"},
                  contains="stage 1 PP 2"),
          Example("push NIXL PP prefill with a hybrid model", _pp_yaml("NixlPushConnector", 2, 1), True,
                  {"vllm_version": "0.30", "model": {"attention": "hybrid"}}, contains="hybrid"),
          Example("push NIXL PP prefill before the release with PR #45880: unknown", _pp_yaml("NixlPushConnector", 2, 1),
                  True, {"vllm_version": "0.26"}, severity=Severity.INFO, contains="45880"),
          Example("Mooncake on 0.30 takes PP on both sides", _pp_yaml("MooncakeConnector", 2, 2), False,
                  {"vllm_version": "0.30"}),
          Example("unknown connector PP: info only", _pp_yaml("LMCacheConnectorV1", 2, 1), True,
                  {"vllm_version": "0.30"}, severity=Severity.INFO),
          Example("PP 1 everywhere is never checked", _pp_yaml("NixlConnector", 1, 1), False, {"vllm_version": "0.30"}),
          Example("global --pipeline-parallel-size counts", _pp_yaml("NixlConnector", 1, 1), True,
                  {"vllm_version": "0.30", "cli": {"pipeline_parallel_size": 2}}),
          Example("MultiConnector child NixlConnector", _pp_yaml("MultiConnector", 2, 1,
                  pe=", kv_connector_extra_config: {connectors: [{kv_connector: NixlConnector, kv_role: kv_producer}]}",
                  de=", kv_connector_extra_config: {connectors: [{kv_connector: NixlConnector, kv_role: kv_consumer}]}"),
                  True, {"vllm_version": "0.30"}),
          Example("vllm-ascend Mooncake: decode PP", _pp_yaml("MooncakeConnectorV1", 1, 2), True,
                  {"vllm_version": "0.30", "platform": "npu"}),
          Example("vllm-ascend Mooncake: PP prefill without pp_size in the peer block",
                  _pp_yaml("MooncakeConnectorV1", 2, 1, pe=_ASCEND_PEER.format(p="")), True,
                  {"vllm_version": "0.30", "platform": "npu"}, contains="pp_size"),
          Example("vllm-ascend Mooncake: PP prefill with pp_size in the peer block",
                  _pp_yaml("MooncakeConnectorV1", 2, 1, pe=_ASCEND_PEER.format(p=", pp_size: 2"),
                           de=_ASCEND_PEER.format(p=", pp_size: 2")), False,
                  {"vllm_version": "0.30", "platform": "npu"}),
      ))
def pp_unsupported(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Pipeline parallelism (``pipeline_parallel_size`` > 1, per stage or the global
    flag) per KV connector, PD side and vLLM release, from
    ``presets/targets/kv_pp.yaml``: the pull-mode ``NixlConnector`` (=
    ``NixlPullConnector``) takes PP 1 on both sides (it reads from pipeline rank 0
    only; decode PP raises NotImplementedError); ``NixlPushConnector`` takes PP > 1
    on prefill only, from the release with vLLM PR #45880 (0.30 has it; earlier: info),
    not with hybrid (HMA) models; vLLM's ``MooncakeConnector`` takes PP on both sides
    in 0.30; vllm-ascend's ``MooncakeConnectorV1``/``MooncakeLayerwiseConnector`` take
    PP on prefill only and need the real ``pp_size`` in the ``prefill``/``decode``
    peer blocks. A connector or release without a row gives an info, not an error.
    MultiConnector is checked through its children. Sources:
    https://github.com/vllm-project/vllm/issues/22430,
    https://github.com/vllm-project/vllm/issues/52913,
    https://github.com/vllm-project/vllm/pull/45880; vLLM 0.30.0
    kv_connector/v1/nixl/base_worker.py, nixl/pull_worker.py,
    mooncake/mooncake_connector.py; vllm-ascend Mooncake connector worker."""
    if ctx.target.version < (0, 11):
        return
    bad: dict[str, list[tuple["StageNode", str, int, dict]]] = {}
    for n, side in _pd_sides(ctx):
        pp = ctx.parallel(n)["pipeline_parallel_size"]
        if pp <= 1:
            continue
        for row_name, name in loaded_rows(ctx, n):  # by identity: a module path decides the package
            row = pp_fact(row_name, ctx.target.version)
            ok = row.get(side) if row is not None else None
            loc = _pp_loc(ctx, n)
            if ok is None:
                why = (f"; {row['why']}" if row and row.get("why") else "")
                srcs = ", ".join(s for s in (row or {}).get("sources", []) if s.startswith("http"))
                yield r.diag(f"stage {n.stage_id} ({side}) runs pipeline_parallel_size {pp} over {name}: omni-pd has no "
                             f"pipeline-parallel fact for {name} on the {side} side in {ctx.release_words()}{why}",
                             loc, severity=Severity.INFO,
                             help="check the connector's PP support for your release before launch" +
                                  (f" ({srcs})" if srcs else ""))
            elif ok is False:
                bad.setdefault(name, []).append((n, side, pp, row))  # type: ignore[arg-type]
            else:
                yield from _pp_requires(ctx, r, n, side, pp, name, row)  # type: ignore[arg-type]
    for name, hits in bad.items():
        row = hits[0][3]
        sides = sorted({s for _, s, _, _ in hits})
        # a kv_both stage (both sides) or a child named twice is one stage: name and relate it once
        once: dict[int, tuple["StageNode", str, int]] = {}
        for n, s, pp, _ in hits:
            once.setdefault(n.stage_id, (n, s, pp))
        stages = list(once.values())
        where = ", ".join(f"stage {n.stage_id} PP {pp}" for n, _, pp in stages)
        on = "" if row.get("prefill") is False and row.get("decode") is False else " on " + " and ".join(sides)
        first = hits[0][0]
        yield r.diag(f"{name} does not support pipeline_parallel_size > 1{on} in {ctx.release_words()} ({where})",
                     _pp_loc(ctx, first),
                     related=[_pp_loc(ctx, n, label=f"stage {n.stage_id} ({s}) PP {pp}") for n, s, pp in stages[1:]],
                     notes=[row["why"]] if row.get("why") else [],
                     help=row.get("fix") or "use pipeline_parallel_size 1 with this connector")


def _pp_loc(ctx: Context, n: "StageNode", label: str | None = None):
    from omni_pd.diagnostics import Location

    if "pipeline_parallel_size" in ctx.cli:
        return Location(file="<command line>", path=("pipeline_parallel_size",), label=label)
    return ctx.sloc(n, "pipeline_parallel_size", value=True, label=label)


def _pp_requires(ctx: Context, r: Rule, n: "StageNode", side: str, pp: int, name: str,
                 row: dict[str, Any]) -> Iterable[Diagnostic]:
    """The conditions of a supported PP row (``requires`` in kv_pp.yaml)."""
    req = row.get("requires") or []
    if "no_hybrid" in req and ctx.model is not None and ctx.model.is_hybrid:
        yield r.diag(f"stage {n.stage_id} ({side}): {name} with pipeline_parallel_size {pp} does not support hybrid "
                     "(HMA) KV cache layouts", _pp_loc(ctx, n),
                     help="use pipeline_parallel_size 1 for this hybrid model (scale with tensor_parallel_size)")
    if "peer_pp_size" in req and ctx.pd_pair is not None:
        for m in ctx.pd_pair:
            blk = ((m.kv or {}).get("kv_connector_extra_config") or {}).get(side)
            if not isinstance(blk, dict):
                continue  # no peer blocks at all: OPD311 and vllm-ascend's defaults apply
            have = blk.get("pp_size")
            if have is None or str(have) != str(pp):
                yield r.diag(f"stage {m.stage_id}: kv_connector_extra_config.{side}.pp_size is "
                             f"{'missing' if have is None else have} but the {side} stage {n.stage_id} runs "
                             f"pipeline_parallel_size {pp}; {name} maps ranks from it",
                             ctx.sloc(m, "kv_transfer_config", "kv_connector_extra_config", side, "pp_size"),
                             help=f"write `pp_size: {pp}` in the `{side}` block on both stages")
