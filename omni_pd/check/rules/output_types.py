"""OPD113 output-type: a stage output type that vllm-omni 0.31+ does not accept.

vllm-omni 0.30 maps aliases (``speech``, ``wav``, ``images``, ``latents``, ``tokens``,
``token_ids``, ...) onto its modalities; from v0.31.0rc1 (GitHub releases, not on PyPI) only
the canonical names ``text|image|audio|latent|token_ids`` are accepted, and ``token_ids`` is a
type of its own. Facts: ``presets/targets/output_types.yaml``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Iterable

from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.diagnostics import Diagnostic, Severity


@lru_cache(maxsize=1)
def facts() -> dict[str, Any]:
    """The parsed ``presets/targets/output_types.yaml``."""
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / "output_types.yaml")


def parts(value: str) -> list[str]:
    """The modality names of an output type string (vllm-omni 0.30 ``OutputModality.from_string``
    splits compound types on ``+`` and ``,``): ``"text+image"`` -> ``["text", "image"]``."""
    return [p.strip().lower() for p in re.split(r"[+,]", value) if p.strip()]


def _y(v: str = "audio") -> str:  # pragma: no mutate block
    return ("stages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n"
            f"  - {{stage_id: 2, devices: \"1\", final_output_type: {v}}}\n")


@rule("OPD113", "output-type", Severity.ERROR,
      "a stage output type is not one of text|image|audio|latent|token_ids (vllm-omni 0.31+)",
      fail=_y("speech"), passing=_y("audio"), example_context={"vllm_version": "0.32"},
      runtime="vllm-omni",
      examples=(
          Example("vllm-omni 0.30 still maps the alias: a warning", _y("wav"), True, {"vllm_version": "0.30"},
                  severity=Severity.WARNING, contains="alias of audio"),
          Example("0.30: token_ids is text there and its own type from 0.31", _y("token_ids"), True,
                  {"vllm_version": "0.30"}, severity=Severity.WARNING, contains="its own type"),
          Example("vLLM 0.34 (no vllm-omni release yet): 0.32's rule is assumed", _y("latents"), True,
                  {"vllm_version": "0.34"}, contains="latent"),
          Example("a compound of canonical names", _y("text+audio"), False, {"vllm_version": "0.32"}),
          Example("token_ids is canonical from 0.31", _y("token_ids"), False, {"vllm_version": "0.32"}),
      ))
def output_type(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """A deploy stage's ``final_output_type``/``engine_output_type`` (flat, under
    ``engine_args`` or ``engine_extras``: legacy StageConfig metadata vllm-omni still reads) must
    be a canonical output type from vllm-omni v0.31.0rc1 (vllm-omni #7841/#7843; v0.32.0
    repeats it): ``text``, ``image``, ``audio``, ``latent``, ``token_ids`` (compounds joined by
    ``+`` or ``,``). On a target vLLM from 0.31 any other name is an error (vLLM 0.33/0.34 have
    no vllm-omni release yet: 0.32's rule is assumed and the message says so). vllm-omni 0.30
    maps aliases (``speech``/``wav``/``waveform`` -> audio, ``images``/``pixels``/``pixel_values``
    -> image, ``latents`` -> latent, ``tokens``/``token_ids`` -> text): a warning there, since the
    file breaks on the next release (``token_ids`` changes meaning). Without ``--vllm-version``
    the message says which release it assumed. Sources: vllm-omni 0.30.0 wheel
    ``vllm_omni/outputs/output_modality.py`` ``_MODALITY_ALIASES``; release notes of v0.31.0rc1
    and v0.32.0 (https://github.com/vllm-project/vllm-omni/releases); facts:
    ``presets/targets/output_types.yaml``."""
    from omni_pd.compile.targets import parse_version

    f = facts()
    canon, aliases = list(f["canonical"]), dict(f["aliases_until_0_30"])
    strict = ctx.target.version >= parse_version(f["canonical_since"])
    stages = ctx.raw_at(("stages",))
    rel = f"vllm-omni 0.31+ ({f['releases_enforcing']}) on {ctx.release_words()}" + (
        "" if ctx.target.version <= (0, 32) else " (no vllm-omni release for it yet: 0.32's rule assumed)")
    for i, st in enumerate(stages if isinstance(stages, list) else []):
        if not isinstance(st, dict):
            continue
        for path in f["keys"]:
            v: Any = st
            for k in path:
                v = v.get(k) if isinstance(v, dict) else None
            if not isinstance(v, str):
                continue
            loc = ctx.loc(("stages", i, *path), value=True)
            key = ".".join(path)
            bad = [p for p in parts(v) if p not in canon or (not strict and p in aliases)]
            if not bad:
                continue
            p = bad[0]
            fix = aliases.get(p)
            if strict:
                yield r.diag(f"stage {st.get('stage_id', i)}: {key} {v!r} is not one of {'|'.join(canon)}, the only "
                             f"output types {rel} accepts ({f['source_pr']})", loc,
                             help=f"write {key}: {fix}" if fix and p != "token_ids" else
                             f"write one of {', '.join(canon)}")
            elif fix is not None:
                extra = ("; from vllm-omni 0.31 token_ids is its own type" if p == "token_ids" else
                         "; vllm-omni 0.31+ refuses the alias")
                yield r.diag(f"stage {st.get('stage_id', i)}: {key} {v!r}: vllm-omni 0.30 reads {p!r} as an alias of "
                             f"{fix} (for {ctx.release_words()}){extra}", loc, severity=Severity.WARNING,
                             help=f"write {key}: {fix}" + (" (or token_ids on 0.31+)" if p == "token_ids" else ""))
