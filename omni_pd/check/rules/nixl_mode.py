"""OPD626 nixl-transfer-mode: NixlConnector's ``transfer_mode`` (pull | push), read from vLLM 0.34.

vLLM 0.34's connector factory resolves ``kv_connector: NixlConnector`` with
``kv_connector_extra_config.transfer_mode`` ``pull`` (the default) or ``push`` to
NixlPullConnector / NixlPushConnector and raises on any other value; up to 0.33 the factory
ignores the key and NixlConnector always pulls, so a push config written for 0.34 silently pulls
there. Pull and push never pair: the mode is part of NIXL's handshake compat hash. Facts:
``presets/targets/kv_semantics.yaml`` ``nixl_transfer_mode``.
"""

from __future__ import annotations

from typing import Iterable

from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules._kv_release import EXTRA, Side, facts, sides, since
from omni_pd.diagnostics import Diagnostic, Severity

_NIXL = ("NixlConnector", "NixlPullConnector", "NixlPushConnector")


def _y(p: str = "", d: str = "", c: str = "NixlConnector", dc: str | None = None) -> str:  # pragma: no mutate block
    return ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
            f"  - {{stage_id: 0, devices: \"0\", kv_transfer_config: {{kv_connector: {c}, kv_role: kv_producer, "
            f"engine_id: p0{p}}}}}\n"
            f"  - {{stage_id: 1, devices: \"1\", env: {{VLLM_NIXL_SIDE_CHANNEL_PORT: \"5700\"}}, kv_transfer_config: "
            f"{{kv_connector: {dc or c}, kv_role: kv_consumer, engine_id: d0{d}}}}}\n")


def _mode(x: str) -> str:
    return f", {EXTRA}: {{transfer_mode: {x}}}"


def effective_mode(s: Side, version: tuple[int, int]) -> str | None:
    """``"pull"`` or ``"push"``: how vLLM ``version`` runs side ``s``'s NIXL connector; None
    for a side that is not vLLM's NIXL or whose ``transfer_mode`` 0.34 refuses."""
    f = facts()["nixl_transfer_mode"]
    if s.ident is None or not s.ident.is_vllm or s.ident.name not in _NIXL:
        return None
    if s.ident.name in f["fixed"]:
        return str(f["fixed"][s.ident.name])
    if version < since("nixl_transfer_mode") or f["key"] not in s.extra:
        return str(f["default"])
    v = s.extra[f["key"]]
    return v if isinstance(v, str) and v in f["values"] else None


@rule("OPD626", "nixl-transfer-mode", Severity.ERROR,
      "NixlConnector's transfer_mode is not pull or push, differs between prefill and decode (vLLM 0.34), "
      "or is ignored (before 0.34)",
      fail=_y(_mode("push")), passing=_y(_mode("push"), _mode("push")),
      example_context={"vllm_version": "0.34"},
      examples=(
          Example("0.34 refuses a transfer_mode other than pull or push", _y(_mode("write"), _mode("write")), True,
                  {"vllm_version": "0.34"}, contains="Invalid NixlConnector transfer_mode"),
          Example("0.33 ignores transfer_mode: a push config silently pulls", _y(_mode("push"), _mode("push")), True,
                  {"vllm_version": "0.33"}, severity=Severity.WARNING, contains="silently pulls"),
          Example("0.34: transfer_mode push on NixlConnector is the same mode as NixlPushConnector",
                  _y(_mode("push"), dc="NixlPushConnector"), False, {"vllm_version": "0.34"}),
          Example("0.34: no transfer_mode on either side pulls on both", _y(), False, {"vllm_version": "0.34"}),
      ))
def nixl_transfer_mode(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """vLLM 0.34 (``kv_connector/factory.py:126-130``) resolves ``kv_connector: NixlConnector``
    by ``kv_connector_extra_config.transfer_mode``: ``pull`` (default) -> NixlPullConnector,
    ``push`` -> NixlPushConnector, anything else -> ``ValueError("Invalid NixlConnector
    transfer_mode ...")`` at engine start (error). Pull and push never pair: the mode is in the
    handshake compat hash (vLLM ``v1/nixl/metadata.py``, NIXL connector version 16 in 0.34), so a
    prefill and decode of one pair that name the same connector with different modes fail every
    handshake (error). Up to 0.33 the factory ignores ``transfer_mode`` and NixlConnector
    pulls, so a push config silently pulls (warning; ``kv_connector: NixlPushConnector`` pushes
    there, from 0.24). Only vLLM's NIXL connector is judged: a ``kv_connector_module_path``
    naming another package's class is that package's connector
    (:func:`omni_pd.compile.connectors.identity.identify`). Without ``--vllm-version`` the
    message says which release it assumed. Sources: vLLM 0.33.0 and 0.34.0 wheels
    (``kv_connector/factory.py``, ``v1/nixl/metadata.py``); facts: ``presets/targets/kv_semantics.yaml``."""
    f = facts()["nixl_transfer_mode"]
    key, tgt = f["key"], ctx.target
    all_sides = sides(ctx)
    new = tgt.version >= since("nixl_transfer_mode")
    for s in all_sides:
        if s.ident is None or not s.ident.is_vllm or s.ident.name != f["connector"] or key not in s.extra:
            continue
        v = s.extra[key]
        loc = ctx.sloc(s.node, "kv_transfer_config", EXTRA, key, value=True)
        if new and not (isinstance(v, str) and v in f["values"]):
            yield r.diag(f"{s.where}: transfer_mode {v!r}: {ctx.release_words()}'s connector factory raises "
                         f"ValueError \"Invalid NixlConnector transfer_mode\" at engine start (pull or push)", loc,
                         help="write transfer_mode: pull (the default) or push, the same on both sides")
        elif not new:
            pushes = " (this push config silently pulls)" if v == "push" else ""
            fix = ("write kv_connector: NixlPushConnector on both sides to push there"
                   if tgt.version >= (0, 24) else "remove transfer_mode: NIXL has no push mode there")
            yield r.diag(f"{s.where}: {ctx.release_words()} ignores kv_connector_extra_config.transfer_mode (read from "
                         f"vLLM {f['since']}): NixlConnector pulls{pushes}", loc, severity=Severity.WARNING,
                         help=f"{fix}, or pass --vllm-version {f['since']} if the engines run it")
    if not new or len(all_sides) != 2 or ctx.pd_pair is None:
        return
    p, d = all_sides
    if p.ident is None or d.ident is None or p.ident.name != d.ident.name:
        return  # different connectors: OPD304 (pd-connector-mismatch) reports the pair
    mp, md = effective_mode(p, tgt.version), effective_mode(d, tgt.version)
    if mp is None or md is None or mp == md:
        return
    at = d if key in d.extra else p
    ver = tgt.nixl_connector_version
    yield r.diag(f"{p.where} runs NIXL {mp} and {d.where} {md} on {ctx.release_words()}: pull and push never pair "
                 f"(the transfer mode is in NIXL's handshake compat hash" + (f", connector version {ver}" if ver else "")
                 + "), so every request fails the handshake",
                 ctx.sloc(at.node, "kv_transfer_config", EXTRA, key, value=True) if key in at.extra
                 else ctx.sloc(at.node, "kv_transfer_config"),
                 related=[ctx.sloc(p.node, "kv_transfer_config", label=f"prefill: {mp}")],
                 help=f"set kv_connector_extra_config.transfer_mode: {mp if key in p.extra else md} on both sides")
