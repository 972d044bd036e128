"""The vllm-omni compatibility layer's Talker-handoff and streaming-PD wrappers
(:mod:`omni_pd.upstream.vllm_omni_compat` installs them; the seam, the merge and the
row arithmetic are :mod:`omni_pd.upstream.talker_pd` and :mod:`omni_pd.upstream.stream_pd`):
prefill's rows kept from the finished prefill output, put on the Talker prompt and
merged in the Talker worker (one-piece PD), and under ``async_chunk`` the PD pair kept
streaming, prefill's rows carried on decode's request into its first Talker chunk.
Split out of vllm_omni_compat.py in issue 38.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from omni_pd.upstream.compat_table import MARK, _once, logger


#: prefill's client rows of a finished prefill output, held for the one ``_route_output``
#: call that submits decode (key: ``(id(orchestrator), request id)``); streaming PD only
_HELD_PREFILL_ROWS: dict[tuple[int, str], Any] = {}


def _stream_decode_request_installed() -> bool:
    """Whether the ``stream_decode_request`` wrapper is in place (the one that moves the
    layers from ``extra_args`` onto the request); without it they must not be attached."""
    import sys

    mod = sys.modules.get("vllm_omni.engine.orchestrator")
    fn = getattr(mod, "build_engine_core_request_from_tokens", None)
    return getattr(fn, MARK, None) == "stream_decode_request"


def _with_prefill_layers(self: Any, req_id: str, sp: Any) -> Any:
    """Streaming PD (``async_chunk`` on): put prefill's layers on decode's cloned params
    (``stream_pd.PARAMS_KEY``) for ``build_engine_core_request_from_tokens`` to move onto
    the request; ``sp`` unchanged otherwise."""
    from omni_pd.upstream import stream_pd, talker_pd

    mm = _HELD_PREFILL_ROWS.pop((id(self), req_id), None)
    if mm is None or not getattr(self, "async_chunk", False) or not _stream_decode_request_installed():
        return sp
    layers = talker_pd.prefill_layers(mm)
    if layers and isinstance(getattr(sp, "extra_args", None), dict):
        sp.extra_args[stream_pd.PARAMS_KEY] = layers
    return sp


def _completion_mm_output(output: Any) -> Any:
    """``output.outputs[0].multimodal_output`` (where vllm-omni 0.30's output processor
    attaches a stage's rows, outputs/output_processor.py ``_new_completion_output``), or None."""
    try:
        return getattr(output.outputs[0], "multimodal_output", None)
    except (AttributeError, IndexError, TypeError):
        return None


def _wrap_prefill_rows(orig: Callable[..., Any]) -> Callable[..., Any]:
    async def _route_output(self, stage_id, replica_id, output, req_state, stage_metrics):
        # The orchestrator's dispatcher awaits one _route_output at a time
        # (engine/orchestrator.py _handle_processed_outputs), and decode is submitted by
        # this very call, so decode's output is routed only after this returns.
        pair = getattr(self, "_pd_pair", None)
        prefill_done = pair is not None and stage_id == pair[0] and getattr(output, "finished", False)
        streaming = bool(getattr(self, "async_chunk", False))
        key = (id(self), str(getattr(output, "request_id", "")))
        if prefill_done and streaming:  # streaming PD: decode's request takes prefill's rows (stream_pd)
            mm = _completion_mm_output(output)
            if mm:
                _HELD_PREFILL_ROWS[key] = mm
        try:
            result = await orig(self, stage_id, replica_id, output, req_state, stage_metrics)
        finally:
            _HELD_PREFILL_ROWS.pop(key, None)
        if (prefill_done and not streaming
                and getattr(req_state, "pd_prefill_multimodal_output", False) is None):
            mm = _completion_mm_output(output)
            if mm:
                req_state.pd_prefill_multimodal_output = mm
                _once(logger, logging.INFO, "omni-pd compat: keeping prefill's rows from outputs[0].multimodal_output "
                      "(upstream read RequestOutput.multimodal_output, which is None)")
        return result
    return _route_output


def _wrap_talker_input(orig: Callable[..., Any]) -> Callable[..., Any]:
    from omni_pd.upstream import talker_pd

    def thinker2talker_token_only(source_outputs, prompt=None, requires_multimodal_data=False,
                                  streaming_context=None):
        prompts = orig(source_outputs, prompt, requires_multimodal_data, streaming_context)
        bridge = getattr(streaming_context, "bridge_states", None)
        by_req = bridge.get(talker_pd.BRIDGE_KEY) if isinstance(bridge, dict) else None
        if not by_req or getattr(streaming_context, "enabled", False):
            return prompts
        for i, (out, tp) in enumerate(zip(source_outputs, prompts)):
            mm = by_req.pop(str(getattr(out, "request_id", f"idx-{i}")), None)
            info = talker_pd.attach(tp.get("additional_information"), talker_pd.prefill_layers(mm),
                                    len(getattr(out, "prompt_token_ids", None) or ()))
            if info is not None:
                tp["additional_information"] = info
        return prompts
    return thinker2talker_token_only


def _wrap_talker_prefill(orig: Callable[..., Any]) -> Callable[..., Any]:
    from omni_pd.upstream import talker_pd

    def talker_preprocess_prefill(self, input_ids, input_embeds, payload):
        accept = getattr(getattr(self, "talker_config", None), "accept_hidden_layer", None)
        merged, why = talker_pd.merge_payload(payload, -1 if accept is None else int(accept))
        if merged is None:
            if why not in ("not-pd-shape", "no-prefill-rows"):
                _once(logger, logging.WARNING, f"omni-pd compat: prefill rows on the Talker request not merged "
                      f"({why}); the Talker is conditioned as upstream builds it")
            ids, embeds, update = orig(self, input_ids, input_embeds, payload)
            update.update(talker_pd.release(payload))
            return ids, embeds, update
        ids, embeds, update = orig(self, input_ids, input_embeds, merged)
        # the merged rows replace decode's in the request buffer (a later chunk of a
        # chunked prefill then sees the non-PD shape) and prefill's copy is released
        update.setdefault("embed", {})["prefill"] = merged["embed"]["prefill"]
        update.setdefault("hidden_states", {})["output"] = merged["hidden_states"]["output"]
        update.update(talker_pd.release(payload))
        _once(logger, logging.INFO, "omni-pd compat: Talker prefill under PD gets prefill's prompt rows followed by "
              "decode's rows without the recomputed last prompt token")
        return ids, embeds, update
    return talker_preprocess_prefill


def _wrap_async_chunk_support(orig: Callable[..., Any]) -> Callable[..., Any]:
    from omni_pd.upstream import stream_pd

    def _validate_async_chunk_support(pipeline, deploy):
        try:
            return orig(pipeline, deploy)
        except ValueError as e:
            ids = stream_pd.pd_kv_stage_ids(pipeline, deploy) if stream_pd.ASYNC_CHUNK_REFUSAL in str(e) else None
            if ids is None:
                raise
        _once(logger, logging.INFO, "omni-pd compat: async_chunk kept on for the prefill/decode pair (vllm-omni "
              "0.30 refuses any kv_transfer_config with it; the check is for AR-to-DiT transfer)")
        return orig(pipeline, stream_pd.without_kv(deploy, ids))
    return _validate_async_chunk_support


def _wrap_decode_request(orig: Callable[..., Any]) -> Callable[..., Any]:
    from omni_pd.upstream import stream_pd, talker_pd

    def build_engine_core_request_from_tokens(request_id, prompt, params, arrival_time=None, model_config=None,
                                              resumable=False, mm_features=None):
        extra = getattr(params, "extra_args", None)
        layers = extra.pop(stream_pd.PARAMS_KEY, None) if isinstance(extra, dict) else None
        if layers and isinstance(prompt, Mapping):
            info = dict(prompt.get("additional_information") or {})
            info.update({talker_pd.key_of(i): t for i, t in sorted(layers.items())})
            prompt = {**prompt, "additional_information": info}
            _once(logger, logging.INFO, "omni-pd compat: streaming PD, decode's request carries prefill's prompt rows "
                  f"(layers {sorted(layers)}) for its first Talker chunk")
        return orig(request_id, prompt, params, arrival_time, model_config, resumable, mm_features)
    return build_engine_core_request_from_tokens


def _wrap_stream_chunk0(orig: Callable[..., Any]) -> Callable[..., Any]:
    from omni_pd.upstream import stream_pd

    def thinker2talker_async_chunk(transfer_manager, multimodal_output, request, is_finished=False):
        rid = getattr(request, "external_req_id", None)
        first = (rid is not None and transfer_manager.put_req_chunk[rid] == 0
                 and transfer_manager.request_payload.get(rid) is None)
        out = orig(transfer_manager, multimodal_output, request, is_finished)
        if not first or out is not None:
            return out
        saved = transfer_manager.request_payload.get(rid)
        info = getattr(request, "additional_information", None)
        if saved is None or info is None:
            return out
        from vllm_omni.engine.serialization import deserialize_additional_information

        layers = stream_pd.decode_layers(deserialize_additional_information(info))
        if not layers:
            return out
        # the layer the original itself reads (its module's helper: model config's talker_config)
        accept = int(orig.__globals__["_get_accept_hidden_layer_index"](transfer_manager))
        repaired, why = stream_pd.repair_chunk0(saved, layers, accept, len(getattr(request, "prompt_token_ids", ()) or ()))
        if repaired is None:
            _once(logger, logging.WARNING, f"omni-pd compat: decode's first Talker chunk not given prefill's rows ({why}); "
                  "the Talker is conditioned as upstream builds it")
            return out
        transfer_manager.request_payload[rid] = repaired
        _once(logger, logging.INFO, "omni-pd compat: streaming PD, decode's first Talker chunk holds prefill's prompt "
              "rows in place of its recomputed last prompt token")
        return out
    return thinker2talker_async_chunk
