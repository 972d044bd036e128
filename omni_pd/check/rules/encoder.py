"""Encoder-disaggregation topology rules (E -> PD, E -> P -> D): OPD616-OPD619.

Connector names, roles, options per release and producer/consumer along the edges are
OPD614/OPD615 (omni_pd/check/rules/ec_connector.py, facts in
presets/targets/ec_connectors.yaml); these rules check what the topology adds: which
stage consumes (the one that runs prefill), the shared storage both sides must see,
what the encoder-only instance may carry, and the model. Layouts: ``omni-pd expand --encoder-split
1e1pd|1e1p1d`` (docs/encoder-split.md).

Every rule here runs on every platform of ``--all-platforms``: an overlay may set a stage's
``ec_transfer_config`` (validate merges a finding the base platform already made).
"""

from __future__ import annotations

from typing import Any, Iterable

from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.diagnostics import Diagnostic, Severity

_EPD = ("pipeline: llm_1e1p1d\n"
        "stages:\n"
        "  - {{stage_id: 0, devices: \"2\"{e}, ec_transfer_config: {{ec_connector: ECExampleConnector, ec_role: ec_producer"
        "{es}}}}}\n"
        "  - {{stage_id: 1, devices: \"0\", kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_producer, "
        "engine_id: p}}{p}}}\n"
        "  - {{stage_id: 2, devices: \"1\", kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_consumer, "
        "engine_id: d}}{d}}}\n")
_CONS = ", ec_transfer_config: {{ec_connector: ECExampleConnector, ec_role: ec_consumer{s}}}"
_S = ", ec_connector_extra_config: {{shared_storage_path: {}}}"


def _epd(e: str = "", es: str = "", p: str | None = None, d: str = "") -> str:  # pragma: no mutate block (runs at import only)
    return _EPD.format(e=e, es=es, p=_CONS.format(s="") if p is None else p, d=d)


def _ec(n: Any) -> dict[str, Any] | None:
    ec = n.settings.get("ec_transfer_config")
    return ec if isinstance(ec, dict) else None


def _role(n: Any) -> str | None:
    ec = _ec(n)
    return str(ec.get("ec_role")) if ec and ec.get("ec_role") else None


def _producers(ctx: Context) -> list:
    return [n for n in (ctx.topology.stages if ctx.topology else ()) if _role(n) == "ec_producer"]


@rule("OPD616", "ec-consumer-not-prefill", Severity.ERROR,
      "the EC consumer must be the stage that runs prefill (the prefill half of a PD pair)",
      fail=_epd(p="", d=_CONS.format(s="")), passing=_epd(),
      examples=(
          Example("both halves consume: decode loads encoder outputs it never uses",
                  _epd(d=_CONS.format(s="")), True, severity=Severity.WARNING, contains="decode"),
          Example("E -> PD: the combined instance consumes",
                  "pipeline: llm_1e1pd\nstages:\n"
                  "  - {stage_id: 0, ec_transfer_config: {ec_connector: ECExampleConnector, ec_role: ec_producer}}\n"
                  "  - {stage_id: 1, ec_transfer_config: {ec_connector: ECExampleConnector, ec_role: ec_consumer}}\n",
                  False),
      ))
def ec_consumer_is_prefill(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """With an encoder-only producer E, the instance that runs the prompt loads E's outputs:
    in E -> P -> D that is prefill (vLLM docs/features/disagg_encoder.md: "the Prefill
    instance receives cache exactly the same as the disaggregated encoder flow"; decode gets
    the KV cache of the whole prompt, so it never runs the encoder; Source: that doc). Prefill without
    ``ec_role: ec_consumer`` encodes every item again (silently: the answer is right, E's
    work is wasted); an ec_consumer on decode loads nothing it uses (warning)."""
    pair = ctx.pd_pair
    if pair is None or not _producers(ctx):
        return
    p, d = pair
    if _role(p) not in ("ec_consumer", "ec_both"):
        yield r.diag(f"stage {p.stage_id} (prefill) is not an ec_consumer: it runs the prompt and would encode "
                     f"every image/audio again; the encoder stage's outputs are never used",
                     ctx.sloc(p, "ec_transfer_config") if _ec(p) else ctx.sloc(p),
                     related=[ctx.sloc(e, "ec_transfer_config", "ec_role", value=True, label="the encoder (producer)")
                              for e in _producers(ctx)],
                     help="give the prefill stage the producer's ec_transfer_config with `ec_role: ec_consumer`")
    if _role(d) in ("ec_consumer", "ec_both"):
        yield r.diag(f"stage {d.stage_id} (decode) is an ec_consumer: decode receives the prompt's KV cache from "
                     "prefill and never runs the encoder", ctx.sloc(d, "ec_transfer_config", "ec_role", value=True),
                     severity=Severity.WARNING if _role(p) in ("ec_consumer", "ec_both") else None,
                     help="move ec_transfer_config (ec_consumer) to the prefill stage; remove it from decode")


@rule("OPD617", "ec-shared-storage", Severity.ERROR,
      "producer and consumers of a shared-storage EC connector must use one directory they all reach",
      fail=_epd(es=_S.format("/mnt/ec")), passing=_epd(es=_S.format("/mnt/ec"), p=_CONS.format(s=_S.format("/mnt/ec"))),
      examples=(
          Example("E on another host: the directory must be a shared filesystem",
                  _epd(es=_S.format("/mnt/ec"), p=_CONS.format(s=_S.format("/mnt/ec"))), True,
                  {"inventory": {"hosts": {"a": {"address": "10.0.0.1"}, "b": {"address": "10.0.0.2"}},
                                 "placement": {"all": "a", "0": "b"}}},
                  severity=Severity.WARNING, contains="shared filesystem"),
          Example("both sides on vLLM's default /tmp", _epd(), False),
      ))
def ec_shared_storage(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """ECExampleConnector writes ``<shared_storage_path>/<mm_hash>/encoder_cache.safetensors``
    on the producer and looks the same path up on the consumer (default ``/tmp``; vLLM
    0.30.0 ec_connector/example_connector.py). Different paths: the consumer never finds a
    file and re-encodes everything, silently (Source: that file). Sides placed on different hosts (inventory)
    need that directory on a shared filesystem mounted at the same path (warning: omni-pd
    cannot see mounts)."""
    from omni_pd.compile import ec_connectors

    nodes = [n for n in (ctx.topology.stages if ctx.topology else ()) if _ec(n)]
    prods = [n for n in nodes if _role(n) in ("ec_producer", "ec_both")]
    if not prods:
        return
    for prod in prods:
        c = ec_connectors.get(str(_ec(prod).get("ec_connector") or ""))  # type: ignore[union-attr]
        if c is None or c.storage_key is None:
            continue
        path = c.storage_path(_ec(prod))  # type: ignore[arg-type]
        for cons in nodes:
            if cons is prod or _role(cons) not in ("ec_consumer", "ec_both"):
                continue
            if str(_ec(cons).get("ec_connector")) != c.name:  # type: ignore[union-attr]
                continue
            other = c.storage_path(_ec(cons))  # type: ignore[arg-type]
            key = ("ec_transfer_config", "ec_connector_extra_config", c.storage_key)
            if other != path:
                yield r.diag(f"stage {cons.stage_id} reads encoder outputs from {other} but stage {prod.stage_id} "
                             f"writes them to {path}: every item would be encoded again",
                             # a side that does not set the directory: its ec_transfer_config (stage_path
                             # falls back to the nearest key the stage has)
                             ctx.sloc(cons, *key),
                             related=[ctx.sloc(prod, *key, label="the producer's directory")],
                             help=f"set `{c.storage_key}: {path}` on both sides")
            elif ctx.inventory is not None and ctx.host_of(cons) != ctx.host_of(prod):
                yield r.diag(f"stages {prod.stage_id} and {cons.stage_id} run on different hosts "
                             f"({ctx.host_of(prod)}, {ctx.host_of(cons)}): {path} must be a shared filesystem "
                             "mounted at the same path on both", ctx.sloc(cons, "ec_transfer_config"),
                             severity=Severity.WARNING,
                             help="mount one shared directory on both hosts, or place the encoder with its consumer")


@rule("OPD618", "encoder-has-kv", Severity.ERROR,
      "the encoder-only instance carries a KV connector it cannot use",
      fail=_epd(e=", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: e}"),
      passing=_epd())
def encoder_has_kv(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """An ``ec_producer`` that is not a consumer runs the multimodal encoder only (vLLM 0.30.0
    config/vllm.py ``_resolve_mm_encoder_only`` switches ``mm_encoder_only`` on and prefix
    caching off: it "runs no language model, so it holds no KV cache"). A
    ``kv_transfer_config`` there has nothing to send, and a KV producer role would make
    routers and validators take E for a prefill instance. Source: that function."""
    for n in _producers(ctx):
        if isinstance(n.kv, dict) and n.kv:
            yield r.diag(f"stage {n.stage_id} is the encoder-only instance (ec_producer) but has a kv_transfer_config "
                         f"({n.kv.get('kv_connector')}): it runs no language model and holds no KV cache",
                         ctx.sloc(n, "kv_transfer_config"), help="remove kv_transfer_config from the encoder stage")


@rule("OPD619", "encoder-needs-multimodal", Severity.ERROR,
      "an encoder-only instance needs a multimodal model",
      fail=_epd(), passing=_epd(),
      example_context={"model": {"model_type": "qwen2", "multimodal": False}},
      pass_context={"model": {"model_type": "qwen3_omni_moe", "multimodal": True}})
def encoder_needs_multimodal(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """vLLM refuses to start an ``ec_producer`` on a model without a multimodal config ("An
    EC producer-only instance requires a multimodal model.": vLLM 0.30.0 config/vllm.py
    ``_resolve_mm_encoder_only``; Source: that function). Checked with ``--model-info`` (config.json with no
    ``vision_config``/``audio_config``, also under ``thinker_config``)."""
    if ctx.model is None or ctx.model.multimodal is not False:
        return
    for n in _producers(ctx):
        yield r.diag(f"stage {n.stage_id} is an encoder-only instance but the model "
                     f"({ctx.model.model_type or 'from --model-info'}) has no vision or audio encoder",
                     ctx.sloc(n, "ec_transfer_config", "ec_role", value=True),
                     help="encoder disaggregation is for multimodal models; serve a text model without the encoder stage")


_CPU = ", ec_connector_extra_config: {{ec_cpu_bytes: 1073741824, ec_enable_nixl: true}}"
_EPD_CPU = ("pipeline: llm_1e1p1d\n"
            "stages:\n"
            "  - {{stage_id: 0, devices: \"2\"{e}, ec_transfer_config: {{ec_connector: ECCPUConnector, "
            "ec_role: ec_producer" + _CPU + "}}}}\n"
            "  - {{stage_id: 1, devices: \"0\", env: {{VLLM_NIXL_SIDE_CHANNEL_PORT: \"5600\"}}, kv_transfer_config: "
            "{{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}}, ec_transfer_config: "
            "{{ec_connector: ECCPUConnector, ec_role: ec_consumer" + _CPU + "}}}}\n"
            "  - {{stage_id: 2, devices: \"1\", env: {{VLLM_NIXL_SIDE_CHANNEL_PORT: \"5601\"}}, kv_transfer_config: "
            "{{kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}}}\n")


@rule("OPD620", "ec-port-conflict", Severity.ERROR,
      "an EC connector port collides with another port on the same host",
      fail=_EPD_CPU.format(e=""), passing=_EPD_CPU.format(e=", env: {VLLM_EC_SIDE_CHANNEL_PORT: \"5602\"}"),
      example_context={"vllm_version": "0.30"},
      examples=(
          Example("E on its own host", _EPD_CPU.format(e=""), False,
                  {"vllm_version": "0.30", "inventory": {"hosts": {"a": {}, "b": {}}, "placement": {"all": "a", "0": "b"}}}),
          Example("ECMooncakeConnector consumer ec_port + TP ranks over the NIXL range",
                  "pipeline: llm_1e1p1d\nstages:\n"
                  "  - {stage_id: 0, ec_transfer_config: {ec_connector: ECMooncakeConnector, ec_role: ec_producer}}\n"
                  "  - {stage_id: 1, tensor_parallel_size: 2, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5600\"}, "
                  "kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}, "
                  "ec_transfer_config: {ec_connector: ECMooncakeConnector, ec_role: ec_consumer, ec_port: 5600}}\n"
                  "  - {stage_id: 2, tensor_parallel_size: 2, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5601\"}, "
                  "kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}\n",
                  True, {"vllm_version": "0.30"}, contains="port 5601: stage 1's EC control"),
      ))
def ec_port_conflict(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """EC connectors bind ports too (``ports`` in presets/targets/ec_connectors.yaml):
    ECCPUConnector's producer its ZMQ side channel ``VLLM_EC_SIDE_CHANNEL_PORT`` (default
    5601: the port ``expand`` gives decode's NIXL side channel after prefill's 5600),
    ECMooncakeConnector's consumer ``ec_port`` + rank (default 14579, also P2pNccl's
    ``kv_port`` default). Each must be disjoint from every other range on its host: the
    KV connector and API ports of OPD501 (omni_pd/check/rules/ports.py ``bound_ports``) and the other stages'
    EC ports. Source: vLLM 0.30.0 envs.py, ec_connector/cpu/scheduler/__init__.py,
    ec_connector/mooncake/config.py."""
    from omni_pd.check.rules.ports import bound_ports
    from omni_pd.compile.ec_connectors.base import ec_ports

    if ctx.topology is None:
        return
    ranges: list[tuple[str, int, int, str, Any, bool, Any]] = []  # host, port, span, purpose, node, is_ec, loc
    for n in ctx.topology.stages:
        host = ctx.host_of(n)
        for b in bound_ports(ctx, n):
            ranges.append((host, b.port, b.span, b.purpose, n, False, b.loc))
        ec = _ec(n)
        if ec:
            par = ctx.parallel(n)
            for u in ec_ports(ec, n.env, par["tensor_parallel_size"], par["data_parallel_size"], ctx.target.version):
                loc = (ctx.sloc(n, "env", u.env, value=True) if u.env else
                       ctx.sloc(n, "ec_transfer_config", u.key, value=True) if u.key else
                       ctx.sloc(n, "ec_transfer_config", "ec_connector", value=True))
                ranges.append((host, u.port, u.span, u.purpose + ("" if (u.env or u.key) else " default"), n, True, loc))
    seen: set = set()
    for i, a in enumerate(ranges):
        for b in ranges[i + 1:]:
            if a[0] != b[0] or not (a[5] or b[5]) or a[4].stage_id == b[4].stage_id:
                continue
            if a[1] < b[1] + b[2] and b[1] < a[1] + a[2]:
                ec_side, other = (a, b) if a[5] else (b, a)
                key = (ec_side[4].stage_id, other[4].stage_id, max(a[1], b[1]))
                if key in seen:
                    continue
                seen.add(key)
                yield r.diag(f"port {max(a[1], b[1])}: stage {ec_side[4].stage_id}'s {ec_side[3]} collides with "
                             f"stage {other[4].stage_id}'s {other[3]}", ec_side[6],
                             related=[other[6]],
                             help="give the EC connector its own port (VLLM_EC_SIDE_CHANNEL_PORT / ec_port) "
                                  "outside every other range on that host")
