"""vllm-omni 0.30: stream a spoken answer under PD (``async_chunk: true``), issue 34.

Without PD, vllm-omni's Qwen3-Omni deploy streams: at a request's start the orchestrator
pre-submits every stage that receives chunks (Talker, Code2Wav) with a placeholder prompt,
the Thinker's engine sends the Talker one chunk per step through the stage connector
(``model_executor/stage_input_processors/qwen3_omni.py`` ``thinker2talker_async_chunk``),
and Code2Wav sends audio chunks while the Thinker is still writing. Under PD, vllm-omni
0.30 serves none of this: ``config/omni_config.py`` ``_validate_async_chunk_support``
refuses any stage with a ``kv_transfer_config`` when ``async_chunk`` is on ("Native
AR-to-DiT KV transfer requires async_chunk=False"), a check written for KV transfer into a
diffusion stage, not for a prefill/decode pair.

What streaming PD needs, and where each piece lives (the seam and why):

1. **Decode is submitted by the orchestrator, not prewarmed** (deploy file, no patch).
   ``distributed/omni_connectors/utils/initialization.py`` ``load_omni_transfer_config``
   auto-configures a SharedMemoryConnector on every ``edges:`` entry without one, so a
   prefill -> decode edge makes decode a chunk *receiver* (``role: receiver``), which
   ``engine/orchestrator.py`` ``_prewarm_async_chunk_stages`` pre-submits with ``[0] * n``
   and whose input ``_route_output`` then never forwards. Without that edge, decode's
   stage connector is its outgoing edge's with ``role: sender``
   (``engine/stage_init_utils.py`` ``get_stage_connector_spec``): not prewarmed, submitted
   by the orchestrator's PD branch after prefill, and a sender of async chunks to the
   Talker, which is prewarmed with decode as its payload sender; prefill (stage 0, no
   connector) sends no async output, so its rows reach the orchestrator on the normal
   output path. ``omni-pd expand`` writes the file that way (``edges:`` without the
   prefill -> decode entry: that hop is the KV connector's, not a stage connector's).
2. **The refusal** (``stream_async_chunk_ok``): after the original raises that error, run
   it again with the pair's ``kv_transfer_config`` hidden when every stage carrying one is
   the PD pair of the pipeline (``extras.is_prefill_only`` / ``is_decode_only``);
   AR-to-DiT transfer stays refused. :func:`pd_kv_stage_ids`, :func:`without_kv`.
3. **Decode's chunk 0 needs prefill's prompt rows.** ``thinker2talker_async_chunk`` holds
   chunk 0 back until more rows than prompt tokens arrived: the prompt's rows (embedding
   layer and ``accept_hidden_layer``) then the first generated token's. Decode computes
   only the last prompt token (its KV for the rest came from prefill), so chunk 0 would wait
   P decode steps and hand the Talker answer rows as prompt rows. Prefill's rows are in the
   orchestrator when decode is submitted (``outputs[0].multimodal_output`` of prefill's
   output; 0.30 reads ``RequestOutput.multimodal_output`` and keeps None, see
   :mod:`omni_pd.upstream.talker_pd`). So:

   * ``OrchestratorBase._route_output`` (orchestrator thread): before the original, a
     finished prefill output's rows are held for the call (``_build_pd_decode_params``
     runs inside it);
   * ``OrchestratorBase._build_pd_decode_params``: after the original, the held layers go
     on decode's cloned ``SamplingParams.extra_args`` under :data:`PARAMS_KEY`;
   * ``build_engine_core_request_from_tokens`` (``stream_decode_request``, orchestrator):
     they are moved from ``extra_args`` to the decode request's
     ``additional_information`` as top-level tensor keys (``talker_pd.key_of``), which
     ``serialize_additional_information`` carries to the engine core;
   * ``thinker2talker_async_chunk`` (``stream_chunk0``, decode's engine core, the chunk
     adapter's save thread): after the original stored decode's first partial chunk 0
     (its recomputed last prompt token), the stored rows are replaced by prefill's P
     prompt rows (:func:`repair_chunk0`). The next step appends the first generated
     token's row and the original sends exactly the non-PD chunk 0: P + 1 rows, ids from
     the request.

Bytes per request: prefill's two layers, ``2 x P x H x itemsize`` (bf16: ``4 P H``),
over the engine request channel into decode, where they stay with the request until it
finishes; the same bytes as the non-streaming fix moves to the Talker, and the Talker
then receives exactly the non-PD chunks (``2 x (P + 1) x H`` in chunk 0, one row per
later step). Rejected: giving the Talker prefill's rows on its own (it is prewarmed before
prefill runs and reads only connector chunks); holding chunk 0 in decode until P steps
(first audio after P tokens, and wrong rows).

Everything here is pure (no vllm-omni, no torch at import); the wrappers are in
:mod:`omni_pd.upstream.vllm_omni_compat`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from omni_pd.upstream import talker_pd

#: ``SamplingParams.extra_args`` key that carries prefill's layers from
#: ``_build_pd_decode_params`` to ``build_engine_core_request_from_tokens`` (popped there).
PARAMS_KEY = "omni_pd_prefill_layers"
#: The error vllm-omni 0.30 raises for a ``kv_transfer_config`` with ``async_chunk`` on.
ASYNC_CHUNK_REFUSAL = "Native AR-to-DiT KV transfer requires async_chunk=False"


def _extras(stage: Any) -> Mapping[str, Any]:
    e = getattr(stage, "extras", None)
    return e if isinstance(e, Mapping) else {}


def pd_kv_stage_ids(pipeline: Any, deploy: Any) -> frozenset[int] | None:
    """Ids of the deploy stages whose ``kv_transfer_config`` vllm-omni's async-chunk check
    refuses, when all of them are the prefill/decode pair of ``pipeline``; None otherwise
    (no pair, or another stage carries one: native AR-to-DiT transfer, which stays refused).

    ``pipeline``: a vllm-omni ``PipelineConfig`` (stages with ``stage_id`` and ``extras``
    ``is_prefill_only`` / ``is_decode_only``, set by omni-pd's ``*_pd`` pipelines);
    ``deploy``: a ``DeployConfig`` (stages with ``stage_id`` and ``engine_extras``)."""
    prefill = {int(s.stage_id) for s in getattr(pipeline, "stages", ()) if _extras(s).get("is_prefill_only")}
    decode = {int(s.stage_id) for s in getattr(pipeline, "stages", ()) if _extras(s).get("is_decode_only")}
    if len(prefill) != 1 or len(decode) != 1:
        return None
    kv = {int(s.stage_id) for s in getattr(deploy, "stages", ())
          if (getattr(s, "engine_extras", None) or {}).get("kv_transfer_config")}
    return frozenset(kv) if kv and kv <= prefill | decode else None


def without_kv(deploy: Any, stage_ids: Iterable[int]) -> Any:
    """A shallow copy of ``deploy`` whose stages ``stage_ids`` have no ``kv_transfer_config``
    in ``engine_extras`` (the given objects are not changed)."""
    ids = set(stage_ids)
    out = copy.copy(deploy)
    stages = []
    for s in getattr(deploy, "stages", ()):
        if int(s.stage_id) in ids:
            extras = {k: v for k, v in (s.engine_extras or {}).items() if k != "kv_transfer_config"}
            s = dataclasses.replace(s, engine_extras=extras) if dataclasses.is_dataclass(s) else _with(s, extras)
        stages.append(s)
    out.stages = stages
    return out


def _with(stage: Any, extras: dict[str, Any]) -> Any:
    c = copy.copy(stage)
    c.engine_extras = extras
    return c


def decode_layers(info: Mapping[str, Any] | None) -> dict[int, Any]:
    """Prefill's layers on a decode request's deserialized ``additional_information``
    (``talker_pd.key_of`` keys), ``{layer: [P, H]}``; {} when there are none."""
    return talker_pd.attached_layers(info) if isinstance(info, Mapping) else {}


def repair_chunk0(saved: Mapping[str, Any], layers: Mapping[int, Any], accept_layer: int,
                  n_prompt: int) -> tuple[dict[str, Any] | None, str]:
    """Decode's held-back chunk 0 with its prompt rows replaced by prefill's:
    (repaired payload or None, reason).

    ``saved``: the partial payload ``thinker2talker_async_chunk`` stored after decode's first
    step (``embed.prefill`` and ``hidden_states.output``: the ``r`` prompt rows decode
    recomputed, ``0 < r < n_prompt``); ``layers``: prefill's rows, ``{0: [P, H],
    accept_layer: [P, H]}`` with ``P == n_prompt``. The result holds prefill's rows for both
    keys (every other key kept), which is what a non-PD Thinker stores after its prefill
    step. None (reason ``not-pd-shape``, ``missing-layer``, ``prompt-mismatch``) leaves the
    stored payload as it is."""
    embed = saved.get("embed") if isinstance(saved.get("embed"), Mapping) else {}
    hs = saved.get("hidden_states") if isinstance(saved.get("hidden_states"), Mapping) else {}
    r_e, r_h = talker_pd.rows_of(embed.get("prefill")), talker_pd.rows_of(hs.get("output"))
    if not (0 < r_e < n_prompt and r_e == r_h):
        return None, "not-pd-shape"
    if 0 not in layers or int(accept_layer) not in layers:
        return None, "missing-layer"
    if talker_pd.rows_of(layers[0]) != n_prompt or talker_pd.rows_of(layers[int(accept_layer)]) != n_prompt:
        return None, "prompt-mismatch"
    out = dict(saved)
    out["embed"] = {**embed, "prefill": _like(layers[0], embed.get("prefill"))}
    out["hidden_states"] = {**hs, "output": _like(layers[int(accept_layer)], hs.get("output"))}
    return out, "repaired"


def _like(rows: Any, ref: Any) -> Any:
    """``rows`` on ``ref``'s device and dtype when both are tensors (the stored chunk is
    decode's, on CPU, in its dtype), else ``rows``."""
    to = getattr(rows, "to", None)
    if to is None or not hasattr(ref, "dtype"):
        return rows
    return to(device=getattr(ref, "device", None) or "cpu", dtype=ref.dtype)


def layer_bytes(layers: Mapping[int, Any]) -> int:
    """Bytes of prefill's layers attached to one decode request (``numel x element_size``)."""
    return talker_pd.extra_bytes(layers)
