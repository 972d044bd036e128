"""What vllm-omni 0.30's Thinker -> Talker hand-off gives the Talker under PD (issue 10, bullet 3).

Run with the oracle venv's python (``OMNI_PD_ORACLE_PYTHON``); prints one JSON object.
Every step that decides a shape is vllm-omni's own code, only the engine loop is
simulated:

* Thinker rows: the per-step ``multimodal_outputs`` the Thinker forward returns
  (``Qwen3OmniMoeForConditionalGeneration.make_omni_output``: ``hidden_states.layers``
  {0, accept_hidden_layer} of [tokens, H] plus ``embed.tts_*`` lists) go through the AR
  runner's per-request payload path (``flatten_payload`` -> ``build_mm_cpu`` ->
  ``build_omni_mm_payload``, worker/gpu_ar_model_runner.py
  ``_build_omni_model_runner_output_from_snapshot``) and the runner's real full-payload
  accumulator (``accumulate_full_payload_output`` / ``_materialize_full_payload_entry``,
  distributed/omni_connectors/model_runner/omni_connector_payload_transport.py).
* Which rows a step computes: without PD the first step computes the whole prompt; under
  PD the decode engine loads the prompt's KV and recomputes only the last prompt token
  (vllm v1/core/sched/scheduler.py ``_update_waiting_for_remote_kv``: "on a full prompt
  hit, we need to re-compute the last token"), then one row per generated token.
* Payload builders: ``thinker2talker_full_payload`` of qwen3_omni and qwen2_5_omni
  (model_executor/stage_input_processors), called as the decode engine calls them at
  request end (``send_full_payload_outputs`` -> ``_build_custom_process_payload``).
* Talker: Qwen3-Omni's ``_thinker_to_talker_prefill`` (the Talker's prefill input) with
  identity projections, so its output rows are the Thinker rows it picked.
* Orchestrator: what it keeps from prefill (``OrchestratorRequestState.
  pd_prefill_multimodal_output``): the prefill stage's accumulated client output
  (outputs/output_processor.py ``OmniRequestState.add_multimodal_tensor`` + consolidate
  + snapshot), and whether any module reads ``pd_prefill_multimodal_output_by_req``.

The Thinker is a deterministic function of (position, token), as a real model is for a
fixed prompt: rows computed by prefill and by decode for one position are equal.
"""

from __future__ import annotations

import json
import pathlib
import types

import torch

H = 8  # hidden size of the fake Thinker rows
ACCEPT = 3  # talker_config.accept_hidden_layer
IM_START, IM_END, SYSTEM, USER, ASSISTANT, NL = 151644, 151645, 8948, 872, 77091, 198
AUDIO = 151646  # a multimodal placeholder id in the user turn


def thinker_rows(tokens: list[int], positions: range) -> dict:
    """The Thinker forward's ``multimodal_outputs`` for one step (one request)."""
    pos = torch.tensor(list(positions), dtype=torch.float32)
    tok = torch.tensor([tokens[p] % 2 for p in positions], dtype=torch.float32)
    base = (pos + tok / 2).unsqueeze(1).repeat(1, H)  # exact in bfloat16 (the Talker's dtype)
    tts = [torch.full((1, 1, H), float(v)) for v in (-1, -2, -3)]
    return {"hidden_states": {"layers": {0: base, ACCEPT: base + 0.5}},
            "embed": {"tts_bos": [tts[0]], "tts_eos": [tts[1]], "tts_pad": [tts[2]]},
            "_final": base + 0.25}


def step_payload(tokens: list[int], positions: range) -> dict:
    """One request's per-step pooler payload, as the AR runner builds it."""
    from vllm_omni.data_entry_keys import flatten_payload
    from vllm_omni.utils.mm_outputs import build_mm_cpu
    from vllm_omni.worker.output.payload_build import build_omni_mm_payload

    mm = thinker_rows(tokens, positions)
    final = mm.pop("_final")
    n = len(positions)
    payload: dict = {"hidden": final}
    payload.update(build_omni_mm_payload(
        combined_multimodal_outputs=None, mm_cpu=build_mm_cpu(flatten_payload(mm)), rid="r", idx=0,
        start=0, end=n, audio_sparse_output=False, sparse_mm_index={}, hidden_seq_len=n, scheduled_seq_len=n))
    return flatten_payload(payload)


def run_engine(builder, tokens: list[int], prompt_len: int, first_computed: int, merge_prefill: dict | None = None):
    """Accumulate a request's steps like the Thinker engine does; return (the builder's
    payload, accumulated rows).

    ``merge_prefill``: the orchestrator's prefill output (nested); when given, its prompt
    rows are put in front of the accumulated rows minus the first (the recomputed last
    prompt token), i.e. what a fix would have to hand the builder.

    ``first_computed``: prompt tokens already in the KV cache when the request is first
    scheduled (0 without PD; prompt_len - 1 on PD decode).
    """
    from vllm_omni.distributed.omni_connectors.model_runner.omni_connector_payload_transport import (
        _OmniConnectorPayloadTransportMixin as T,
    )

    acc = T.__new__(T)
    acc._pending_full_payload_send = {}
    acc._custom_process_func = builder
    steps = [range(first_computed, prompt_len)] + [range(p, p + 1) for p in range(prompt_len, len(tokens) - 1)]
    request = types.SimpleNamespace(request_id="r", external_req_id="r", prompt_token_ids=tokens[:prompt_len],
                                    output_token_ids=tokens[prompt_len:], all_token_ids=list(tokens),
                                    additional_information=None, sampling_params=None, status=None)
    for positions in steps:
        acc.accumulate_full_payload_output("r", step_payload(tokens, positions), request)
    pooling_output, req = T._materialize_full_payload_entry(acc._pending_full_payload_send.pop("r"))
    if merge_prefill is not None:
        from vllm_omni.data_entry_keys import flatten_payload

        kept = flatten_payload(merge_prefill)
        kept.setdefault("hidden", kept.get("latent"))  # the client output names the final rows by modality
        for k, v in list(pooling_output.items()):
            if isinstance(v, torch.Tensor) and v.dim() == 2 and isinstance(kept.get(k), torch.Tensor):
                pooling_output[k] = torch.cat([kept[k], v[1:]], dim=0)
    rows = int(pooling_output["hidden"].shape[0])
    transfer_manager = types.SimpleNamespace(
        config=types.SimpleNamespace(hf_config=types.SimpleNamespace(
            talker_config=types.SimpleNamespace(accept_hidden_layer=ACCEPT))))
    return builder(transfer_manager, pooling_output, req), rows


def prefill_client_output(tokens: list[int], prompt_len: int):
    """What the orchestrator stores as ``pd_prefill_multimodal_output`` (prefill leg, max_tokens 1)."""
    from vllm_omni.data_entry_keys import unflatten_payload
    from vllm_omni.outputs.multimodal_accumulation import MultimodalPayload, replace_snapshot_keys
    from vllm_omni.outputs.output_modality import OutputModality

    acc = MultimodalPayload()
    incoming = MultimodalPayload.from_raw(step_payload(tokens, range(0, prompt_len)), "latent")
    replace_snapshot_keys(acc, incoming)
    acc = acc.merged_with(incoming)
    acc.consolidate_tensors(OutputModality.from_string("latent"))
    acc.consolidate_metadata()
    return unflatten_payload({**acc.tensors, **acc.metadata})


def talker_prefill(payload: dict):
    """Qwen3-Omni Talker's prefill input built from ``payload`` (identity projections)."""
    from vllm_omni.model_executor.models.qwen3_omni.qwen3_omni import Qwen3OmniMoeForConditionalGeneration as M

    ident = lambda x: x  # noqa: E731
    tc = types.SimpleNamespace(text_config=types.SimpleNamespace(hidden_size=H), codec_nothink_id=1,
                               codec_think_bos_id=2, codec_think_eos_id=3, codec_pad_id=4, codec_bos_id=5)
    fake = types.SimpleNamespace(
        config=types.SimpleNamespace(im_start_token_id=IM_START, system_token_id=SYSTEM, user_token_id=USER,
                                     assistant_token_id=ASSISTANT, tts_pad_token_id=0, talker_config=tc),
        thinker_config=types.SimpleNamespace(audio_token_id=AUDIO, image_token_id=-7, video_token_id=-8),
        talker=types.SimpleNamespace(text_projection=ident, hidden_projection=ident,
                                     embed_input_ids=lambda ids: torch.zeros(len(ids), H, dtype=torch.bfloat16)),
        _module_device=lambda module: torch.device("cpu"))
    fake._get_tts_embed = types.MethodType(M._get_tts_embed, fake)
    fake._get_talker_user_parts = types.MethodType(M._get_talker_user_parts, fake)
    fake._get_talker_assistant_parts = types.MethodType(M._get_talker_assistant_parts, fake)
    e = {k: v.to(torch.bfloat16) for k, v in payload["embed"].items()}  # as talker_preprocess_prefill does
    try:
        ids, embeds, tail = M._thinker_to_talker_prefill(
            fake, thinker_embed=e["prefill"], thinker_hidden=payload["hidden_states"]["output"].to(torch.bfloat16),
            multimodal_mask=None, input_ids=torch.tensor(payload["ids"]["prompt"]).unsqueeze(0),
            thinker_result_ids=torch.tensor(payload["ids"]["all"]), speaker_id=9,
            tts_bos_thinker=e["tts_bos"], tts_eos_thinker=e["tts_eos"], tts_pad_thinker=e["tts_pad"])
    except Exception as exc:  # what the Talker engine would raise
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"rows": int(embeds.shape[0]), "embeds": embeds.float().tolist(), "ids": ids.tolist(),
            "tail_rows": int(tail.shape[0]) if isinstance(tail, torch.Tensor) else None}


def main() -> None:
    import vllm_omni
    from vllm_omni.model_executor.stage_input_processors import qwen2_5_omni, qwen3_omni

    # <|im_start|>system\n...<|im_end|>\n<|im_start|>user\n<audio x3> text<|im_end|>\n<|im_start|>assistant\n
    prompt = ([IM_START, SYSTEM, NL, 11, 12, IM_END, NL, IM_START, USER, NL, AUDIO, AUDIO, AUDIO, 21, 22, 23,
               IM_END, NL, IM_START, ASSISTANT, NL])
    p = len(prompt)
    out: dict = {"vllm_omni": vllm_omni.__version__, "prompt_len": p}
    # a short answer (shorter than the prompt) and a long one (longer than the prompt)
    for answer, generated in (("short", [31, 32, 33, 34, 35, 36, IM_END]), ("long", list(range(40, 70)) + [IM_END])):
        tokens = prompt + generated
        kept = prefill_client_output(tokens, p)
        for name, builder in (("qwen3", qwen3_omni.thinker2talker_full_payload),
                              ("qwen2_5", qwen2_5_omni.thinker2talker_full_payload)):
            for mode, first, merge in (("plain", 0, None), ("pd_decode", p - 1, None), ("pd_merged", p - 1, kept)):
                payload, rows = run_engine(builder, tokens, p, first, merge)
                rec: dict = {"generated": len(generated), "accumulated_rows": rows, "payload": payload is not None}
                if payload is not None:
                    rec.update(prefill_rows=int(payload["embed"]["prefill"].shape[0]),
                               output_rows=int(payload["hidden_states"]["output"].shape[0]),
                               ids_prompt=len(payload["ids"]["prompt"]),
                               ids_all=len(payload["ids"].get("all") or []) or None,
                               prefill=payload["embed"]["prefill"][:, 0].tolist(),
                               output=payload["hidden_states"]["output"][:, 0].tolist())
                    if name == "qwen3":
                        rec["talker"] = talker_prefill(payload)
                out[f"{name}_{answer}_{mode}"] = rec

    layers = kept["hidden_states"]["layers"]
    out["orchestrator_prefill_rows"] = {str(k): int(v.shape[0]) for k, v in sorted(layers.items())}
    root = pathlib.Path(vllm_omni.__file__).parent
    out["readers_of_pd_prefill_by_req"] = sorted(
        str(f.relative_to(root)) for f in root.rglob("*.py")
        if "pd_prefill_multimodal_output_by_req" in f.read_text(errors="replace"))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
