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
* The seams (issue 21, :func:`seam_flow`): one request through every function omni-pd's
  Talker patches wrap, first with vllm-omni alone, then after omni-pd's
  ``vllm_omni_compat.install()`` in the same process (``seams_off`` / ``seams_on``).

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


# --------------------------------------------------------------------------- the seams (issue 21)
#
# One request through every function omni-pd's Talker patches wrap, each vllm-omni's own:
# the orchestrator's ``OrchestratorBase._route_output`` on prefill's finished output (a real
# vLLM ``RequestOutput`` whose ``outputs[0]`` is vllm-omni's ``MultimodalCompletionOutput``,
# as ``outputs/output_processor.py`` builds it), ``_forward_to_next_stage_unguarded`` from
# the Thinker (or decode) to the Talker (it copies the bridge state and calls the Talker's
# input processor through ``StageEngineCoreClient.process_engine_inputs``, which resolves
# ``thinker2talker_token_only`` by module attribute as ``stage_init_utils`` does, then
# ``_build_next_stage_request`` serializes ``additional_information``), the request through
# vLLM's msgpack encoder/decoder (the engine request channel), the Talker runner's
# ``deserialize_additional_information`` + ``_update_intermediate_buffer`` with the Thinker
# engine's connector payload, and the Talker's ``talker_preprocess`` ->
# ``talker_preprocess_prefill``. Fakes stand in only for the engines, pools and modules.


def _request_output(req_id: str, prompt: list[int], generated: list[int], mm):
    """A finished Thinker-stage output as the orchestrator receives it."""
    from vllm.outputs import RequestOutput
    from vllm_omni.outputs.mm_outputs import MultimodalCompletionOutput, MultimodalPayload

    comp = MultimodalCompletionOutput(multimodal_output=MultimodalPayload.from_dict(mm) if mm else None, index=0,
                                      text="", token_ids=list(generated), cumulative_logprob=None, logprobs=None,
                                      finish_reason="stop")
    comp.cumulative_token_ids = list(generated)
    return RequestOutput(request_id=req_id, prompt=None, prompt_token_ids=list(prompt), prompt_logprobs=None,
                         outputs=[comp], finished=True)


class _Pool:
    """A stage pool: one live replica; ``submit_initial`` records the request."""

    def __init__(self, client=None, model_config=None):
        self.stage_client, self.final_output, self.stage_type = client, False, "llm"
        self.stage_vllm_config = types.SimpleNamespace(model_config=model_config)
        self.output_processor = types.SimpleNamespace(tokenizer=None)
        self.submitted: list = []

    def live_replica_ids(self):
        return [0]

    async def submit_initial(self, req_id, req_state, request, prompt_text=None, **kw):
        self.submitted.append(request)
        return 0


def _orchestrator(pd: bool, talker_client, max_model_len: int):
    """A minimal orchestrator ``self`` with the real methods the two paths call."""
    from vllm_omni.engine.orchestrator import OrchestratorBase as O

    n = 4 if pd else 3
    pools = {i: _Pool() for i in range(n)}
    pools[n - 2] = _Pool(talker_client, types.SimpleNamespace(max_model_len=max_model_len))  # the Talker
    me = types.SimpleNamespace(stage_pools=pools, _pd_pair=(0, 1) if pd else None, _pd_kv_params={},
                               _cfg_tracker=types.SimpleNamespace(is_companion=lambda r: False,
                                                                   has_companions=lambda r: False),
                               async_chunk=False)

    async def intercept(*a, **k):  # stop after the PD bookkeeping: the prefill -> decode hop is not under test
        return True

    me._intercept_stage_output = intercept
    me._next_stage_already_submitted = types.MethodType(O._next_stage_already_submitted, me)
    me._next_stage_input_is_tokens = types.MethodType(O._next_stage_input_is_tokens, me)
    me._build_next_stage_request = types.MethodType(O._build_next_stage_request, me)
    me._build_payload_sender_info = lambda *a, **k: None
    me._on_stage_submitted = lambda *a, **k: None
    me._emit_tx_edge = lambda **k: None
    return me


def _talker_client():
    """The Talker stage's client: the real ``process_engine_inputs`` with the input
    processor looked up the way ``stage_init_utils`` resolves ``sync_process_input_func``."""
    import importlib

    from vllm_omni.engine.stage_engine_core_client import StageEngineCoreClient as C

    mod = importlib.import_module("vllm_omni.model_executor.stage_input_processors.qwen3_omni")
    cl = types.SimpleNamespace(custom_process_input_func=getattr(mod, "thinker2talker_token_only"),
                               requires_multimodal_data=False, engine_input_source=[1], stage_id=2,
                               _stage_hf_config=None, vllm_config=None)
    cl._call_custom_process_input = types.MethodType(C._call_custom_process_input, cl)
    cl.process_engine_inputs = types.MethodType(C.process_engine_inputs, cl)
    return cl


def _fake_talker_model():
    """Qwen3-Omni's Talker with identity projections: the real preprocess methods bound
    to it (looked up now, so an installed wrapper is what runs)."""
    from vllm_omni.model_executor.models.qwen3_omni.qwen3_omni import Qwen3OmniMoeForConditionalGeneration as M

    ident = lambda x: x  # noqa: E731
    tc = types.SimpleNamespace(text_config=types.SimpleNamespace(hidden_size=H), codec_nothink_id=1,
                               codec_think_bos_id=2, codec_think_eos_id=3, codec_pad_id=4, codec_bos_id=5,
                               accept_hidden_layer=ACCEPT)
    fake = types.SimpleNamespace(
        config=types.SimpleNamespace(im_start_token_id=IM_START, system_token_id=SYSTEM, user_token_id=USER,
                                     assistant_token_id=ASSISTANT, tts_pad_token_id=0, talker_config=tc),
        talker_config=tc,
        thinker_config=types.SimpleNamespace(audio_token_id=AUDIO, image_token_id=-7, video_token_id=-8),
        talker=types.SimpleNamespace(text_projection=ident, hidden_projection=ident, num_code_groups=16,
                                     embed_input_ids=lambda ids: torch.zeros(len(ids), H, dtype=torch.bfloat16)),
        default_tts_text_spk_type="ethan", tts_text_spk_token_ids={"ethan": 9},
        _module_device=lambda module: torch.device("cpu"))
    for name in ("_get_tts_embed", "_get_talker_user_parts", "_get_talker_assistant_parts",
                 "_thinker_to_talker_prefill", "_talker_cache_thinker_decode_embeds", "_get_text_spk_token_id",
                 "talker_preprocess_prefill", "talker_preprocess"):
        setattr(fake, name, types.MethodType(getattr(M, name), fake))
    return fake


def _wire(request):
    """The request after the engine request channel (vLLM's msgpack encoder/decoder)."""
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
    from vllm_omni.engine import OmniEngineCoreRequest

    frames = MsgpackEncoder().encode(request)
    return MsgpackDecoder(OmniEngineCoreRequest).decode(frames), sum(len(memoryview(f)) for f in frames)


def seam_flow(tokens: list[int], prompt_len: int, pd: bool) -> dict:
    """One request Thinker -> Talker through the real seams; the Talker's prefill input."""
    import asyncio

    from vllm.sampling_params import SamplingParams
    from vllm_omni.engine.orchestrator import OrchestratorBase as O
    from vllm_omni.engine.orchestrator import OrchestratorRequestState
    from vllm_omni.engine.serialization import deserialize_additional_information
    from vllm_omni.model_executor.stage_input_processors import qwen3_omni
    from vllm_omni.worker.gpu_model_runner import OmniGPUModelRunner as R

    prompt, generated = tokens[:prompt_len], tokens[prompt_len:]
    client = _talker_client()
    me = _orchestrator(pd, client, max_model_len=4096)
    talker_stage = 2 if pd else 1
    st = OrchestratorRequestState(request_id="r", prompt={"prompt_token_ids": prompt},
                                  sampling_params_list=[SamplingParams(max_tokens=1)] * 4, final_stage_id=3)
    rec: dict = {}
    if pd:
        kept = prefill_client_output(tokens, prompt_len)  # the prefill engine's client output (max_tokens 1)
        asyncio.run(O._route_output(me, 0, 0, _request_output("r", prompt, generated[:1], kept), st, None))
        rec["orchestrator_kept"] = st.pd_prefill_multimodal_output is not None
    src = 1 if pd else 0
    asyncio.run(O._forward_to_next_stage_unguarded(me, "r", src, _request_output("r", prompt, generated, None), st))
    [request] = me.stage_pools[talker_stage].submitted
    wired, rec["request_bytes"] = _wire(request)
    info = deserialize_additional_information(wired.additional_information)
    rec["request_keys"] = sorted(info)
    rec["bridge_left"] = sorted((st.streaming.bridge_states.get("pd_prefill_multimodal_output_by_req") or {}))
    # the Thinker engine (decode under PD) ships its payload through the connector
    payload, _ = run_engine(qwen3_omni.thinker2talker_full_payload, tokens, prompt_len,
                            prompt_len - 1 if pd else 0)
    rec["connector_rows"] = {"embed.prefill": int(payload["embed"]["prefill"].shape[0]),
                             "hidden_states.output": int(payload["hidden_states"]["output"].shape[0])}
    rec["request_rows"] = {k: int(v.shape[0]) for k, v in sorted(info.items()) if isinstance(v, torch.Tensor)}
    runner = types.SimpleNamespace(requests={"r": types.SimpleNamespace()}, model=types.SimpleNamespace(),
                                   model_intermediate_buffer={"r": info} if info else {})
    runner._store_value = types.MethodType(R._store_value, runner)
    R._update_intermediate_buffer(runner, "r", payload)  # _sync_local_stage_payloads
    buf = runner.model_intermediate_buffer["r"]
    talker = _fake_talker_model()
    ids = torch.tensor(wired.prompt_token_ids)
    try:
        out_ids, embeds, update = talker.talker_preprocess(ids, None, **buf, _omni_is_prefill=True,
                                                           _omni_num_computed_tokens=0)
    except Exception as exc:  # what the Talker engine would raise
        rec["talker"] = {"error": f"{type(exc).__name__}: {exc}"}
        return rec
    trailing = (update.get("hidden_states") or {}).get("trailing_text")
    rec["talker"] = {"rows": int(embeds.shape[0]), "embeds": embeds.float().tolist(), "ids": out_ids.tolist(),
                     "trailing": trailing.float().tolist() if trailing is not None else None}
    rec["released"] = sorted(k for k, v in update.items() if k.startswith("omni_pd_prefill_layer_") and v is None)
    return rec


def seams(cases: dict) -> dict:
    """:func:`seam_flow` for every case, without and with PD."""
    return {f"{name}_{'pd' if pd else 'plain'}": seam_flow(tokens, p, pd)
            for name, (tokens, p) in cases.items() for pd in (False, True)}


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
    sources = {str(f.relative_to(root)): f.read_text(errors="replace") for f in root.rglob("*.py")}
    out["readers_of_pd_prefill_by_req"] = sorted(f for f, t in sources.items() if "pd_prefill_multimodal_output_by_req" in t)
    # a merge of its own would be a definition (0.30.0 names one only in a log message)
    out["merge_definitions"] = sorted(f for f, t in sources.items() if "def _merge_pd_embeddings" in t)

    # the seams: upstream alone (omni-pd's layer not installed in this process), then with it
    cases = {"short": (prompt + [31, 32, 33, 34, 35, 36, IM_END], p),
             "long": (prompt + list(range(40, 70)) + [IM_END], p),
             "one": (prompt + [IM_END], p)}
    out["seams_off"] = seams(cases)
    from omni_pd.upstream.vllm_omni_compat import install

    rep = install()
    out["install"] = {"status": rep.status, "patched": list(rep.patched)}
    out["seams_on"] = seams(cases)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
