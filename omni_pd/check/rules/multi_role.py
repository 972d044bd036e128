"""OPD628 multi-connector-role: MultiConnector's role comes from its children from vLLM 0.34.

Up to 0.33 a MultiConnector is a KV producer / consumer by its top-level ``kv_role``; from
0.34 by the union of its children's ``kv_role``. A file whose two disagree behaves differently
on the two releases; on 0.34 a prefill whose children produce nothing (or a decode whose
children consume nothing) does not transfer KV. Facts: ``presets/targets/kv_semantics.yaml``
``multi_connector_role``.
"""

from __future__ import annotations

from typing import Any, Iterable

from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules._kv_release import EXTRA, since, sides
from omni_pd.diagnostics import Diagnostic, Severity

PRODUCERS = ("kv_producer", "kv_both")
CONSUMERS = ("kv_consumer", "kv_both")


def _y(pt: str = "kv_producer", pk: str = "kv_producer", dt: str = "kv_consumer", dk: str = "kv_consumer") -> str:  # pragma: no mutate block
    def side(i: int, top: str, kid: str, dev: str, eid: str) -> str:
        return (f"  - {{stage_id: {i}, devices: \"{dev}\", env: {{VLLM_NIXL_SIDE_CHANNEL_PORT: \"{5600 + 100 * i}\"}}, "
                f"kv_transfer_config: {{kv_connector: MultiConnector, kv_role: {top}, engine_id: {eid}, {EXTRA}: "
                f"{{connectors: [{{kv_connector: NixlConnector, kv_role: {kid}}}]}}}}}}\n")
    return "pipeline: llm_pd\nasync_chunk: false\nstages:\n" + side(0, pt, pk, "0", "p0") + side(1, dt, dk, "1", "d0")


def child_roles(kv: dict[str, Any]) -> tuple[bool, bool] | None:
    """``(producer, consumer)`` of a MultiConnector by its children's ``kv_role`` (vLLM 0.34
    ``config/kv_transfer.py _connector_roles``: any child producer / consumer); None when
    there are no children or a child has no valid ``kv_role`` (OPD602 reports those)."""
    kids = (kv.get(EXTRA) or {}).get("connectors") if isinstance(kv.get(EXTRA), dict) else None
    if not isinstance(kids, list) or not kids:
        return None
    roles = [c.get("kv_role") if isinstance(c, dict) else None for c in kids]
    if any(x not in PRODUCERS + CONSUMERS for x in roles):
        return None
    return any(x in PRODUCERS for x in roles), any(x in CONSUMERS for x in roles)


def _words(pc: tuple[bool, bool]) -> str:
    return {(True, True): "a producer and consumer", (True, False): "a producer", (False, True): "a consumer",
            (False, False): "neither producer nor consumer"}[pc]


@rule("OPD628", "multi-connector-role", Severity.WARNING,
      "a MultiConnector's top-level kv_role and its children's roles disagree (vLLM 0.34 takes the children's)",
      fail=_y(pk="kv_both"), passing=_y(), example_context={"vllm_version": "0.33"},
      examples=(
          Example("0.34: prefill's only child consumes, so prefill produces no KV", _y(pk="kv_consumer"), True,
                  {"vllm_version": "0.34"}, severity=Severity.ERROR, contains="does not produce KV"),
          Example("0.34: decode's only child produces, so decode consumes no KV", _y(dk="kv_producer"), True,
                  {"vllm_version": "0.34"}, severity=Severity.ERROR, contains="does not consume KV"),
          Example("0.34: roles agree", _y(), False, {"vllm_version": "0.34"}),
      ))
def multi_connector_role(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Up to vLLM 0.33 ``KVTransferConfig.is_kv_producer``/``is_kv_consumer`` follow a
    MultiConnector's top-level ``kv_role``; from 0.34 they are computed from its children
    (``config/kv_transfer.py`` ``_connector_roles``: any child ``kv_producer``/``kv_both`` makes
    it a producer, any ``kv_consumer``/``kv_both`` a consumer); the top-level ``kv_role`` is
    still required but no longer decides. When the two disagree (top ``kv_producer``,
    children ``kv_both``) the same file takes different scheduler and connector paths on 0.33
    and 0.34 (warning, every release). On 0.34 a prefill of the pair that the children do not
    make a producer, or a decode they do not make a consumer, moves no KV (error). Children
    without a valid ``kv_role`` are OPD602's. Only vLLM's MultiConnector is judged (on npu
    vllm-ascend registers ``AscendMultiConnector`` under that name:
    :func:`omni_pd.compile.connectors.identity.identify`). Without ``--vllm-version`` the
    message says which release it assumed. Sources: vLLM 0.33.0 and 0.34.0 wheels
    (``config/kv_transfer.py``); facts: ``presets/targets/kv_semantics.yaml``."""
    new = ctx.target.version >= since("multi_connector_role")
    first = ".".join(map(str, since("multi_connector_role")))
    for s in sides(ctx):
        if s.ident is None or not s.ident.is_vllm or s.ident.name != "MultiConnector":
            continue
        kv = s.node.kv or {}
        kids = child_roles(kv)
        top = kv.get("kv_role")
        if kids is None or top not in PRODUCERS + CONSUMERS:
            continue
        want_p = s.side == "prefill"
        if new and not (kids[0] if want_p else kids[1]):
            yield r.diag(f"{s.where}: on {ctx.release_words()} MultiConnector's role comes from its children, which make "
                         f"it {_words(kids)} only: the {s.side} " + ("does not produce KV" if want_p else "does not consume KV")
                         + f" (top-level kv_role {top} no longer decides)",
                         ctx.sloc(s.node, "kv_transfer_config", EXTRA, "connectors"), severity=Severity.ERROR,
                         help=f"give the handoff child kv_role: {'kv_producer' if want_p else 'kv_consumer'}")
            continue
        top_pc = (top in PRODUCERS, top in CONSUMERS)
        if top_pc != kids:
            now = f"its children's ({_words(kids)})" if new else f"the top-level kv_role ({_words(top_pc)})"
            yield r.diag(f"{s.where}: MultiConnector's top-level kv_role {top} makes it {_words(top_pc)} up to vLLM 0.33, "
                         f"its children's roles make it {_words(kids)} from vLLM {first}; {ctx.release_words()} "
                         f"uses {now}", ctx.sloc(s.node, "kv_transfer_config", "kv_role", value=True),
                         help="give the top-level kv_role and the children the same role, so every release agrees")
