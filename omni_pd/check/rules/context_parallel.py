"""OPD625 pd-dcp-transfer: decode context parallelism the pair's connector can move.

``decode_context_parallel_size`` (DCP) shards each sequence's KV across the ranks of the
TP group (it adds no devices: OPD401 does not count it). A PD pair with DCP > 1 on a side
needs a connector that moves DCP-sharded KV, and some connectors only for some models:
vLLM's pull NIXL (0.29+) moves it for MLA models only and needs the two sides' DCP sizes to divide
each other, its push mode (NixlPushConnector; 0.34's NixlConnector with transfer_mode: push) refuses
DCP > 1; vllm-ascend's MooncakeConnectorV1 moves it (vllm-ascend#4183). Facts per
connector and release: ``presets/targets/context_parallel.yaml``; a connector or release
the table does not know gets an info, never an error.

PASS (vllm-ascend MooncakeConnectorV1, DCP 8 on both sides)::

    stages:
      - {stage_id: 0, tensor_parallel_size: 8, decode_context_parallel_size: 8,
         kv_transfer_config: {kv_connector: MooncakeConnectorV1, kv_role: kv_producer}}
      - {stage_id: 1, tensor_parallel_size: 8, decode_context_parallel_size: 8,
         kv_transfer_config: {kv_connector: MooncakeConnectorV1, kv_role: kv_consumer}}

FAIL (vLLM 0.33 NIXL, a GQA model)::

    stages:
      - {stage_id: 0, tensor_parallel_size: 2, decode_context_parallel_size: 2, kv_transfer_config: {kv_connector: NixlConnector, ...}}
      - {stage_id: 1, tensor_parallel_size: 2, decode_context_parallel_size: 2, kv_transfer_config: {kv_connector: NixlConnector, ...}}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules._shared import follow_same_as, load, row_for
from omni_pd.check.rules.capability import connector_label as loaded_label, connector_row as loaded_row

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode


def table() -> dict[str, Any]:
    """``presets/targets/context_parallel.yaml`` (shape in its comments)."""
    return load("context_parallel.yaml")


def dcp_size(ctx: Context, n: "StageNode") -> int:
    """The stage's ``decode_context_parallel_size`` (flat, nested ``parallel_config`` or a
    CLI flag); 1 when unset or unreadable."""
    nested = n.settings.get("parallel_config")
    v = ctx.cli.get("decode_context_parallel_size")
    if v is None and isinstance(nested, dict):
        v = nested.get("decode_context_parallel_size")
    if v is None:
        v = n.settings.get("decode_context_parallel_size")
    try:
        return max(1, int(v)) if v is not None and not isinstance(v, bool) else 1
    except (TypeError, ValueError):
        return 1


def _runs_push(ctx: Context, node: "StageNode") -> bool:
    """Whether vLLM runs ``node``'s NIXL connector in push mode (0.34: ``NixlConnector`` with
    ``transfer_mode: push`` is NixlPushConnector; :func:`omni_pd.check.rules.nixl_mode.effective_mode`)."""
    from omni_pd.check.rules._kv_release import sides
    from omni_pd.check.rules.nixl_mode import effective_mode

    return any(s.node is node and effective_mode(s, ctx.target.version) == "push" for s in sides(ctx))


def connector_row(name: str, version: tuple[int, int]) -> dict[str, Any] | None:
    """The table's row for ``name`` (a loaded connector's row name: vLLM's registry name, or
    vllm-ascend's registered name) on ``version`` (``same_as`` followed), None when the
    connector or release is not in it."""
    return row_for(follow_same_as(table()["connectors"], name), version)


_Y = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
      "  - {{stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2{p}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_producer, engine_id: p0}}}}\n"
      "  - {{stage_id: 1, devices: \"2,3\", tensor_parallel_size: 2{d}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_consumer, engine_id: d0}}}}\n")
_D2 = ", decode_context_parallel_size: 2"


def _y(p: str = _D2, d: str = _D2, c: str = "NixlConnector") -> str:  # pragma: no mutate block (runs at import only)
    return _Y.format(p=p, d=d, c=c)


_GQA = {"num_kv_heads": 8, "attention": "GQA"}
_MLA = {"num_kv_heads": 1, "attention": "MLA"}


@rule("OPD625", "pd-dcp-transfer", Severity.ERROR,
      "decode context parallelism (DCP > 1) that the pair's connector cannot move on this release",
      fail=_y(), passing=_y(), example_context={"vllm_version": "0.33", "model": _GQA},
      pass_context={"vllm_version": "0.33", "model": _MLA}, labels=("CAP-DCP",),
      examples=(
          Example("NIXL on vLLM 0.28: DCP transfer not pinned (info)", _y(), True,
                  {"vllm_version": "0.28", "model": _MLA}, severity=Severity.INFO, contains="not pinned"),
          Example("NixlPushConnector refuses DCP > 1 at start (0.29+)", _y(c="NixlPushConnector"), True,
                  {"vllm_version": "0.30", "model": _MLA}, contains="cannot move DCP-sharded KV"),
          Example("NIXL on vLLM 0.33: DCP sizes 2 and 4 divide each other", _y(d=", decode_context_parallel_size: 4").replace(
              'devices: "2,3", tensor_parallel_size: 2', 'devices: "2,3,4,5", tensor_parallel_size: 4'), False,
                  {"vllm_version": "0.33", "model": _MLA}),
          Example("NIXL on vLLM 0.33: DCP sizes 2 and 3 do not divide", _y(d=", decode_context_parallel_size: 3").replace(
              'devices: "2,3", tensor_parallel_size: 2', 'devices: "2,3,4", tensor_parallel_size: 3'), True,
                  {"vllm_version": "0.33", "model": _MLA}, contains="divide"),
          Example("no DCP: nothing to move", _y(p="", d=""), False, {"vllm_version": "0.33", "model": _GQA}),
          Example("a connector the table does not know: info, not an error", _y(c="MooncakeConnector"), True,
                  {"vllm_version": "0.33", "model": _MLA}, severity=Severity.INFO),
      ))
def dcp_transfer(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """DCP > 1 on a side of a PD pair: the connector's row (``presets/targets/context_parallel.yaml``)
    decides. Error when the row says DCP is MLA-only and the model is not MLA
    (``--model-info``), or the row needs the two DCP sizes to divide each other and they do
    not (vLLM 0.29+ pull NIXL), or the row says the connector refuses DCP (NixlPushConnector); info when the connector or release is not in the table (the
    transfer is not known either way), or the model is unknown for an MLA-only row. The row is
    the loaded connector's (:func:`omni_pd.check.rules.capability.connector_row`): the table's
    NixlConnector rows are vLLM's class, MooncakeConnectorV1 is vllm-ascend's; a class another
    package's ``kv_connector_module_path`` loads under those names is not in the table. Located
    at decode's ``decode_context_parallel_size`` (prefill's when only prefill sets it).
    Sources: vLLM 0.29-0.34 ``kv_connector/v1/nixl`` (``dcp_size`` in the handshake params;
    ``connector.py`` NixlPushConnector.__init__);
    https://github.com/vllm-project/vllm-ascend/pull/4183,
    https://github.com/vllm-project/vllm-ascend/pull/13965."""
    pair = ctx.pd_pair
    if pair is None or not (pair[0].kv and pair[1].kv):
        return
    p, d = pair
    cp, cd = dcp_size(ctx, p), dcp_size(ctx, d)
    if cp == 1 and cd == 1:
        return
    here = d if cd > 1 else p
    loc = ctx.sloc(here, "decode_context_parallel_size", value=True)
    rel = [ctx.sloc(p if here is d else d, "decode_context_parallel_size", value=True,
                    label=f"{'prefill' if here is d else 'decode'} DCP {cp if here is d else cd}")]
    side = p if (p.kv or {}).get("kv_connector") else d
    name = loaded_label(ctx, side)  # as written, or which package's class a module path loads
    row_name = loaded_row(ctx, side)
    if row_name in ("NixlConnector", "NixlPullConnector") and _runs_push(ctx, side):
        row_name, name = "NixlPushConnector", f"{name} (transfer_mode: push, i.e. NixlPushConnector)"
    row = connector_row(row_name, ctx.target.version)
    both = f"prefill (stage {p.stage_id}) DCP {cp}, decode (stage {d.stage_id}) DCP {cd}"
    if row is None:
        yield r.diag(f"{both}: whether {name} moves DCP-sharded KV on {ctx.release_words()} is not pinned in "
                     "omni-pd's table; not checked", loc, related=rel, severity=Severity.INFO,
                     help="prove one transfer before serving (`omni-pd launch --smoke`)")
        return
    notes = [f"source: {s}" for s in row.get("sources") or []]
    if row.get("transfers") is False:
        yield r.diag(f"{both}: {name} on {ctx.release_words()} cannot move DCP-sharded KV"
                     + (f" ({row['why']})" if row.get("why") else ""), loc, related=rel, notes=notes,
                     help="write `decode_context_parallel_size: 1` on both stages of the PD pair, or use the pull "
                          "NixlConnector (MLA models)")
        return
    if row.get("sizes_divide") and max(cp, cd) % min(cp, cd):
        yield r.diag(f"{both}: {name} on {ctx.release_words()} needs the two DCP sizes to divide each other", loc,
                     related=rel, notes=notes,
                     help=f"write `decode_context_parallel_size: {cp}` on decode (stage {d.stage_id})")
    if row.get("mla_only"):
        m = ctx.model
        if m is None or m.attention is None:
            yield r.diag(f"{both}: {name} on {ctx.release_words()} moves DCP-sharded KV for MLA models only, and "
                         "the model's attention is not known", loc, related=rel, severity=Severity.INFO, notes=notes,
                         help="pass --model-info config.json so validate can tell")
        elif not m.is_mla:
            yield r.diag(f"{both}: {name} on {ctx.release_words()} moves DCP-sharded KV for MLA models only, and "
                         f"this model's attention is {m.attention}", loc, related=rel, notes=notes,
                         help="write `decode_context_parallel_size: 1` on both stages of the PD pair")
