"""OPD706 router-target, OPD707 router-policy: the inventory's ``router:`` settings against the engines.

The inventory's ``router:`` block says which router runs in front of the PD pair and how
it is set (its keys per kind are ``presets/targets/routers.yaml`` ``keys``; an unknown
key is refused when the inventory is read, OPD006 with the nearest key). Two settings
decide whether the router reaches the engines at all:

* **targets** (OPD706): llm-d sends prefill requests to the prefill pool's target port
  (``prefill_target_port``: the EPP's ``x-prefiller-host-port``); it must be the port the
  prefill vLLM serves on (stage ``port``, else vLLM's ``--port`` default 8000). Otherwise
  the sidecar's call is refused and it falls back to decode-only, silently
  (llm-d/llm-d-benchmark#878).
* **policies** (OPD707): a balancing policy that polls an endpoint the engines do not
  serve balances at random (vllm-router ``power_of_two`` polls ``GET /get_load``, vLLM
  serves ``/load``: vllm-project/router#174). Facts per router kind and release:
  ``presets/targets/routers.yaml`` ``policies``.

PASS (inventory ``router: {kind: llm-d, prefill_target_port: 8000}``)::

    stages:
      - {stage_id: 0, port: 8000, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}}
      - {stage_id: 1, port: 8200, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer}}

FAIL (same router)::

    stages:
      - {stage_id: 0, port: 8200, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}}
      - {stage_id: 1, port: 8200, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer}}
"""

from __future__ import annotations

from typing import Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules.router_protocol import router_kind, table

#: vLLM's ``vllm serve --port`` default (vllm/entrypoints/launchers/cli_args.py)
VLLM_DEFAULT_PORT = 8000

_Y = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
      "  - {{stage_id: 0, devices: \"0\"{p}, kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p0}}}}\n"
      "  - {{stage_id: 1, devices: \"1\"{d}, kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d0}}}}\n")


def _y(p: str = "", d: str = "") -> str:  # pragma: no mutate block (runs at import only)
    return _Y.format(p=p, d=d)


def _inv(router: dict[str, Any]) -> dict[str, Any]:
    return {"inventory": {"hosts": {"host-a": {"accelerator": "cuda", "count": 2}}, "router": router}}


def _port(v: Any) -> int | None:
    try:
        p = int(v)
    except (TypeError, ValueError):
        return None
    return p if 1 <= p <= 65535 else None


def _version(s: Any) -> tuple[int, ...] | None:
    """``"0.1.17"`` -> (0, 1, 17); None for anything else."""
    try:
        return tuple(int(x) for x in str(s).split("."))
    except ValueError:
        return None


@rule("OPD706", "router-target", Severity.ERROR,
      "the router sends prefill requests to a port the prefill stage does not serve on",
      fail=_y(p=", port: 8200", d=", port: 8200"), passing=_y(p=", port: 8000", d=", port: 8200"),
      example_context=_inv({"kind": "llm-d", "prefill_target_port": 8000}), labels=("RT-ROUTER-TARGET",),
      examples=(
          Example("prefill sets no port: vLLM's default 8000 is the target", _y(), False,
                  _inv({"kind": "llm-d", "prefill_target_port": 8000})),
          Example("prefill sets no port, the target is another one", _y(), True,
                  _inv({"kind": "llm-d", "prefill_target_port": 8200}), severity=Severity.WARNING,
                  contains="sets no port"),
          Example("no prefill target port in the router block: not checked", _y(p=", port: 8200"), False,
                  _inv({"kind": "llm-d"})),
      ))
def router_target(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """The router's prefill target must be the prefill stage's own listener: llm-d's
    ``prefill_target_port`` (the pool's target port, sent as ``x-prefiller-host-port``)
    against prefill's ``port`` on its host (vLLM's default 8000 when unset). Error at
    prefill's ``port`` when both are known and differ (the sidecar's call is refused and it
    falls back to decode-only: no KV moves, no error); warning when prefill sets no port
    and the target is not 8000 (``vllm serve`` listens on 8000, ``omni-pd launch``
    allocates its own: write ``port:``). Sources:
    https://github.com/llm-d/llm-d-benchmark/pull/878,
    https://github.com/llm-d/llm-d-router/pull/329; vLLM ``--port`` default 8000."""
    pair = ctx.pd_pair
    router = ctx.inventory.router if ctx.inventory is not None else None
    if pair is None or not isinstance(router, dict) or not ctx.platform_first:
        return
    target = _port(router.get("prefill_target_port"))
    if target is None:
        return
    p, d = pair
    kind = router_kind(router) or "router"
    host = ctx.host_of(p)
    serves = _port(ctx.setting(p, "port"))
    src = ["https://github.com/llm-d/llm-d-benchmark/pull/878", "https://github.com/llm-d/llm-d-router/pull/329"]
    if serves is None:
        if ctx.setting(p, "port") is None and target != VLLM_DEFAULT_PORT:
            yield r.diag(f"the {kind} router sends prefill requests to {host}:{target}, and prefill (stage {p.stage_id}) "
                         f"sets no port: `vllm serve` listens on {VLLM_DEFAULT_PORT} and `omni-pd launch` allocates "
                         f"its own, so the target matches only by luck (decode, stage {d.stage_id}, is reached through "
                         "the router's decode side)", ctx.sloc(p), severity=Severity.WARNING,
                         notes=[f"source: {s}" for s in src],
                         help=f"write `port: {target}` on stage {p.stage_id}")
        return
    if serves == target:
        return
    yield r.diag(f"the {kind} router sends prefill requests to {host}:{target} but prefill (stage {p.stage_id}) serves "
                 f"on port {serves}: connection refused, the router falls back to decode-only on stage {d.stage_id} "
                 "(no KV transfer, no error)", ctx.sloc(p, "port", value=True),
                 notes=[f"source: {s}" for s in src],
                 help=f"write `port: {target}` on stage {p.stage_id}, or set the inventory's "
                      f"`router: {{prefill_target_port: {serves}}}`")


@rule("OPD707", "router-policy", Severity.WARNING,
      "the router's balancing policy polls an endpoint the engines do not serve (it balances at random)",
      fail=_y(), passing=_y(),
      example_context=_inv({"kind": "vllm-router", "prefill_policy": "power_of_two", "decode_policy": "power_of_two"}),
      pass_context=_inv({"kind": "vllm-router", "prefill_policy": "round_robin", "decode_policy": "round_robin"}),
      labels=("RT-ROUTER-POLICY",),
      examples=(
          Example("vllm-router 0.1.17 (the newest release the fact holds for)", _y(), True,
                  _inv({"kind": "vllm-router", "decode_policy": "power_of_two", "version": "0.1.17"}),
                  contains="decode_policy"),
          Example("a vllm-router release after 0.1.17: not pinned (info)", _y(), True,
                  _inv({"kind": "vllm-router", "decode_policy": "power_of_two", "version": "0.1.18"}),
                  severity=Severity.INFO, contains="not read"),
          Example("--policy for both pools", _y(), True, _inv({"kind": "vllm-router", "policy": "power_of_two"}),
                  contains="policy"),
          Example("cache_aware works against vLLM", _y(), False,
                  _inv({"kind": "vllm-router", "prefill_policy": "cache_aware"})),
      ))
def router_policy(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """A balancing policy the router kind cannot run against vLLM engines: a warning at
    prefill's stage naming the router setting(s), the endpoint polled, what vLLM serves
    and the policies to use. Facts per kind and policy, with the router releases they hold
    for (``holds_through``): ``presets/targets/routers.yaml`` ``policies``; a router
    ``version`` above it gets an info (not read). Without ``version`` the newest release
    read is assumed (said in the message). Source:
    https://github.com/vllm-project/router/issues/174 (vllm-router ``power_of_two`` polls
    ``GET /get_load``; vLLM serves ``/load`` with ``server_load``)."""
    pair = ctx.pd_pair
    router = ctx.inventory.router if ctx.inventory is not None else None
    if pair is None or not isinstance(router, dict) or not ctx.platform_first:
        return
    kind = router_kind(router)
    facts = (table().get("policies") or {}).get(kind) or {}
    keys = [k for k in ("prefill_policy", "decode_policy", "policy") if router.get(k) is not None]
    by_policy: dict[str, list[str]] = {}
    for k in keys:
        by_policy.setdefault(str(router[k]), []).append(k)
    p, d = pair
    for policy, where in by_policy.items():
        fact = facts.get(policy)
        if fact is None:
            continue
        holds = str(fact["holds_through"])
        ver = router.get("version")
        newer = ver is not None and (_version(ver) or (0,)) > (_version(holds) or (0,))
        rel = f"{kind} {ver}" if ver is not None else f"{kind} (assumed {holds}, the newest release read; say another with the inventory's `router: {{version: ...}}`)"
        settings = " and ".join(f"`{k}: {policy}`" for k in where)
        use = " or ".join(fact["use"])
        msg = (f"{rel}: {settings} polls {fact['polls']}, which the vLLM engines of prefill (stage {p.stage_id}) and "
               f"decode (stage {d.stage_id}) do not serve (they serve {fact['engine_serves']}): {fact['effect']}")
        if newer:
            yield r.diag(f"{kind} {ver}: {settings} polled {fact['polls']} through {kind} {holds}; release {ver} is not "
                         f"read for it (vLLM serves {fact['engine_serves']})", ctx.sloc(p, "kv_transfer_config"),
                         severity=Severity.INFO, notes=[f"source: {fact['source']}"],
                         help=f"check the router's logs for 404s on the load probe, or use {use}")
            continue
        yield r.diag(msg, ctx.sloc(p, "kv_transfer_config"), related=[ctx.sloc(d, "kv_transfer_config", label="decode")],
                     notes=[f"source: {fact['source']}"],
                     help=f"set the inventory's router " + ", ".join(f"`{k}: {fact['use'][0]}`" for k in where)
                          + f" ({use} balance without the load probe)")
