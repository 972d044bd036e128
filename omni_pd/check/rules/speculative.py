"""OPD315 pd-speculative-mismatch: speculative decoding across a PD pair (OPD624, a separate draft model's KV: omni_pd/check/rules/draft_kv.py).

A model-based speculative method (EAGLE/EAGLE3, MTP and every ``*_mtp``, a draft model,
DFlash, DSpark) loads draft or MTP layers that add KV cache groups, so what prefill
computed and what decode expects must agree on it; a pattern-based method (n-gram,
suffix) adds none and may run on decode alone. NIXL compares the speculative config in
its handshake from vllm#49230 on; before that the pair starts and decode crashes on long
prompts. A *separate* draft model's KV groups are not moved by NIXL at all (vllm#54926):
decode rebuilds them for every prompt. Facts per connector and release:
``presets/targets/speculative.yaml``.

PASS (n-gram on decode only)::

    stages:
      - {stage_id: 0, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}}
      - {stage_id: 1, speculative_config: {method: ngram, num_speculative_tokens: 5},
         kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer}}

FAIL (EAGLE3 on decode only)::

    stages:
      - {stage_id: 0, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}}
      - {stage_id: 1, speculative_config: {method: eagle3, model: org/eagle3-head},
         kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer}}
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules._shared import follow_same_as, load, pair_yaml, release as _v

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode


def table() -> dict[str, Any]:
    """``presets/targets/speculative.yaml`` (shape in the file's comments)."""
    return load("speculative.yaml")


def spec_config(ctx: Context, n: "StageNode") -> dict[str, Any] | None:
    """The stage's ``speculative_config`` as a mapping (a JSON string, as ``--speculative-config``
    takes it, is parsed), with a global CLI flag broadcast; None when unset or unreadable."""
    v = ctx.setting(n, "speculative_config")
    if isinstance(v, str):
        try:
            v = json.loads(v)
        except ValueError:
            return None
    return v if isinstance(v, dict) and v else None


def method_of(spec: dict[str, Any] | None) -> str | None:
    """The effective method: ``method`` lowercased; ``draft_model`` for a ``model:``
    without a method (vLLM ``SpeculativeConfig.__post_init__``); ``ngram`` for prompt-lookup
    keys alone; None when unset or not inferable."""
    if not spec:
        return None
    m = spec.get("method")
    if m:
        return str(m).lower()
    if spec.get("model"):
        return "draft_model"
    if any(k in spec for k in ("prompt_lookup_max", "prompt_lookup_min")):
        return "ngram"
    return None


def model_based(method: str | None, spec: dict[str, Any] | None = None) -> bool:
    """True for a method that loads draft/MTP layers (adds KV cache groups): the table's
    ``model_based`` list, any ``*_mtp``, or an unlisted method with a ``model:``."""
    if method is None:
        return False
    t = table()
    if method in t["model_based"] or method.endswith("_mtp"):
        return True
    return method not in t["pattern_based"] and bool(spec and spec.get("model"))


def _describe(spec: dict[str, Any] | None) -> str:
    m = method_of(spec)
    if m is None or not model_based(m, spec):
        return "none" if m is None else f"only the pattern-based method {m}"
    return f"the model-based speculative method {m}" + (f" (draft {spec['model']})" if spec and spec.get("model") else "")


def _row(name: str) -> dict[str, Any] | None:
    return follow_same_as(table()["mismatch"], name)


def _is_hybrid(ctx: Context) -> bool:
    from omni_pd.check.rules.hybrid_state import state_kind

    return ctx.model is not None and (ctx.model.is_hybrid or state_kind(ctx.model) is not None)




def _y(p: str = "", d: str = "", c: str = "NixlConnector") -> str:  # pragma: no mutate block (runs at import only)
    return pair_yaml(c, p, d)


_E3 = ", speculative_config: {method: eagle3, model: org/eagle3-head, num_speculative_tokens: 3}"
_NG = ", speculative_config: {method: ngram, num_speculative_tokens: 5, prompt_lookup_max: 4}"
_MTP = ", speculative_config: {method: deepseek_mtp, num_speculative_tokens: N}"
_DRAFT = ", speculative_config: {method: mtp, model: org/assistant, num_speculative_tokens: 3}"


@rule("OPD315", "pd-speculative-mismatch", Severity.ERROR,
      "a model-based speculative method (or its draft model) differs between prefill and decode",
      fail=_y(d=_E3), passing=_y(d=_NG), example_context={"vllm_version": "0.30"},
      labels=("XS-SPEC-SYM",),
      examples=(
          Example("the same EAGLE3 setup on both sides", _y(p=_E3, d=_E3), False, {"vllm_version": "0.30"}),
          Example("vLLM 0.25 (before vllm#49230): the handshake passes, long prompts crash decode", _y(d=_E3), True,
                  {"vllm_version": "0.25"}, contains="long prompts crash decode"),
          Example("vLLM 0.28 (with vllm#49230): the handshake fails", _y(d=_E3), True,
                  {"vllm_version": "0.28"}, contains="fails the NIXL handshake"),
          Example("different draft models", _y(p=_E3, d=_E3.replace("org/eagle3-head", "org/other-head")), True,
                  {"vllm_version": "0.30"}, contains="org/other-head"),
          Example("MTP 1 on prefill, 5 on decode, non-hybrid model (vllm-ascend's PD shape)",
                  _y(p=_MTP.replace("N", "1"), d=_MTP.replace("N", "5")), False, {"vllm_version": "0.30"}),
          Example("MTP token counts differ on a hybrid model", _y(p=_MTP.replace("N", "1"), d=_MTP.replace("N", "5")),
                  True, {"vllm_version": "0.30", "model": {"attention": "hybrid"}}, severity=Severity.WARNING,
                  contains="num_speculative_tokens"),
          Example("MooncakeConnector: no handshake compares it (warning)", _y(d=_E3, c="MooncakeConnector"), True,
                  {"vllm_version": "0.30"}, severity=Severity.WARNING),
      ))
def speculative_mismatch(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """A model-based ``speculative_config`` (method + draft model) on one half of a PD pair
    must be the same on the other half: the draft/MTP layers change the KV cache groups
    the connector transfers. NixlConnector: error; from vllm#49230 (first release assumed
    0.28; 0.25 and before lack it) the handshake's compatibility hash refuses the pair,
    before it the pair starts and long prompts crash decode (illegal memory access). Other
    connectors: warning (no handshake compares it; no report pins the effect).
    Pattern-based methods (ngram, ngram_gpu, suffix) on one side only pass.
    ``num_speculative_tokens`` may differ for a non-hybrid model (vllm-ascend's documented
    PD deployments: prefill MTP 1, decode MTP 3-5); for a hybrid (Mamba/GDN) model it is a
    warning (one state slot per speculative token). Located at decode's
    ``speculative_config`` (prefill's when decode has none). Table:
    ``presets/targets/speculative.yaml``. Sources:
    https://github.com/vllm-project/vllm/pull/49230; vLLM 0.33
    ``kv_connector/v1/nixl/metadata.py`` ``compute_nixl_compatibility_hash``;
    vllm-ascend docs GLM5.2.md (PD 1M deployment)."""
    pair = ctx.pd_pair
    if pair is None or not (pair[0].kv and pair[1].kv):
        return
    p, d = pair
    sp, sd = spec_config(ctx, p), spec_config(ctx, d)
    mp, md = method_of(sp), method_of(sd)
    bp, bd = model_based(mp, sp), model_based(md, sd)
    if not (bp or bd):
        return
    here, there = (d, p) if sd is not None else (p, d)
    hs, ts = (sd, sp) if here is d else (sp, sd)
    side, other = ("decode", "prefill") if here is d else ("prefill", "decode")
    loc = ctx.sloc(here, "speculative_config", value=True)
    rel = [ctx.sloc(there, "speculative_config", value=True, label=f"{other} (stage {there.stage_id})")
           if ts is not None else ctx.sloc(there, label=f"{other} (stage {there.stage_id}): no speculative_config")]
    from omni_pd.check.rules.capability import connector_label, connector_row

    side_kv = p if (p.kv or {}).get("kv_connector") else d
    name = connector_label(ctx, side_kv)  # as written, or which package's class a module path loads
    same = bp and bd and mp == md and (sp or {}).get("model") == (sd or {}).get("model")
    if same:
        tp_, td_ = (sp or {}).get("num_speculative_tokens"), (sd or {}).get("num_speculative_tokens")
        if tp_ != td_ and _is_hybrid(ctx):
            yield r.diag(f"prefill (stage {p.stage_id}) runs {mp} with num_speculative_tokens {tp_} and decode "
                         f"(stage {d.stage_id}) with {td_} on a hybrid (Mamba/GDN) model: the recurrent state keeps a "
                         "slot per speculative token, so the state prefill hands over does not fit decode's layout "
                         f"(not pinned for {ctx.release_words()})", loc, related=rel, severity=Severity.WARNING,
                         help=f"write `num_speculative_tokens: {td_}` in prefill's speculative_config too")
        return
    src = ["https://github.com/vllm-project/vllm/pull/49230"]
    row = _row(connector_row(ctx, side_kv))  # the loaded class's row: vLLM's NIXL, not a same-named class
    fix = json.dumps(hs if (hs is not None and model_based(method_of(hs), hs)) else ts, separators=(", ", ": "))
    target_side = there if (hs is not None and model_based(method_of(hs), hs)) else here
    help_ = (f"give stage {target_side.stage_id} the same model-based speculative_config: `speculative_config: {fix}` "
             "(or use a pattern-based method such as ngram on decode only)")
    what = (f"{side} (stage {here.stage_id}) runs {_describe(hs)} and {other} (stage {there.stage_id}) runs "
            f"{_describe(ts)}: the draft layers change the KV cache groups {name or 'the connector'} transfers")
    if row is None:
        yield r.diag(what + f"; {name or 'this connector'} does not compare the speculative config at its handshake, "
                     "and what the mismatch does is not pinned for it", loc, related=rel, severity=Severity.WARNING,
                     notes=[f"source: {s}" for s in src], help=help_)
        return
    ver = ctx.target.version
    if ver >= _v(row["hash_since"]):
        effect = (f"on {ctx.release_words()} (with vllm#49230) every request fails the NIXL handshake "
                  "(compatibility hash mismatch)")
    elif ver <= _v(row["hash_last_without"]):
        effect = (f"on {ctx.release_words()} (before vllm#49230) the handshake passes, short prompts work and long "
                  "prompts crash decode (illegal memory access)")
    else:
        effect = (f"on {ctx.release_words()} (vllm#49230 not pinned for it) either long prompts crash decode or "
                  "every request fails the NIXL handshake")
    yield r.diag(f"{what}; {effect}", loc, related=rel, notes=[f"source: {s}" for s in row.get("sources") or src],
                 help=help_)
