"""vllm-omni 0.30: give the Qwen3-Omni Talker prefill's prompt rows under PD (issue 21).

The fault (docs/upstream/vllm-omni-0.30-talker-pd.md): the Talker's conditioning
(``embed.prefill`` = Thinker layer 0, ``hidden_states.output`` = layer
``talker_config.accept_hidden_layer``, ``ids``) is built in the Thinker *engine* at
request end (``model_executor/stage_input_processors/qwen3_omni.py``
``thinker2talker_full_payload``) from the rows that engine computed. Under PD that engine
is decode, which loaded the prompt's KV and recomputed only the last prompt token: its
payload has ``len(all) - len(prompt) - 1`` rows where a non-PD run has ``len(all) - 2``,
while ``ids`` still count the whole prompt. A second bug hides the rows that would fix
it (docs/upstream/vllm-omni-0.30-orchestrator-prefill-mm.md): ``engine/orchestrator.py``
``OrchestratorBase._route_output`` keeps ``getattr(output, "multimodal_output", None)``
of prefill's output, a vLLM ``RequestOutput`` that has no such attribute, so
``OrchestratorRequestState.pd_prefill_multimodal_output`` is always None; the rows are at
``output.outputs[0].multimodal_output`` (``outputs/output_processor.py``
``_new_completion_output`` attaches them to a ``MultimodalCompletionOutput``).

The seam, chosen from where the rows are (prefill's client output, in the orchestrator
thread of the API process), where the payload is built (decode engine) and where it is
read (Talker worker, ``Qwen3OmniMoeForConditionalGeneration.talker_preprocess_prefill``):

1. ``OrchestratorBase._route_output`` (orchestrator): after the original, when it kept
   None for a finished prefill output, keep ``outputs[0].multimodal_output``. Upstream's
   own ``_forward_to_next_stage_unguarded`` then copies it into
   ``bridge_states["pd_prefill_multimodal_output_by_req"]`` before it calls the Talker's
   input processor. No bytes move: the rows are already in the orchestrator (prefill's
   client output carries them in a non-PD run too, as the Thinker's).
2. ``qwen3_omni.thinker2talker_token_only`` (orchestrator, the Talker's
   ``sync_process_input_func``): after the original, put prefill's hidden-state layers
   (layer 0 and ``accept_hidden_layer``, P x H each) on the Talker prompt's
   ``additional_information`` as top-level tensor keys :data:`KEY_PREFIX` + layer
   (``data_entry_keys.flatten_payload`` keeps top-level tensors; a nested dict of tensors
   under a non-payload key would not survive ``serialize_payload``), and drop the bridge
   entry. Bytes: ``layers x P x H x itemsize`` per request over the engine request
   channel (2 x P x H x 2 B in bf16), while decode's connector payload is P - 1 rows
   per layer smaller than a non-PD Thinker's: the Talker receives one row per layer
   more than without PD (decode's recomputed last prompt token, which the merge drops).
3. ``Qwen3OmniMoeForConditionalGeneration.talker_preprocess_prefill`` (Talker worker):
   when those keys are present and decode's payload has the PD shape
   (:func:`is_pd_shape`), the original is called with prefill's rows followed by
   decode's rows without the first (:func:`merge_rows`), which is the non-PD payload
   row for row; the merged rows and released keys go back through the update dict, so
   a later chunk of a chunked prefill sees the merged payload and passes through.

Rejected: merging in the decode engine (wrapping ``thinker2talker_full_payload``) needs
the rows on the decode request, which the orchestrator's PD branch builds without
``additional_information``: three hops of P x H held in decode memory per in-flight
request. Sending them through the omni connector from prefill needs a second connector
edge and payload builder on prefill and changes the Talker's poll (``stage_id - 1``).

Qwen2.5-Omni is not covered: its builder (``stage_input_processors/qwen2_5_omni.py``
``thinker2talker_full_payload``, "under-captured prefill, skipping payload") returns
None in the decode engine when decode's rows are fewer than the prompt, so for answers
shorter than the prompt no payload reaches the Talker and there is nothing to merge
into; only a decode-side seam could fix it.

Everything here is pure (no vllm-omni, no torch import at module load): row counts,
the PD-shape test, the merge, and the key names; :mod:`omni_pd.upstream.vllm_omni_compat`
holds the wrappers that call them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

#: Top-level ``additional_information`` key prefix of prefill's layer rows on the Talker
#: request (``omni_pd_prefill_layer_0``, ``omni_pd_prefill_layer_<accept>``). No dot:
#: ``data_entry_keys.unflatten_payload`` splits dotted keys into categories.
KEY_PREFIX = "omni_pd_prefill_layer_"
#: The bridge-state key upstream's orchestrator fills (engine/orchestrator.py).
BRIDGE_KEY = "pd_prefill_multimodal_output_by_req"


def key_of(layer: int) -> str:
    """The request key of prefill's rows of Thinker layer ``layer``."""
    return f"{KEY_PREFIX}{int(layer)}"


def rows_of(t: Any) -> int:
    """Number of rows (``shape[0]``) of a tensor-like; -1 when it has no shape."""
    shape = getattr(t, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) else -1


def non_pd_rows(n_all: int) -> int:
    """Rows of the non-PD payload for ``n_all`` = prompt + generated token ids.

    A non-PD Thinker accumulates ``n_all - 1`` rows (the last token is never fed back);
    ``thinker2talker_full_payload`` drops the last of them when there is more than one."""
    acc = n_all - 1
    return acc - 1 if acc > 1 else acc


def pd_rows(n_all: int, n_prompt: int) -> int:
    """Rows of decode's payload under PD: decode accumulates the recomputed last prompt
    token plus one row per generated token but the last (``n_all - n_prompt`` rows), and
    the builder drops the last when there is more than one."""
    acc = n_all - n_prompt
    return acc - 1 if acc > 1 else acc


def is_pd_shape(rows: int, n_all: int, n_prompt: int) -> bool:
    """True when a payload of ``rows`` rows is decode's PD payload, i.e. lacks prompt
    rows: ``rows == pd_rows(n_all, n_prompt)`` and a prompt of two or more tokens (with one
    prompt token decode computed it all). Where both shapes have the same count (prompt 2,
    one generated token) it is True: :func:`merge_rows` then gives the non-PD rows
    either way."""
    return n_prompt >= 2 and n_all > n_prompt and rows == pd_rows(n_all, n_prompt)


def merge_rows(prefill: Any, decode: Any, n_all: int, cat: Callable[[list[Any]], Any] | None = None) -> Any:
    """The non-PD payload rows of one Thinker layer: prefill's ``P`` prompt rows, then
    decode's rows without its first (the recomputed last prompt token), cut to
    :func:`non_pd_rows`. ``cat`` concatenates along dim 0 (``torch.cat``)."""
    return (cat or _torch_cat)([prefill, decode[1:]])[: non_pd_rows(n_all)]


def _torch_cat(parts: list[Any]) -> Any:
    """``torch.cat`` along dim 0 in the last part's dtype: decode's payload, the dtype the
    non-PD payload has (prefill's rows may arrive through the client output in another)."""
    import torch

    return torch.cat([p.to(parts[-1].dtype) for p in parts], dim=0)


def prefill_layers(mm_output: Any) -> dict[int, Any]:
    """Thinker hidden-state layers of prefill's client output, ``{layer: [P, H]}``.

    Reads the nested shape the output processor builds (``hidden_states.layers``, a
    ``MultimodalPayload`` or dict, outputs/output_processor.py) and the flat one
    (``hidden_states.layer_N``); {} when there are none."""
    if not isinstance(mm_output, Mapping):
        return {}
    out: dict[int, Any] = {}
    hs = mm_output.get("hidden_states")
    layers = hs.get("layers") if isinstance(hs, Mapping) else None
    if isinstance(layers, Mapping):
        out.update({int(k): v for k, v in layers.items() if rows_of(v) >= 0})
    for k in mm_output:
        if isinstance(k, str) and k.startswith("hidden_states.layer_") and rows_of(mm_output[k]) >= 0:
            out.setdefault(int(k.rsplit("_", 1)[1]), mm_output[k])
    return out


def attach(additional_information: Mapping[str, Any] | None, layers: Mapping[int, Any],
           n_prompt: int) -> dict[str, Any] | None:
    """``additional_information`` with prefill's ``layers`` as top-level keys
    (:func:`key_of`); None when there is nothing to attach: no layers, or rows that are
    not the ``n_prompt`` prompt rows (a streaming session, a prefill that ran more)."""
    if not layers or any(rows_of(t) != n_prompt for t in layers.values()):
        return None
    return {**dict(additional_information or {}), **{key_of(i): t for i, t in sorted(layers.items())}}


def attached_layers(payload: Mapping[str, Any]) -> dict[int, Any]:
    """Prefill layers a Talker payload carries (:func:`attach`'s keys), ``{layer: rows}``;
    a released key (None) is not counted."""
    return {int(k[len(KEY_PREFIX):]): v for k, v in payload.items()
            if isinstance(k, str) and k.startswith(KEY_PREFIX) and v is not None}


def merge_payload(payload: Mapping[str, Any], accept_layer: int,
                  cat: Callable[[list[Any]], Any] | None = None) -> tuple[dict[str, Any] | None, str]:
    """Decide and build the Talker's prefill payload under PD: (merged payload or None,
    reason). None means: call the original with ``payload`` unchanged (reason says why:
    ``no-prefill-rows``, ``not-pd-shape``, ``missing-layer``, ``prompt-mismatch``).

    The merged payload is ``payload`` with ``embed.prefill`` = :func:`merge_rows` of layer
    0 and ``hidden_states.output`` = :func:`merge_rows` of layer ``accept_layer``
    (the layers ``thinker2talker_full_payload`` reads), every other key kept."""
    layers = attached_layers(payload)
    if not layers:
        return None, "no-prefill-rows"
    embed = payload.get("embed") or {}
    hs = payload.get("hidden_states") or {}
    ids = payload.get("ids") or {}
    n_all, n_prompt = len(ids.get("all") or ()), len(ids.get("prompt") or ())
    e, h = embed.get("prefill"), hs.get("output")
    if not (is_pd_shape(rows_of(e), n_all, n_prompt) and is_pd_shape(rows_of(h), n_all, n_prompt)):
        return None, "not-pd-shape"
    if 0 not in layers or int(accept_layer) not in layers:
        return None, "missing-layer"
    if rows_of(layers[0]) != n_prompt or rows_of(layers[int(accept_layer)]) != n_prompt:
        return None, "prompt-mismatch"
    merged = dict(payload)
    merged["embed"] = {**embed, "prefill": merge_rows(layers[0], e, n_all, cat)}
    merged["hidden_states"] = {**hs, "output": merge_rows(layers[int(accept_layer)], h, n_all, cat)}
    return merged, "merged"


def release(payload: Mapping[str, Any]) -> dict[str, None]:
    """Update-dict entries that drop prefill's rows from the Talker's request buffer
    (``_update_intermediate_buffer`` cannot delete a key; None frees the tensor)."""
    return {k: None for k in payload if isinstance(k, str) and k.startswith(KEY_PREFIX)}


def extra_bytes(layers: Mapping[int, Any]) -> int:
    """Bytes prefill's rows add to the Talker request (``numel x element_size`` summed)."""
    return sum(int(t.numel()) * int(t.element_size()) for t in layers.values())
