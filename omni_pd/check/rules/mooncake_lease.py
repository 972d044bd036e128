"""OPD627 mooncake-kv-lease: Mooncake's ``kv_lease_duration`` (vLLM 0.34) on both sides or neither.

vLLM 0.34's MooncakeConnector reads ``kv_connector_extra_config.kv_lease_duration`` (seconds,
> 0; absent: off). With it set, prefill holds a finished request's KV for the lease and decode
renews it through heartbeats; set on one side only, prefill either answers decode's heartbeats
with an error or frees the KV at the lease instead of after 480 s. Up to 0.33 the key is
ignored. Facts: ``presets/targets/kv_semantics.yaml`` ``mooncake_lease``.
"""

from __future__ import annotations

from typing import Iterable

from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules._kv_release import EXTRA, Side, facts, sides, since
from omni_pd.diagnostics import Diagnostic, Severity


def _y(p: str = "", d: str = "", pm: str = "") -> str:  # pragma: no mutate block
    return ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
            f"  - {{stage_id: 0, devices: \"0\", kv_transfer_config: {{kv_connector: MooncakeConnector, "
            f"kv_role: kv_producer, engine_id: p0{pm}{p}}}}}\n"
            f"  - {{stage_id: 1, devices: \"1\", kv_transfer_config: {{kv_connector: MooncakeConnector, "
            f"kv_role: kv_consumer, engine_id: d0{d}}}}}\n")


def _lease(v: str) -> str:
    return f", {EXTRA}: {{kv_lease_duration: {v}}}"


_ASCEND = ", kv_connector_module_path: vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector"


def _reads(s: Side) -> bool:
    return s.ident is not None and s.ident.is_vllm and s.ident.name == facts()["mooncake_lease"]["connector"]


@rule("OPD627", "mooncake-kv-lease", Severity.ERROR,
      "Mooncake's kv_lease_duration is set on one side of the pair only or is not a positive number "
      "(vLLM 0.34), or is ignored (before 0.34)",
      fail=_y(_lease("30")), passing=_y(_lease("30"), _lease("30")),
      example_context={"vllm_version": "0.34"},
      examples=(
          Example("0.34: a lease on decode only: prefill answers every heartbeat with an error", _y(d=_lease("30")),
                  True, {"vllm_version": "0.34"}, contains="is not set on this prefill instance"),
          Example("0.34: a lease of 0 is refused", _y(_lease("0"), _lease("0")), True, {"vllm_version": "0.34"},
                  contains="greater than 0"),
          Example("0.33 ignores kv_lease_duration", _y(_lease("30"), _lease("30")), True, {"vllm_version": "0.33"},
                  severity=Severity.WARNING, contains="ignores"),
          Example("0.34: neither side sets a lease", _y(), False, {"vllm_version": "0.34"}),
          Example("0.34: vllm-ascend's MooncakeConnector (module path) is not vLLM's", _y(_lease("30"), pm=_ASCEND),
                  False, {"vllm_version": "0.34"}),
      ))
def mooncake_kv_lease(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """vLLM 0.34's MooncakeConnector (``v1/mooncake/mooncake_connector.py:703-713,
    1719-1730``) reads ``kv_connector_extra_config.kv_lease_duration`` (float > 0; absent:
    off) on both sides: prefill holds a finished request's KV for the lease and decode renews
    it every lease/6 through heartbeats. Set on decode only, prefill answers each heartbeat
    with ``ERROR "kv_lease_duration is not set on this prefill instance."``; set on prefill
    only, decode sends no heartbeat and prefill frees the KV at the lease (30 s typical)
    instead of after ``VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT`` (480 s), so a late pull gets "KV
    expired on P side before the pull." (error: both sides or neither). A value that is not a
    number greater than 0 is an error. Up to 0.33 the key is not read (warning: it is
    ignored; prefill holds KV for 480 s). Only vLLM's MooncakeConnector is judged: with a
    ``kv_connector_module_path`` naming another package's class (vllm-ascend's
    ``MooncakeConnector`` is its ``MooncakeConnectorV1``) the connector is that package's
    (:func:`omni_pd.compile.connectors.identity.identify`). Without ``--vllm-version`` the
    message says which release it assumed. Sources: vLLM 0.33.0 and 0.34.0 wheels
    (``v1/mooncake/mooncake_connector.py``); facts: ``presets/targets/kv_semantics.yaml``."""
    f = facts()["mooncake_lease"]
    key, tgt = f["key"], ctx.target
    new = tgt.version >= since("mooncake_lease")
    mine = [s for s in sides(ctx) if _reads(s)]
    bad: set[int] = set()
    for s in mine:
        if key not in s.extra:
            continue
        v = s.extra[key]
        loc = ctx.sloc(s.node, "kv_transfer_config", EXTRA, key, value=True)
        if not new:
            yield r.diag(f"{s.where}: {ctx.release_words()}'s MooncakeConnector ignores kv_lease_duration (read from "
                         f"vLLM {f['since']}): prefill holds un-pulled KV for VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT "
                         f"({f['before_s']} s)", loc, severity=Severity.WARNING,
                         help=f"remove it, or pass --vllm-version {f['since']} if the engines run it")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            bad.add(id(s))
            yield r.diag(f"{s.where}: kv_lease_duration {v!r}: {ctx.release_words()}'s MooncakeConnector needs a "
                         "number of seconds greater than 0", loc,
                         help="give the lease in seconds (e.g. 30) on both sides, or remove it on both")
    if not new or len(mine) != 2 or ctx.pd_pair is None:
        return
    p, d = mine
    if (key in p.extra) == (key in d.extra) or bad:
        return
    if key in d.extra:
        yield r.diag(f"{d.where} sets kv_lease_duration and {p.where} does not: on {ctx.release_words()} prefill "
                     "answers each of decode's lease heartbeats with ERROR \"kv_lease_duration is not set on this "
                     "prefill instance.\"", ctx.sloc(d.node, "kv_transfer_config", EXTRA, key, value=True),
                     related=[ctx.sloc(p.node, "kv_transfer_config", label="prefill: no kv_lease_duration")],
                     help=f"set kv_lease_duration: {d.extra[key]} on prefill too, or remove it from decode")
    else:
        yield r.diag(f"{p.where} sets kv_lease_duration and {d.where} does not: on {ctx.release_words()} decode sends "
                     f"no lease heartbeats, so prefill frees the KV after {p.extra[key]} s instead of "
                     f"{f['before_s']} s and a late pull fails (\"KV expired on P side before the pull.\")",
                     ctx.sloc(p.node, "kv_transfer_config", EXTRA, key, value=True),
                     related=[ctx.sloc(d.node, "kv_transfer_config", label="decode: no kv_lease_duration")],
                     help=f"set kv_lease_duration: {p.extra[key]} on decode too, or remove it from prefill")
