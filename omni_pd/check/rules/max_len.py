"""OPD316 pd-max-model-len: prefill and decode admit the same prompt lengths.

Each engine refuses a prompt longer than its effective ``max_model_len`` (the stage's
value, else the model's ``max_position_embeddings``: vLLM ``ModelConfig.get_max_model_len``
/ ``_get_and_verify_max_len``). The pair serves what *both* admit. Decode above prefill
admits prompts prefill refuses: under a both-legs-at-once protocol (MooncakeConnector's
bootstrap, SGLang's) decode allocates KV and waits for a transfer that never comes;
under NIXL's prefill-first relay the request fails with HTTP 400 (sglang#31664,
InferenceX#2257). Decode below prefill: prefill computes KV for a prompt that decode
then refuses (wasted prefill work, a 400 after the prefill); a warning.

PASS::

    stages:
      - {stage_id: 0, max_model_len: 9217, kv_transfer_config: {kv_role: kv_producer, ...}}
      - {stage_id: 1, max_model_len: 9217, kv_transfer_config: {kv_role: kv_consumer, ...}}

FAIL (the model's max_position_embeddings 1048576 on decode)::

    stages:
      - {stage_id: 0, max_model_len: 9217, kv_transfer_config: {kv_role: kv_producer, ...}}
      - {stage_id: 1, kv_transfer_config: {kv_role: kv_consumer, ...}}
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode

_HUMAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgG]?)\s*$")
_MULT = {"": 1, "k": 1000, "K": 1024, "m": 1000 ** 2, "M": 1024 ** 2, "g": 1000 ** 3, "G": 1024 ** 3}


def parse_len(v: Any) -> int | None:
    """A ``max_model_len`` value as tokens: an int, or vLLM's human-readable form
    (``"32k"`` = 32000, ``"32K"`` = 32768: vllm/engine/arg_utils.py ``human_readable_int``);
    None for unset, ``-1``/``auto`` (vLLM picks what fits memory) or anything unreadable."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v if v > 0 else None
    m = _HUMAN.match(str(v))
    if not m:
        return None
    n = int(float(m.group(1)) * _MULT[m.group(2)])
    return n if n > 0 else None


def effective_len(ctx: Context, n: "StageNode") -> tuple[int | None, str]:
    """(tokens, where from) of stage ``n``'s effective ``max_model_len``: the CLI flag or
    the stage's key, else the model's ``max_position_embeddings`` (``--model-info``);
    (None, "") when neither is known."""
    v = parse_len(ctx.setting(n, "max_model_len"))
    if v is not None:
        return v, "max_model_len"
    written = "max_model_len" in ctx.cli or ctx.stage_path(n, "max_model_len")[-1:] == ("max_model_len",)
    if not written and ctx.model is not None and ctx.model.max_position_embeddings:
        return int(ctx.model.max_position_embeddings), "model default; max_model_len unset"
    return None, ""


_Y = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
      "  - {{stage_id: 0, devices: \"0\"{p}, kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p0}}}}\n"
      "  - {{stage_id: 1, devices: \"1\"{d}, kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_consumer, engine_id: d0}}}}\n")


def _y(p: str = "", d: str = "") -> str:  # pragma: no mutate block (runs at import only)
    return _Y.format(p=p, d=d)


_M = {"model": {"max_position_embeddings": 1048576}}


@rule("OPD316", "pd-max-model-len", Severity.ERROR,
      "decode admits longer prompts than prefill (effective max_model_len differs across the pair)",
      fail=_y(p=", max_model_len: 9217"), passing=_y(p=", max_model_len: 9217", d=", max_model_len: 9217"),
      example_context=_M, labels=("XS-MAXLEN",),
      examples=(
          Example("both set, decode above prefill", _y(p=", max_model_len: 8192", d=", max_model_len: 32768"), True, _M,
                  contains="up to 32768 tokens"),
          Example("decode below prefill: warning", _y(p=", max_model_len: 32768", d=", max_model_len: 8192"), True, _M,
                  severity=Severity.WARNING, contains="refuses"),
          Example("a value the schema refuses (OPD101) is not replaced by the model default",
                  _y(p=", max_model_len: 32K", d=", max_model_len: 32768"), False, _M),
          Example("neither set: both take the model's default", _y(), False, _M),
          Example("model default unknown (no --model-info): not compared", _y(p=", max_model_len: 9217"), False, {}),
      ))
def max_model_len_mismatch(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """The effective ``max_model_len`` (CLI flag or stage key, else the model's
    ``max_position_embeddings`` from ``--model-info``; a ``rope_scaling`` factor makes the
    default unknown) of prefill and decode: decode above prefill is an error at decode's
    key (decode admits a prompt prefill refuses: decode waits for KV that never comes
    under a both-legs-at-once protocol, or the request fails with 400 under NIXL's
    prefill-first relay); decode below prefill is a warning (prefill computes KV for a
    prompt decode then refuses). Both sides named; the help says the value to write.
    Sources: https://github.com/sgl-project/sglang/pull/31664,
    https://github.com/SemiAnalysisAI/InferenceX/pull/2257; vLLM ``vllm/config/model.py``
    (``max_model_len`` default from the HF config)."""
    pair = ctx.pd_pair
    if pair is None or not (pair[0].kv and pair[1].kv):
        return
    p, d = pair
    (lp, wp), (ld, wd) = effective_len(ctx, p), effective_len(ctx, d)
    if lp is None or ld is None or lp == ld:
        return
    loc_d = ctx.sloc(d, "max_model_len", value=True)
    rel = [ctx.sloc(p, "max_model_len", value=True, label=f"prefill admits {lp} ({wp})")]
    if ld > lp:
        yield r.diag(f"decode (stage {d.stage_id}) accepts prompts up to {ld} tokens ({wd}), prefill (stage "
                     f"{p.stage_id}) only {lp} ({wp}): a prompt in between is admitted by decode and refused by "
                     "prefill (HTTP 400); with a both-legs-at-once protocol (MooncakeConnector's bootstrap) decode "
                     "waits for KV that never arrives", loc_d, related=rel,
                     help=f"write `max_model_len: {lp}` on stage {d.stage_id} (decode)")
    else:
        yield r.diag(f"prefill (stage {p.stage_id}) accepts prompts up to {lp} tokens ({wp}), decode (stage "
                     f"{d.stage_id}) only {ld} ({wd}): prefill computes KV for a prompt in between that decode then "
                     "refuses (wasted prefill work, the request fails after it)", loc_d, related=rel,
                     severity=Severity.WARNING,
                     help=f"write `max_model_len: {ld}` on stage {p.stage_id} (prefill), or {lp} on decode")
