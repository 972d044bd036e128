"""OPD621 hybrid-state-transfer: a hybrid model's state needs a connector that moves it.

A model with recurrent-state layers (Mamba/Mamba2, GDN "linear_attention", short conv;
read from ``--model-info`` config.json: ``layer_types`` and friends, nested
``text_config`` too) keeps per-request state beside its attention KV. Decode can
continue only if the KV connector moves that state, and only vLLM's hybrid KV cache
manager (HMA) keeps the state groups apart: with HMA off vLLM tries to unify every KV
spec into one and stops at start. Whether a connector moves which state, and what vLLM
does with HMA when a connector is set, depends on the release: one table,
``presets/targets/hybrid_kv.yaml``, with the source of each row.

PASS (vLLM 0.30, a GDN model)::

    stages:
      - {stage_id: 0, disable_hybrid_kv_cache_manager: false,
         kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer}}
      - {stage_id: 1, disable_hybrid_kv_cache_manager: false,
         kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_consumer}}

FAIL (vLLM 0.21: MooncakeConnector moves no GDN state before vllm#46807)::

    stages:
      - {stage_id: 0, kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer}}
      - {stage_id: 1, kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_consumer}}

FAIL (any release: HMA switched off for a state model)::

    stages:
      - {stage_id: 0, disable_hybrid_kv_cache_manager: true, kv_transfer_config: {...}}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules._shared import follow_same_as, load, pair_yaml, release as _v, row_for
from omni_pd.check.rules.capability import loaded_rows

if TYPE_CHECKING:
    from omni_pd.check.context import ModelInfo
    from omni_pd.compile.topology import StageNode

#: state kind -> how messages name it
KIND_WORDS = {"gdn": "GDN (linear-attention)", "mamba": "Mamba", "other": "recurrent-state"}


def table() -> dict[str, Any]:
    """``presets/targets/hybrid_kv.yaml`` (shape in the file's header)."""
    return load("hybrid_kv.yaml")


def state_kind(model: "ModelInfo | None") -> tuple[str, str] | None:
    """(kind, evidence) when the model has recurrent-state layers, else None.

    ``kind``: ``gdn`` | ``mamba`` | ``other``; ``evidence``: the config fact, e.g.
    ``"layer_types has linear_attention"``."""
    if model is None:
        return None
    t = table()
    mtypes = set(model.model_types or ()) | ({model.model_type} if model.model_type else set())
    gdn_model = bool(mtypes & set(t["gdn_model_types"]))
    for lk in sorted(model.layer_kinds or ()):
        kind = (t["state_layer_types"] or {}).get(lk)
        if kind is not None:
            if lk == "linear_attention":
                kind = "gdn" if gdn_model else "other"
            # mamba2 comes from Nemotron-H's hybrid_override_pattern ("M"), the others from layer lists
            return kind, ("the layer pattern has Mamba2 layers" if lk == "mamba2" else f"layer_types has {lk}")
    for mt in sorted(mtypes):
        kind = (t["state_model_types"] or {}).get(mt)
        if kind is not None:
            return kind, f"model_type {mt}"
    return None


def connector_row(name: str, version: tuple[int, int]) -> dict[str, Any] | None:
    """The hybrid_kv.yaml row for connector ``name`` on ``version`` (``same_as`` followed)."""
    return row_for(follow_same_as(table()["connectors"], name), version)


def hma_mode(version: tuple[int, int]) -> tuple[str | None, list[str]]:
    """(mode, sources) of vLLM's HMA handling with a connector: ``forced_off``, ``auto``
    or None (not pinned; also before the first row)."""
    out: tuple[str | None, list[str]] = (None, [])
    for row in table()["hma"]:
        if version >= _v(row["since"]):
            out = (row.get("mode"), list(row.get("sources") or []))
    return out


_GDN = {"layer_kinds": ["linear_attention", "full_attention"], "model_types": ["qwen3_5_moe", "qwen3_5_moe_text"]}


def _y(c: str = "MooncakeConnector", p: str = "", d: str = "") -> str:  # pragma: no mutate block (runs at import only)
    return pair_yaml(c, p, d)


_OFF = ", disable_hybrid_kv_cache_manager: false"


@rule("OPD621", "hybrid-state-transfer", Severity.ERROR,
      "a hybrid (Mamba/GDN) model's state cannot cross this KV connector on this vLLM release, or the hybrid KV cache manager is off",
      fail=_y(), passing=_y(p=_OFF, d=_OFF),
      example_context={"vllm_version": "0.21", "model": _GDN},
      pass_context={"vllm_version": "0.30", "model": _GDN}, labels=("CAP-HYBRID-SSM",),
      examples=(
          Example("the hybrid KV cache manager switched off", _y(p=", disable_hybrid_kv_cache_manager: true"), True,
                  {"vllm_version": "0.30", "model": _GDN}, contains="disable_hybrid_kv_cache_manager: true"),
          Example("vLLM 0.20 turns HMA off when a connector is set", _y("NixlConnector"), True,
                  {"vllm_version": "0.20", "model": _GDN}, contains="turns the hybrid KV cache manager off"),
          Example("vLLM 0.30 keeps HMA on for a SupportsHMA connector (flag unset)", _y("NixlConnector"), False,
                  {"vllm_version": "0.30", "model": _GDN}),
          Example("a connector that is not SupportsHMA", _y("LMCacheConnectorV1"), True,
                  {"vllm_version": "0.30", "model": _GDN}, contains="LMCacheConnectorV1"),
          Example("release not pinned for the connector: info", _y(p=_OFF, d=_OFF), True,
                  {"vllm_version": "0.26", "model": _GDN}, severity=Severity.INFO, contains="not pinned"),
          Example("sliding-window model is not a state model", _y(), False,
                  {"vllm_version": "0.21", "model": {"layer_kinds": ["sliding_attention", "full_attention"],
                                                      "model_types": ["gemma3_text"]}}),
          Example("Mamba model over Mooncake 0.30: not validated upstream (info)", _y(), True,
                  {"vllm_version": "0.30", "model": {"model_types": ["nemotron_h"]}}, severity=Severity.INFO,
                  contains="Mamba"),
      ))
def hybrid_state(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """A hybrid model (recurrent-state layers: Mamba/Mamba2, GDN ``linear_attention``,
    short conv, read from ``--model-info``: ``layer_types``, ``layers_block_type``,
    ``hybrid_override_pattern``, nested ``text_config``, or the model type) over a PD
    pair needs (1) a KV connector release that moves that state and (2) the hybrid KV
    cache manager on, on both stages. Error when the table says the connector cannot
    move it (e.g. MooncakeConnector before vllm#46807, NixlConnector before vllm#41869,
    a connector that is not SupportsHMA); error for ``disable_hybrid_kv_cache_manager:
    true`` on a stage (vLLM cannot unify the specs and stops at start); error when the
    release turns HMA off because a connector is set (before vllm#41847) and the stage
    does not write ``disable_hybrid_kv_cache_manager: false``; info when the release is
    not pinned for the connector or the flag. Table: ``presets/targets/hybrid_kv.yaml``
    (one row per connector and release, each with its source). Sources:
    https://github.com/vllm-project/vllm/issues/43765,
    https://github.com/vllm-project/vllm/pull/46807,
    https://github.com/vllm-project/vllm/pull/41869,
    https://github.com/vllm-project/vllm/pull/41847,
    https://github.com/ai-dynamo/dynamo/issues/10741; vLLM 0.30 ``vllm/config/vllm.py``
    (HMA rules), ``v1/core/kv_cache_utils.py`` (``unify_hybrid_kv_cache_specs``)."""
    pair = ctx.pd_pair
    found = state_kind(ctx.model)
    if pair is None or found is None or not (pair[0].kv and pair[1].kv):
        return
    kind, evidence = found
    words = KIND_WORDS[kind]
    p, d = pair
    ver = ctx.target.version
    label = ctx.target.label
    rel = ctx.release_words()  # says which release it assumed when none was given
    # 1. HMA explicitly off on a stage: never works with a state model
    for n in (p, d):
        if ctx.setting(n, "disable_hybrid_kv_cache_manager") is True:
            yield r.diag(f"stage {n.stage_id}: disable_hybrid_kv_cache_manager: true with a hybrid {words} model "
                         f"({evidence}): vLLM cannot unify its KV specs and stops at start",
                         ctx.sloc(n, "disable_hybrid_kv_cache_manager", value=True),
                         help="write `disable_hybrid_kv_cache_manager: false` (or drop the key where the release keeps "
                              "the manager on for this connector)")
    mode, hma_src = hma_mode(ver)
    unset = [n for n in (p, d) if ctx.setting(n, "disable_hybrid_kv_cache_manager") is None]
    forced = ("; and " + rel + " turns the hybrid KV cache manager off because kv_transfer_config is set, so "
              "the Mamba and attention specs cannot be unified (EngineCore ValueError at start on "
              + ("both stages" if len(unset) == 2 else f"stage {unset[0].stage_id}") + ")") \
        if mode == "forced_off" and unset else ""
    # the connector prefill loads (each MultiConnector child; a kv_connector_module_path decides
    # which package's class): its row by identity, its name in messages as loaded
    loc = ctx.sloc(p, "kv_transfer_config", "kv_connector", value=True)
    verdicts = []
    for row_name, name in loaded_rows(ctx, p):  # type: ignore[arg-type]
        row = connector_row(row_name, ver)
        verdicts.append((name, row, None if row is None else row.get(kind)))
    bad = [(n, row) for n, row, v in verdicts if v is False]
    if bad:
        name, row = bad[0]
        why = f" ({row['why']})" if row.get("why") else ""
        fix = row.get("fix")
        yield r.diag(f"{name} on {rel} cannot transfer the {words} state groups of a hybrid model "
                     f"({evidence}){why}" + forced, loc,
                     related=[ctx.sloc(d, "kv_transfer_config", "kv_connector", value=True, label="decode")],
                     notes=[f"source: {s}" for s in row.get("sources") or []],
                     help=(f"the state transfer arrives with {fix}: upgrade, or use a connector/version that moves it"
                           if fix else "use a connector/version that moves it (omni-pd explain OPD621 lists them)")
                          + ("; then set disable_hybrid_kv_cache_manager: false on both stages" if forced else ""))
        return
    unknown = [n for n, row, v in verdicts if v is None]
    if mode == "forced_off" and unset:
        for n in unset:
            yield r.diag(f"stage {n.stage_id}: {rel} turns the hybrid KV cache manager off because kv_transfer_config "
                         f"is set, and a hybrid {words} model ({evidence}) cannot run without it (EngineCore ValueError "
                         "at start)", ctx.sloc(n, "kv_transfer_config"),
                         notes=[f"source: {s}" for s in hma_src],
                         help="write `disable_hybrid_kv_cache_manager: false` on both stages of the PD pair")
    elif mode is None and unset and not unknown:
        yield r.diag(f"{rel}: whether a configured KV connector turns the hybrid KV cache manager off is not "
                     f"pinned for this release (vllm#41847), and a hybrid {words} model needs it on", ctx.sloc(unset[0], "kv_transfer_config"),
                     severity=Severity.INFO, help="write `disable_hybrid_kv_cache_manager: false` on both stages")
    for name in unknown:
        yield r.diag(f"{name} on {rel}: moving the {words} state of a hybrid model ({evidence}) is not pinned "
                     "for this connector and release in omni-pd's table; not checked", loc, severity=Severity.INFO,
                     help="prove one transfer before serving (`omni-pd launch --smoke`), or use a release the table "
                          "knows (omni-pd explain OPD621)")
