"""OPD705 router-protocol: the router in front of a PD pair speaks its connector's protocol.

Connectors disagree on who talks to whom (``presets/targets/routers.yaml``): NIXL is
*pull* (prefill first, decode gets prefill's ``kv_transfer_params``), vLLM's
MooncakeConnector is *bootstrap* (both legs at once, the router makes the
``transfer_id`` and points decode at the prefill's bootstrap server; prefill answers
nothing to relay), vllm-ascend's MooncakeLayerwiseConnector is *push_front* (decode
first). The inventory's ``router:`` says which router runs (``kind``: omni-pd,
vllm-router, llm-d, dynamo, relay, none; ``protocols`` when it is run in a mode the
kind's row does not show); a router that does not speak the connector's protocol
drives no transfer.

PASS (inventory ``router: {relays_kv_transfer_params: true}``)::

    stages:
      - {stage_id: 0, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}}
      - {stage_id: 1, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer}}

FAIL (same router)::

    stages:
      - {stage_id: 0, kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer}}
      - {stage_id: 1, kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_consumer}}
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable

from omni_pd.diagnostics import Diagnostic
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.diagnostics import Severity


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    """``presets/targets/routers.yaml`` (shape in its header)."""
    from omni_pd.resources import data_dir, load_data

    return dict(load_data(data_dir("presets") / "targets" / "routers.yaml"))


def router_kind(router: dict[str, Any]) -> str | None:
    """The router's kind: ``kind``, else ``relay`` for ``relays_kv_transfer_params: true``
    (None: not said; ``relays_kv_transfer_params: false`` is OPD702's)."""
    if router.get("kind"):
        return str(router["kind"])
    return "relay" if router.get("relays_kv_transfer_params") is True else None


def speaks(router: dict[str, Any]) -> tuple[str, ...]:
    """Protocols the router drives: its ``protocols`` list, else its kind's row."""
    if isinstance(router.get("protocols"), list):
        return tuple(str(p) for p in router["protocols"])
    kind = router_kind(router)
    return tuple((table()["kinds"].get(kind) or {}).get("speaks") or ()) if kind else ()


def _protocol(ctx: Context, node: Any) -> str | None:
    """The request protocol of the connector ``node`` loads (its contract's, by the loaded
    class: vllm-ascend's MooncakeConnector pulls, vLLM's bootstraps); None without a contract."""
    from omni_pd.check.rules.capability import connector_contract

    c = connector_contract(ctx, node)
    return c.router_protocol if c is not None else None


_Y = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
      "  - {{stage_id: 0, devices: \"0\", kv_transfer_config: {{kv_connector: {c}, kv_role: kv_producer, engine_id: p0}}}}\n"
      "  - {{stage_id: 1, devices: \"1\", kv_transfer_config: {{kv_connector: {c}, kv_role: kv_consumer, engine_id: d0}}}}\n")


def _inv(router: dict[str, Any]) -> dict[str, Any]:
    return {"inventory": {"hosts": {"host-a": {"accelerator": "cuda", "count": 2}}, "router": router}}


@rule("OPD705", "router-protocol", Severity.ERROR,
      "the inventory's router does not speak the KV connector's request protocol (pull / bootstrap / decode-first)",
      fail=_Y.format(c="MooncakeConnector"), passing=_Y.format(c="NixlConnector"),
      example_context=_inv({"relays_kv_transfer_params": True}), labels=("RT-PROXY-PARAMS",),
      examples=(
          Example("vllm-router speaks Mooncake's bootstrap protocol (--kv-connector mooncake)", _Y.format(c="MooncakeConnector"),
                  False, _inv({"kind": "vllm-router"})),
          Example("a router run in NIXL mode only", _Y.format(c="MooncakeConnector"), True,
                  _inv({"kind": "vllm-router", "protocols": ["pull"]}), contains="--kv-connector mooncake"),
          Example("a prefill-first router before a decode-first connector",
                  _Y.format(c="MooncakeLayerwiseConnector"), True, {**_inv({"kind": "vllm-router"}), "platform": "npu"},
                  contains="decode first"),
          Example("omni-pd's router speaks every protocol", _Y.format(c="MooncakeConnector"), False, _inv({"kind": "omni-pd"})),
      ))
def router_protocol(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """The router must drive the connector's protocol: a router that relays NIXL-style
    ``kv_transfer_params`` in front of MooncakeConnector (push/bootstrap: the router
    must mint ``transfer_id`` and send decode ``remote_bootstrap_addr``/``remote_engine_id``)
    or a prefill-first router in front of a decode-first connector
    (MooncakeLayerwiseConnector) drives no transfer: requests fail at the router or
    decode recomputes. Error at prefill's ``kv_connector``, naming what to run instead
    (``omni-pd launch``'s router speaks all of them; other routers with the flag or
    release that adds the protocol). The connector's protocol is the contract's
    ``router_protocol`` of the class loaded (``capability.connector_contract``: vLLM's
    MooncakeConnector bootstraps, vllm-ascend's class of that name, loaded by its
    ``kv_connector_module_path``, pulls; an out-of-tree class is not judged); the routers' protocols are ``presets/targets/routers.yaml``. A
    router that relays nothing (``relays_kv_transfer_params: false``) is OPD702's.
    Sources: https://github.com/ai-dynamo/dynamo/pull/9414,
    https://github.com/vllm-project/router/pull/151,
    https://github.com/llm-d/llm-d-router/pull/1193."""
    pair = ctx.pd_pair
    router = ctx.inventory.router if ctx.inventory is not None else None
    if pair is None or not isinstance(router, dict) or not (pair[0].kv and pair[1].kv) or not ctx.platform_first:
        return
    if router.get("relays_kv_transfer_params") is False or router_kind(router) in (None, "none"):
        return
    p, d = pair
    proto = _protocol(ctx, p)
    if proto is None:
        return  # a connector without a router contract (LMCache, NixlPush, MultiConnector, out-of-tree): OPD702/OPD613 say it
    from omni_pd.check.rules.capability import connector_label

    name = connector_label(ctx, p)
    have = speaks(router)
    if proto in have:
        return
    kind = router_kind(router) or "relay"
    t = table()
    others = [f"{k} ({row['speaks'][proto]['how']})" if (row["speaks"][proto] or {}).get("how") else k
              for k, row in t["kinds"].items() if k not in ("omni-pd", kind) and proto in (row.get("speaks") or {})]
    said = f"the inventory's router ({kind}) speaks " + (", ".join(have) if have else "no PD protocol")
    own = ((t["kinds"].get(kind) or {}).get("speaks") or {}).get(proto)
    if own is not None:  # the kind can, run in another mode
        said += f" as configured; {kind} drives {proto} with {own.get('how') or 'its ' + proto + ' mode'}"
    yield r.diag(f"{name} ({proto}): {' '.join(str(t['needs'][proto]).split())}; {said}",
                 ctx.sloc(p, "kv_transfer_config", "kv_connector", value=True),
                 related=[ctx.sloc(d, "kv_transfer_config", label="decode")],
                 notes=[f"{k}: {row['speaks'][proto]['source']}" for k, row in t["kinds"].items()
                        if proto in (row.get("speaks") or {}) and k != "omni-pd"],
                 help="run `omni-pd launch` (its router speaks pull, bootstrap and push_front)"
                      + (f", or a router that speaks {proto}: {', '.join(others)}" if others else ""))
