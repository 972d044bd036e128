"""OPD704: does the Talker of a vllm-omni PD pipeline get its prompt rows? (issues 10, 21)

The fact, from vllm-omni 0.30.0's own code (evidence: tests/test_oracle_talker_pd.py, which
runs the real payload path in the oracle venv):

* The Thinker -> Talker conditioning (``embed.prefill``, ``hidden_states.output``, ``ids``)
  is built in the *Thinker engine process* at request end by the pipeline's
  ``custom_process_next_stage_input_func`` (``model_executor/stage_input_processors/
  qwen3_omni.py`` / ``qwen2_5_omni.py`` ``thinker2talker_full_payload``) from the rows that
  engine computed. Under PD that engine is decode, which loads the prompt's KV from prefill
  and recomputes only the last prompt token (vllm ``v1/core/sched/scheduler.py``
  ``_update_waiting_for_remote_kv``), so the Talker gets no prompt rows while ``ids`` still
  count the whole prompt: Qwen3-Omni's Talker raises a size mismatch when the answer is
  shorter than the prompt and is conditioned on generated-token rows otherwise;
  Qwen2.5-Omni's builder ships nothing when the answer is shorter than the prompt (the
  Talker waits) and shifted rows otherwise.
* The orchestrator means to keep prefill's rows (``engine/orchestrator.py``
  ``pd_prefill_multimodal_output``) but reads them from an attribute a vLLM
  ``RequestOutput`` does not have, so it keeps None.

omni-pd's vllm-omni compatibility layer fixes it for Qwen3-Omni on the releases its table
lists (``presets/targets/vllm_omni_compat.yaml``: the patches ``pd_prefill_rows``,
``talker_prefill_rows``, ``talker_prefill_merge`` and ``talker_pipelines``; the seam is in
omni_pd/upstream/talker_pd.py). So OPD704 is silent where the layer covers the target
release and is on, and an *error* where it cannot, since the audio is then wrong
(:func:`gap`): the layer or its Talker patches switched off (``OMNI_PD_VLLM_OMNI_COMPAT`` /
``OMNI_PD_VLLM_OMNI_TALKER_PD`` = 0) in the launcher environment (the orchestrator patches
run in the API process) or in the Talker stage's ``env`` (the merge runs in the Talker's
worker); a vllm-omni release the table does not list; a pipeline it does not cover
(Qwen2.5-Omni: its decode engine withholds the payload, so nothing reaches the Talker to
merge into).

Pure facts, the decision and message text, shared by the rule (omni_pd/check/rules/runtime.py)
and ``expand`` (omni_pd/compile/passes/pd_split.py). No vllm-omni import: the table is read
as data (omni_pd/upstream/vllm_omni_compat.py reads the same file to install the patches).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omni_pd.compile.pipelines import Pipeline, PipelineStage
    from omni_pd.compile.targets import Target

#: rule code (runtime family) of the error
CODE = "OPD704"
SUMMARY = ("under PD, vllm-omni's Talker gets no prompt rows from the Thinker unless omni-pd's compatibility "
           "layer covers the release and is on (else audio output is wrong or fails)")
#: the environment switches of omni_pd/upstream/vllm_omni_compat.py (the layer, its Talker patches)
SWITCHES = ("OMNI_PD_VLLM_OMNI_COMPAT", "OMNI_PD_VLLM_OMNI_TALKER_PD")
#: the compat table's rows that together hand the Talker prefill's rows
TALKER_PATCHES = ("pd_prefill_rows", "talker_prefill_rows", "talker_prefill_merge")
NOTES = (
    "the decode engine builds the Talker's conditioning (thinker2talker_full_payload) from the rows it computed, "
    "i.e. the last prompt token and the generated tokens; prefill's prompt rows never reach the Talker (the "
    "orchestrator reads them from RequestOutput.multimodal_output, which is always None)",
    "Qwen3-Omni: the Talker raises on answers shorter than the prompt and is conditioned on generated-token "
    "rows otherwise; Qwen2.5-Omni: no Talker payload (the request waits) or shifted rows",
    "omni-pd's vllm-omni compatibility layer hands the Talker prefill's rows (docs/upstream/"
    "vllm-omni-0.30-talker-pd.md): Qwen3-Omni on the releases presets/targets/vllm_omni_compat.yaml lists",
)
TEXT_ONLY = "for text only serve the `*_thinker_only_pd` pipeline (no Talker)"


def text_only(pipeline_name: str) -> str:
    """The text-only route for a PD pipeline's users, as a command: ``expand --pipeline
    <base>_thinker_only`` on the three-stage file when the catalogue has that pipeline
    (``qwen3_omni_moe_pd`` -> ``qwen3_omni_moe_thinker_only``), else :data:`TEXT_ONLY`."""
    from omni_pd.compile.pipelines import load_catalogue

    base = pipeline_name.removesuffix("_pd")
    name = base if base.endswith("_thinker_only") else f"{base}_thinker_only"
    if load_catalogue().get(name) is None:
        return TEXT_ONLY
    return f"for text only: `omni-pd expand <three-stage file> --pipeline {name}` (the Thinker alone as a PD pair)"


@lru_cache(maxsize=1)
def compat_table() -> dict[str, Any]:
    """presets/targets/vllm_omni_compat.yaml as data (read once)."""
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / "vllm_omni_compat.yaml")


def covered(series: str, pipeline_name: str) -> bool:
    """True when ``pipeline_name``'s Talker gets prefill's rows on vllm-omni ``series``
    (``"0.30"``): :func:`covered_pipelines` lists it."""
    return pipeline_name in covered_pipelines(series)


def covered_pipelines(series: str) -> tuple[str, ...]:
    """The PD pipelines whose Talker handoff is right on ``series``: the table's
    ``talker_pipelines`` when the series lists every Talker patch, plus
    ``talker_fixed_upstream`` (a release that merges by itself needs no patch)."""
    v = (compat_table().get("versions") or {}).get(series) or {}
    patched = tuple(v.get("talker_pipelines") or ()) if set(TALKER_PATCHES) <= set(v.get("patches") or ()) else ()
    return patched + tuple(p for p in v.get("talker_fixed_upstream") or () if p not in patched)


def omni_release(target: "Target") -> str | None:
    """The vllm-omni release series that runs at ``--vllm-version`` ``target``: the same
    ``major.minor`` when vllm-omni released it, else the newest release before it
    (presets/targets/vllm.yaml ``vllm_omni_releases``; its facts apply); None before the first."""
    from omni_pd.compile.targets import parse_version
    from omni_pd.compile.versions import vllm_omni_releases

    older = [r for r in vllm_omni_releases() if parse_version(r) <= target.version]
    return older[-1] if older else None


def switched_off(env: Mapping[str, Any] | None, switches: tuple[str, ...] = SWITCHES) -> tuple[str, str] | None:
    """(variable, value) of the first of ``switches`` (default: the layer's and its Talker
    patches') set to 0/false/off/no in ``env``, as omni_pd/upstream/vllm_omni_compat.py reads them."""
    for var in switches:
        v = (env or {}).get(var)
        if v is not None and str(v).strip().lower() in ("0", "false", "off", "no"):
            return var, str(v)
    return None


@dataclass(frozen=True)
class Gap:
    """Why the layer cannot fix the Talker handoff. ``where``: ``launcher`` (launcher
    environment), ``talker-env`` (the Talker stage's ``env``), ``release``, ``pipeline``;
    ``var``: the switch for the env cases."""

    where: str
    why: str
    help: str
    var: str | None = None


def gap(pipeline: "Pipeline", target: "Target", launcher_env: Mapping[str, Any] | None,
        talker_env: Mapping[str, Any] | None) -> Gap | None:
    """None when omni-pd's layer gives ``pipeline``'s Talker the non-PD conditioning at
    ``target`` with these environments, else the :class:`Gap` (release and pipeline are
    checked before the switches: a switch matters only where the layer would act)."""
    from omni_pd.compile.versions import runtime_release

    release = omni_release(target)
    if release is None or not covered_pipelines(release):
        return Gap("release", f"omni-pd's compatibility layer does not cover the Talker handoff on "
                              f"{runtime_release('vllm-omni', target)}",
                   f"target a release it covers (`--vllm-version 0.30`), or serve the three-stage pipeline "
                   f"without PD; {text_only(pipeline.name)}")
    if not covered(release, pipeline.name):
        ok = ", ".join(covered_pipelines(release))
        return Gap("pipeline", f"omni-pd's compatibility layer fixes the Talker handoff for {ok} only "
                               f"({pipeline.name}: the decode engine withholds or shifts the Talker's payload)",
                   f"serve the three-stage pipeline without PD; {text_only(pipeline.name)}")
    for where, env in (("launcher", launcher_env), ("talker-env", talker_env)):
        off = switched_off(env)
        if off:
            place = "the launcher environment" if where == "launcher" else "the Talker stage's env"
            return Gap(where, f"omni-pd's compatibility layer is switched off in {place} ({off[0]}={off[1]})",
                       f"remove {off[0]} from {place}, or serve the three-stage pipeline without PD; "
                       f"{text_only(pipeline.name)}",
                       var=off[0])
    return None


def talker_after_decode(pipeline: "Pipeline") -> "tuple[PipelineStage, PipelineStage] | None":
    """``(decode stage, Talker stage)`` of a vllm-omni PD pipeline whose Talker reads the
    decode stage's output, else None (no PD pair, no Talker, or a plain-vLLM pipeline)."""
    if pipeline.runtime != "vllm-omni":
        return None
    pair = pipeline.pd_pair
    if pair is None:
        return None
    decode = pipeline.stage(pair[1])
    talker = next((s for s in pipeline.stages if s.role == "talker" and pair[1] in s.input_sources), None)
    return (decode, talker) if decode is not None and talker is not None else None


def message(decode_stage_id: int, talker_stage_id: int, why: str) -> str:
    """One-line diagnostic message naming both stages and the :class:`Gap`'s ``why``."""
    return (f"the Talker (stage {talker_stage_id}) is conditioned by the PD decode stage {decode_stage_id}, which "
            f"computes no prompt rows, and {why}: audio answers fail or are conditioned on the wrong rows")
