"""vllm-omni 0.30: the Talker gets no prompt rows from a PD Thinker (issue 10; reference §4).

The fact, from vllm-omni 0.30.0's own code (evidence: tests/test_oracle_talker_pd.py, which
runs the real payload path in the oracle venv):

* The Thinker -> Talker conditioning (``embed.prefill``, ``hidden_states.output``, ``ids``)
  is built in the *Thinker engine process* at request end by the pipeline's
  ``custom_process_next_stage_input_func`` (``model_executor/stage_input_processors/
  qwen3_omni.py`` / ``qwen2_5_omni.py`` ``thinker2talker_full_payload``) from the rows that
  engine computed (``distributed/omni_connectors/model_runner/
  omni_connector_payload_transport.py`` ``accumulate_full_payload_output``), and sent to the
  Talker engine through the stage connector.
* Under PD that engine is decode. It loads the prompt's KV from prefill and recomputes only
  the last prompt token (vllm ``v1/core/sched/scheduler.py`` ``_update_waiting_for_remote_kv``),
  so it holds 1 + (generated - 1) rows instead of prompt + generated - 1, while ``ids`` still
  count the whole prompt. The Talker indexes rows by prompt position
  (``models/qwen3_omni/qwen3_omni.py`` ``_thinker_to_talker_prefill``): Qwen3-Omni raises a
  size mismatch when the answer is shorter than the prompt and silently conditions on
  generated-token rows when it is longer; Qwen2.5-Omni's builder ships nothing when the
  answer is shorter than the prompt (the Talker waits for it) and shifted rows otherwise.
* The orchestrator keeps prefill's rows (``engine/orchestrator.py``
  ``OrchestratorRequestState.pd_prefill_multimodal_output``, copied to
  ``bridge_states["pd_prefill_multimodal_output_by_req"]``), and prefill's rows followed by
  decode's rows without the first restore the non-PD input exactly -- but nothing reads that
  copy, and it lives in the orchestrator process, not in the decode engine where the payload
  is built. Supplying it would mean shipping prompt x hidden tensors to the decode engine on
  every request and wrapping the builder there: not a compatibility shim, so omni-pd does not
  patch it and says so instead (OPD704, from ``expand`` and ``validate``). Text output is
  not affected.

Pure facts and message text, shared by the rule (omni_pd/check/rules/runtime.py) and
``expand`` (omni_pd/compile/passes/pd_split.py). No vllm-omni import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omni_pd.compile.pipelines import Pipeline, PipelineStage

#: rule code (runtime family) of the warning
CODE = "OPD704"
#: the vllm-omni releases this was checked on (the newest on the package index)
CHECKED_ON = "vllm-omni 0.30.0"
SUMMARY = "under PD, vllm-omni's Talker gets no prompt rows from the Thinker (audio output is wrong or fails)"
HELP = ("for spoken answers serve the three-stage pipeline without PD; for text only serve the "
        "`*_thinker_only_pd` pipeline (no Talker); text answers of this config are not affected")
NOTES = (
    f"{CHECKED_ON}: the decode engine builds the Talker's conditioning (thinker2talker_full_payload) from "
    "the rows it computed, i.e. the last prompt token and the generated tokens; prefill's prompt rows stay in "
    "the orchestrator (pd_prefill_multimodal_output), which nothing reads",
    "Qwen3-Omni: the Talker raises on answers shorter than the prompt and is conditioned on generated-token "
    "rows otherwise; Qwen2.5-Omni: no Talker payload (the request waits) or shifted rows",
)


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


def message(decode_stage_id: int, talker_stage_id: int) -> str:
    """One-line diagnostic message naming both stages."""
    return (f"the Talker (stage {talker_stage_id}) is conditioned by the PD decode stage {decode_stage_id}, which "
            f"computes no prompt rows: on {CHECKED_ON} audio answers fail or are conditioned on the wrong rows")
