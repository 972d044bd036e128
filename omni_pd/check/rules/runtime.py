"""Runtime-contract rules (OPD7xx): what the request path must do for a PD pair.

Sources: vllm-omni ``vllm_omni/entrypoints/pd_utils.py`` ``PDDisaggregationMixin``
(``_prepare_prefill_sampling_params``, ``_build_decode_kv_params``), connector routing
fields in ``omni_pd/compile/connectors`` (from vLLM's ``kv_connector/v1/nixl/`` and
``v1/mooncake/`` request handling), the case reports named per rule.
"""

from __future__ import annotations

from typing import Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule

_PD = "pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
_LMC = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
        "  - {{stage_id: 0, devices: \"0\"{e}, kv_transfer_config: {{kv_connector: LMCacheConnectorV1, kv_role: kv_producer}}}}\n"
        "  - {{stage_id: 1, devices: \"1\"{e}, kv_transfer_config: {{kv_connector: LMCacheConnectorV1, kv_role: kv_consumer}}}}\n")
_D = "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_consumer, engine_id: d}}\n"


@rule("OPD701", "prefill-sampling", Severity.WARNING,
      "the prefill stage's sampling keeps stop conditions or min_tokens > 1",
      fail=(_PD + "  - {stage_id: 0, devices: \"0\", default_sampling_params: {max_tokens: 2048, stop_token_ids: [151645]},"
            " kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p}}\n" + _D),
      passing=(_PD + "  - {stage_id: 0, devices: \"0\", default_sampling_params: {max_tokens: 2048},"
               " kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p}}\n" + _D),
      labels=("RT-PREFILL-SAMPLING",))
def prefill_sampling(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """The prefill leg must run ``max_tokens: 1``, ``min_tokens <= 1`` and no stop
    conditions (``stop``, ``stop_token_ids``, ``include_stop_str_in_output``): when the
    one sampled token is EOS or a stop token the request finishes with reason ``stop``,
    MooncakeConnector cancels the KV send, and decode reads missing KV. vllm-omni's
    orchestrator (since PR #2220) overrides these per request, so a prefill stage's
    ``default_sampling_params`` that sets them only matters to routers that do not; the
    warning says so. Sources: https://github.com/vllm-project/vllm-omni/pull/1303,
    https://github.com/vllm-project/vllm-omni/pull/2220."""
    pair = ctx.pd_pair
    if pair is None:
        return
    p = pair[0]
    sp = p.settings.get("default_sampling_params") or {}
    for key in ("stop", "stop_token_ids"):
        if sp.get(key):
            yield r.diag(f"prefill stage {p.stage_id} sets {key}: a stop on the one prefill token ends it with reason `stop` "
                         "and the KV send is cancelled", ctx.sloc(p, "default_sampling_params", key, value=True),
                         help=f"remove `{key}` from the prefill stage; the prefill leg runs max_tokens=1, min_tokens<=1, "
                              "stop=[], stop_token_ids=[], include_stop_str_in_output=false (decode keeps the originals)")
    if sp.get("include_stop_str_in_output"):
        yield r.diag(f"prefill stage {p.stage_id} sets include_stop_str_in_output", ctx.sloc(
            p, "default_sampling_params", "include_stop_str_in_output", value=True), help="remove it from the prefill stage")
    mt = sp.get("min_tokens")
    try:
        bad = mt is not None and int(mt) > 1
    except (TypeError, ValueError):
        bad = False
    if bad:
        yield r.diag(f"prefill stage {p.stage_id} sets min_tokens {mt}; the prefill leg generates one token",
                     ctx.sloc(p, "default_sampling_params", "min_tokens", value=True),
                     help="remove `min_tokens` from the prefill stage (or set it to 1)")


@rule("OPD702", "routing-params", Severity.ERROR,
      "the router does not carry the connector's kv_transfer_params from prefill to decode",
      fail=(_PD + "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p}}\n" + _D),
      passing=(_PD + "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p}}\n" + _D),
      example_context={"inventory": {"hosts": {"host-a": {"accelerator": "cuda", "count": 2}},
                                     "router": {"relays_kv_transfer_params": False}}},
      pass_context={"inventory": {"hosts": {"host-a": {"accelerator": "cuda", "count": 2}}}},
      labels=("RT-PROXY-PARAMS",),
      examples=(
          Example("LMCache shared remote backend needs no relay", _LMC.format(e=", env: {LMCACHE_REMOTE_URL: \"redis://s:6379\"}"),
                  False, {"inventory": {"hosts": {"host-a": {}}, "router": {"relays_kv_transfer_params": False}}}),
          Example("LMCache without a transport: disagg_spec, not NIXL fields", _LMC.format(e=""), True,
                  {"inventory": {"hosts": {"host-a": {}}, "router": {"relays_kv_transfer_params": False}}},
                  contains="LMCacheConnectorV1"),
          Example("Mooncake prefill without engine_id", _PD + "  - {stage_id: 0, devices: \"0\", kv_transfer_config: "
                  "{kv_connector: MooncakeConnector, kv_role: kv_producer}}\n" + _D, True, severity=Severity.WARNING,
                  contains="no engine_id"),
      ))
def routing_params(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Decode only skips the prompt when the request it gets carries prefill's
    ``kv_transfer_params``: NIXL needs ``remote_engine_id``, ``remote_block_ids``,
    ``remote_host``, ``remote_port`` ... with ``do_remote_prefill: true``; Mooncake needs
    ``transfer_id``, ``remote_bootstrap_addr`` and ``remote_engine_id`` (vllm-omni sends the
    last one only when prefill's ``engine_id`` is set: warning when it is not). An
    inventory ``router:`` that does not relay them is an error: answers stay correct but
    decode recomputes every prompt (the passing example is the same YAML without that
    router). The fields are the loaded connector's (``capability.connector_contract``): vLLM's
    NIXL and Mooncake above, vllm-ascend's class when its ``kv_connector_module_path`` loads it.
    Sources: https://github.com/vllm-project/vllm/issues/26896,
    https://github.com/vllm-project/vllm/pull/42703."""
    pair = ctx.pd_pair
    if pair is None or not (pair[0].kv and pair[1].kv):
        return
    p, d = pair
    from omni_pd.check.rules.capability import connector_contract, connector_label

    name = connector_label(ctx, p)  # as written, or which package's class a module path loads
    c = connector_contract(ctx, p)  # the loaded class's fields, not vLLM's of that name
    fields = c.routing_fields if c is not None else ()
    router = ctx.inventory.router if ctx.inventory is not None else None
    from omni_pd.check.rules.lmcache_pd import lmcache_verdict

    lmc = lmcache_verdict(ctx)
    if lmc is not None:
        # LMCache: store mode needs no request fields (decode looks the prefix up);
        # PD mode needs the proxy to hand prefill LMCache's disagg_spec
        if lmc.transport in ("store", "unknown") or router is None or router.get("relays_kv_transfer_params") is not False:
            return
        from omni_pd.compile.connectors.lmcache import PD_ROUTING_FIELDS

        yield r.diag(f"the router in the inventory does not carry kv_transfer_params; with {name} decode would recompute every prompt",
                     ctx.sloc(p, "kv_transfer_config", "kv_connector", value=True),
                     related=[ctx.sloc(d, "kv_transfer_config", label="decode")],
                     notes=[f"LMCache PD mode routing field: {', '.join(PD_ROUTING_FIELDS)} (receiver_host, receiver_init_port, "
                            "receiver_alloc_port, req_id), sent to prefill"],
                     help="in LMCache PD mode use LMCache's disaggregated-prefill proxy, which sends disagg_spec to prefill; "
                          "a shared remote backend (same LMCACHE_REMOTE_URL on both sides) needs no relay")
        return
    if router is not None and router.get("relays_kv_transfer_params") is False:
        # a prefill without kv_connector (OPD304's finding) is not named by an empty string
        yield r.diag("the router in the inventory does not relay kv_transfer_params; "
                     + (f"with {name} " if name else "") + "decode would recompute every prompt",
                     ctx.sloc(p, "kv_transfer_config", "kv_connector", value=True),
                     related=[ctx.sloc(d, "kv_transfer_config", label="decode expects them")],
                     notes=[f"{name} routing fields: {', '.join(fields)}"] if fields else [],
                     help=(f"router for {name}" if name else "the router") + " must send do_remote_decode to P and "
                          "forward P's kv_transfer_params (with do_remote_prefill: true) to D; use vllm-omni's "
                          "orchestrator or a PD-aware proxy")
    # an engine_id of the wrong type (an int: KVTransferConfig's `engine_id: str | None`) is
    # OPD101's finding, not a missing one
    if c is not None and "mooncake" in c.name.lower() and not p.kv.get("engine_id") and \
            ctx.stage_path(p, "kv_transfer_config", "engine_id")[-1:] != ("engine_id",):  # type: ignore[union-attr]
        yield r.diag(f"prefill stage {p.stage_id} has no engine_id: vllm-omni cannot send remote_engine_id to decode",
                     ctx.sloc(p, "kv_transfer_config"), severity=Severity.WARNING,
                     help="add `engine_id: omni-thinker-prefill` to the prefill kv_transfer_config")


_XHOST = {"inventory": {"hosts": {"host-a": {}, "host-b": {}}, "placement": {"all": "host-a", "1": "host-b"}}}


@rule("OPD703", "verify-transfer", Severity.INFO,
      "prove one prefill -> decode KV transfer before serving: validate cannot see this pair's transfer path",
      fail=(_PD + "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p}}\n" + _D),
      passing=(_PD + "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p}}\n" + _D),
      example_context=_XHOST, pass_context={}, labels=("RT-VERIFY-TRANSFER",),
      examples=(
          Example("hybrid-attention model: the physical block size is decided at start",
                  _PD + "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, "
                  "engine_id: p}}\n  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: NixlConnector, "
                  "kv_role: kv_consumer, engine_id: d}}\n", True, {"model": {"attention": "hybrid"}},
                  contains="hybrid-attention model"),
          Example("a router other than omni-pd's", _PD + "  - {stage_id: 0, devices: \"0\", kv_transfer_config: "
                  "{kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p}}\n" + _D, True,
                  {"inventory": {"hosts": {"host-a": {}}, "router": {"relays_kv_transfer_params": True}}},
                  contains="the inventory's router"),
          Example("one host, omni-pd's router, a plain model: nothing validate cannot see", _PD +
                  "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer, "
                  "engine_id: p}}\n" + _D, False, {"model": {"attention": "GQA", "num_kv_heads": 4}}),
      ))
def verify_transfer(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """A PD pair that validates can still move no KV at all: answers stay right and decode
    silently recomputes every prompt. The rules check what the files say; some causes
    only show in a real transfer, and this info names the one that applies: prefill and
    decode on different hosts (the side-channel or bootstrap address and the transport
    must be reachable between them), a hybrid-attention model (``--model-info``: the
    physical block size is derived at start and may differ between prefill and decode,
    vllm#42895), or a router that is not omni-pd's (the inventory's ``router:``; it must
    relay ``kv_transfer_params``, vllm#26896). Then prove one transfer before serving:
    ``omni-pd launch --smoke`` does (decode's
    ``vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`` must grow), or
    send one request and read that counter. On one host, with omni-pd's router and a model
    without hybrid attention, nothing is left that validate cannot see, and the info is
    not shown (it was shown on every PD file, where it said nothing about the file). Once
    per file. Sources: https://github.com/vllm-project/vllm/issues/42895,
    https://github.com/vllm-project/vllm/issues/26896; vLLM ``vllm/v1/metrics/loggers.py``
    (``vllm:prompt_tokens_by_source``), ``vllm/v1/metrics/stats.py`` (its
    ``external_kv_transfer`` source)."""
    pair = ctx.pd_pair
    if pair is None or not ctx.platform_first:
        return
    p, d = pair
    why = []
    if ctx.inventory is not None and ctx.host_of(p) != ctx.host_of(d):
        why.append(f"prefill runs on {ctx.host_of(p)} and decode on {ctx.host_of(d)}")
    if ctx.model is not None and ctx.model.is_hybrid:
        why.append("a hybrid-attention model decides its physical block size at start")
    router = ctx.inventory.router if ctx.inventory is not None else None
    if isinstance(router, dict) and str(router.get("kind") or "") != "omni-pd":
        why.append("the inventory's router is not omni-pd's and must relay kv_transfer_params")
    if not why:
        return
    yield r.diag(f"PD pair stage {p.stage_id} -> {d.stage_id}: {'; '.join(why)}: only a real transfer shows the KV "
                 "arrives; do not report ready before one prefill -> decode transfer succeeded",
                 ctx.sloc(d, "kv_transfer_config"),
                 help="`omni-pd launch --smoke` checks it; by hand: send one request and check that decode's "
                      "vllm:prompt_tokens_by_source_total{source=\"external_kv_transfer\"} grew")


_AUDIO_PD = ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
             "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p}}\n"
             + _D + "  - {stage_id: 2, devices: \"2\"}\n  - {stage_id: 3, devices: \"3\"}\n")


@rule("OPD704", "talker-pd-conditioning", Severity.ERROR,
      "under PD, vllm-omni's Talker gets no prompt rows unless omni-pd's compatibility layer covers the release "
      "and is on (audio output is wrong or fails)",
      fail=_AUDIO_PD.replace("  - {stage_id: 2, devices: \"2\"}",
                             "  - {stage_id: 2, devices: \"2\", env: {OMNI_PD_VLLM_OMNI_TALKER_PD: \"0\"}}"),
      passing=_AUDIO_PD,
      labels=("RT-TALKER-PD",))
def talker_pd_conditioning(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """vllm-omni 0.30 builds the Talker's conditioning (Thinker embeddings and hidden states
    of every prompt and answer token) in the Thinker engine from the rows that engine
    computed. Under PD that engine is decode, which loads the prompt's KV and computes only
    the last prompt token, so the Talker gets no prompt rows while its token ids still
    count the whole prompt: Qwen3-Omni's Talker raises when the answer is shorter than the
    prompt and is conditioned on the wrong rows otherwise; Qwen2.5-Omni's Talker gets no
    payload or shifted rows; and the orchestrator never keeps prefill's rows (it reads
    ``RequestOutput.multimodal_output``, always None). omni-pd's vllm-omni compatibility
    layer hands the Talker prefill's rows (omni_pd/upstream/talker_pd.py) for the pipelines
    and releases presets/targets/vllm_omni_compat.yaml lists. So the rule is silent where
    the layer covers the target release and is on, and an error where it cannot: the
    release (``--vllm-version``) or pipeline is not covered, or ``OMNI_PD_VLLM_OMNI_COMPAT``
    / ``OMNI_PD_VLLM_OMNI_TALKER_PD`` is 0 in the launcher environment (the orchestrator
    patches run in the API process) or in the Talker stage's ``env`` (the merge runs in the
    Talker's worker); a switch in another stage's env changes nothing the Talker reads.
    Checked on vllm-omni 0.30.0 by tests/test_oracle_talker_pd.py (vllm-omni's own
    orchestrator, input processor, payload builders and Talker prefill in the oracle venv),
    whose canary fails when upstream merges prefill's rows itself. Sources: vllm-omni
    ``model_executor/stage_input_processors/qwen3_omni.py`` and ``qwen2_5_omni.py``
    ``thinker2talker_full_payload``, ``models/qwen3_omni/qwen3_omni.py``
    ``talker_preprocess_prefill``, ``engine/orchestrator.py`` ``_route_output``;
    vLLM ``v1/core/sched/scheduler.py`` ``_update_waiting_for_remote_kv``; details in
    omni_pd/compile/talker_pd.py."""
    from omni_pd.compile import talker_pd

    pair = ctx.pd_pair
    if pair is None or ctx.topology is None or not ctx.platform_first:
        return
    found = talker_pd.talker_after_decode(ctx.topology.pipeline)
    if found is None:
        return
    decode, talker = found
    t_node = ctx.topology.node(talker.stage_id)
    g = talker_pd.gap(ctx.topology.pipeline, ctx.target, ctx.env, t_node.env if t_node is not None else None)
    if g is None:
        return
    if g.where == "talker-env" and t_node is not None:
        where = ctx.sloc(t_node, "env", g.var, value=True)
    elif ctx.exists(("pipeline",)):
        where = ctx.loc(("pipeline",), value=True)
    else:
        where = ctx.sloc(pair[1], "kv_transfer_config")
    yield r.diag(talker_pd.message(decode.stage_id, talker.stage_id, g.why), where,
                 related=[ctx.sloc(t_node, label="Talker")] if t_node is not None and t_node.index is not None else [],
                 notes=list(talker_pd.NOTES), help=g.help)
