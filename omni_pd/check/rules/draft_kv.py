"""OPD624 draft-kv-not-transferred: a separate draft model's KV over the pair's connector.

A speculative_config with ``model:`` of a separate draft model (a draft_model, an MTP
assistant such as Gemma 4's ``-assistant``) has KV cache groups of its own. NixlConnector
does not move them: before vllm#51718 decode fails at start registering them, after it
NIXL skips them and decode rebuilds the draft KV for every prompt (vllm#54926). Facts per
connector and release: ``presets/targets/speculative.yaml`` ``draft_kv``.

PASS (an MTP method built into the target model)::

    stages:
      - {stage_id: 0, speculative_config: {method: deepseek_mtp, num_speculative_tokens: 3}, ...}
      - {stage_id: 1, speculative_config: {method: deepseek_mtp, num_speculative_tokens: 3}, ...}

FAIL (vLLM 0.30, NIXL)::

    stages:
      - {stage_id: 0, speculative_config: {method: mtp, model: org/assistant}, ...}
      - {stage_id: 1, speculative_config: {method: mtp, model: org/assistant}, ...}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules.capability import connector_label, connector_row
from omni_pd.check.rules.speculative import _DRAFT, _E3, _MTP, _v, _y, method_of, spec_config, table

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode


def separate_draft(ctx: Context, n: "StageNode") -> str | None:
    """The separate draft model stage ``n`` loads (``speculative_config.model`` of a
    draft_model / MTP-assistant method, ``presets/targets/speculative.yaml``
    ``draft_kv.separate_draft_methods`` and any ``*_mtp``), else None."""
    spec = spec_config(ctx, n)
    m = method_of(spec)
    if not spec or not spec.get("model") or m is None:
        return None
    kinds = table()["draft_kv"]["separate_draft_methods"]
    return str(spec["model"]) if (m in kinds or m.endswith("_mtp")) else None


@rule("OPD624", "draft-kv-not-transferred", Severity.WARNING,
      "a separate draft model's KV is not moved by the connector: decode rebuilds it per prompt (or fails at start)",
      fail=_y(p=_DRAFT, d=_DRAFT), passing=_y(p=_MTP.replace("N", "3"), d=_MTP.replace("N", "3")),
      example_context={"vllm_version": "0.30"}, labels=("CAP-SPEC-DRAFT-KV",),
      examples=(
          Example("vLLM 0.27 (before vllm#51718): decode fails at start", _y(p=_DRAFT, d=_DRAFT), True,
                  {"vllm_version": "0.27"}, severity=Severity.ERROR, contains="KeyError"),
          Example("vLLM 0.28: not pinned (warning naming both outcomes)", _y(p=_DRAFT, d=_DRAFT), True,
                  {"vllm_version": "0.28"}, contains="not pinned"),
          Example("MooncakeConnector: not this connector's fact", _y(p=_DRAFT, d=_DRAFT, c="MooncakeConnector"), False,
                  {"vllm_version": "0.30"}),
          Example("EAGLE3 head: not a separate draft model in the table", _y(p=_E3, d=_E3), False,
                  {"vllm_version": "0.30"}),
      ))
def draft_kv_not_transferred(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """A separate draft model (``speculative_config`` with ``model:`` of a draft model or an
    MTP assistant, e.g. Gemma 4's ``-assistant``) on a pair of vLLM's NixlConnector (a class
    another package's ``kv_connector_module_path`` loads under that name is not judged): NIXL excludes
    the draft model's KV cache groups from its transfer groups, so decode rebuilds the
    draft KV for every prompt and the speculation gives no speed-up (warning, vLLM 0.30 on,
    vllm#54926 open). Before vllm#51718 + #53779 (0.27 and before) decode fails at start
    with ``KeyError 'draft_model.layers.0.self_attn.attn'`` (error); 0.28-0.29 are not
    pinned (warning naming both). Located at decode's ``speculative_config``. Table:
    ``presets/targets/speculative.yaml`` ``draft_kv``. Sources:
    https://github.com/vllm-project/vllm/issues/54926,
    https://github.com/vllm-project/vllm/pull/51718,
    https://github.com/vllm-project/vllm/pull/53779."""
    pair = ctx.pd_pair
    if pair is None or not (pair[0].kv and pair[1].kv):
        return
    p, d = pair
    t = table()["draft_kv"]
    if connector_row(ctx, p) not in t["connectors"]:
        return  # vLLM's NIXL classes only: another package's class of that name is not judged
    name = connector_label(ctx, p)
    dp_, dd_ = separate_draft(ctx, p), separate_draft(ctx, d)
    if dp_ is None and dd_ is None:
        return
    here = d if dd_ is not None else p
    draft = dd_ or dp_
    other = p if here is d else d
    ver = ctx.target.version
    notes = [f"source: {s}" for s in t["sources"]]
    base = (f"stage {here.stage_id} ({'decode' if here is d else 'prefill'}) speculates with a separate draft model "
            f"({draft}) on a {name} pair with stage {other.stage_id}")
    loc = ctx.sloc(here, "speculative_config", value=True)
    rel = [ctx.sloc(other, "speculative_config", value=True, label=f"stage {other.stage_id}")]
    if ver <= _v(t["crash_last"]):
        yield r.diag(f"{base}: on {ctx.release_words()} (before vllm#51718) decode fails at start registering the "
                     "draft KV caches with NIXL (KeyError 'draft_model.layers.0.self_attn.attn')", loc, related=rel,
                     severity=Severity.ERROR, notes=notes,
                     help="drop the draft model's speculative_config from both stages, or target a vLLM release with "
                          "vllm#51718 (0.30 assumed: `--vllm-version 0.30`)")
        return
    pinned = ver >= _v(t["skip_since"])
    effect = ("NIXL skips the draft model's KV cache groups (vllm#54926), so decode rebuilds the draft KV for every "
              "prompt and the speculation gives no speed-up")
    if not pinned:
        effect = (f"vllm#51718 is not pinned for {ctx.release_words()}: either decode fails at start "
                  f"(KeyError 'draft_model.layers.0.self_attn.attn') or {effect}")
    else:
        effect = f"on {ctx.release_words()} {effect}"
    yield r.diag(f"{base}: {effect}", loc, related=rel, notes=notes,
                 help="measure decode's draft acceptance before relying on it, or use an MTP method built into the "
                      "target model (e.g. `method: deepseek_mtp` without `model:`) or a pattern-based method (ngram) "
                      "on decode")
