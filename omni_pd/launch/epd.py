"""The encoder leg of E -> PD / E -> P -> D, as pure functions on request bodies (dicts).

Protocol (vLLM's disaggregated-encoder example proxy, ``examples/disaggregated/
disaggregated_encoder/``; shared/reference/feasibility_cpu.md §6, run on vLLM 0.30):

1. every media part of the client's chat messages (``image_url``, ``input_audio``,
   ``audio_url``, ``video_url``) is sent to the encoder instance E as its own request: the
   client's body with ``messages`` = one user message holding only that part (the text is
   removed), ``max_tokens`` 1, not streamed;
2. E runs the encoder, its ``ec_producer`` stores the output, and its answer carries
   ``ec_transfer_params`` (a mapping keyed by the item's ``mm_hash``, e.g.
   ``{"<hash>": {"metadata": {"image_grid_thw": [1, 8, 8]}}}``);
3. the client's original body, with the items' ``ec_transfer_params`` merged in, goes to
   the consumer (the combined instance, or prefill then decode as today). The consumer
   still receives the media (it runs the HF processor for the placeholders) but loads
   the encoder output instead of running the encoder.

A request without media parts skips E (seed 003: "language-only requests bypass the
vision encoder entirely"). ``/v1/completions`` bodies carry no media parts in the OpenAI
format, so they always skip E. Nothing here does I/O; the router's
:class:`~omni_pd.launch.router.encode.EncodeLeg` sends the legs.
"""

from __future__ import annotations

import copy
from typing import Any

#: chat content part types that E encodes (vLLM's chat parser: image_url, input_audio,
#: audio_url, video_url; vllm/entrypoints/chat_utils.py)
MEDIA_PART_TYPES = ("image_url", "input_audio", "audio_url", "video_url")

#: keys of the client's body that E's one-token leg must not carry: streaming, stop
#: conditions, lower bounds on length, and a KV handoff meant for the P/D legs
ENCODER_DROP = ("stream", "stream_options", "min_tokens", "min_completion_tokens", "stop", "stop_token_ids",
                "kv_transfer_params", "ec_transfer_params", "n", "logprobs", "top_logprobs", "tools", "tool_choice",
                "response_format")


def media_parts(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(message role, part)`` for every media part of ``body["messages"]``, in order.
    A body that is not a chat request, or has string contents only, gives []."""
    out: list[tuple[str, dict[str, Any]]] = []
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        return out
    for m in msgs:
        if not isinstance(m, dict) or not isinstance(m.get("content"), list):
            continue
        for part in m["content"]:
            if isinstance(part, dict) and part.get("type") in MEDIA_PART_TYPES:
                out.append((str(m.get("role") or "user"), part))
    return out


def needs_encoder(body: dict[str, Any]) -> bool:
    """True when ``body`` has at least one media part (else E is skipped)."""
    return bool(media_parts(body))


def encoder_request_bodies(body: dict[str, Any]) -> list[dict[str, Any]]:
    """One E request per media part of ``body`` (see the module doc): the client's other
    settings (model, sampling) kept, :data:`ENCODER_DROP` removed, ``messages`` = that
    part alone in a message of its role, ``max_tokens`` 1 (``max_completion_tokens`` 1 too
    when the client set it), ``stream`` false. ``body`` is not modified."""
    out = []
    for role, part in media_parts(body):
        b = {k: copy.deepcopy(v) for k, v in body.items() if k not in ENCODER_DROP and k != "messages"}
        b["messages"] = [{"role": role, "content": [copy.deepcopy(part)]}]
        b["max_tokens"] = 1
        if "max_completion_tokens" in body:
            b["max_completion_tokens"] = 1
        b["stream"] = False
        out.append(b)
    return out


def merge_ec_params(body: dict[str, Any], answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The consumer's body: ``body`` with the ``ec_transfer_params`` of every E answer
    merged into one mapping (later answers win on a repeated key, e.g. the same image
    twice; the client's own ``ec_transfer_params`` first). Answers without params add
    nothing (the consumer then encodes those items itself: correct, not disaggregated).
    ``body`` is not modified; with nothing to merge it is returned as a copy."""
    merged: dict[str, Any] = {}
    own = body.get("ec_transfer_params")
    if isinstance(own, dict):
        merged.update(own)
    for a in answers:
        p = a.get("ec_transfer_params") if isinstance(a, dict) else None
        if isinstance(p, dict):
            merged.update(p)
    out = dict(body)
    if merged:
        out["ec_transfer_params"] = merged
    return out


def missing_params(answers: list[dict[str, Any]]) -> int:
    """How many E answers came back without ``ec_transfer_params`` (logged by the router)."""
    return sum(1 for a in answers if not (isinstance(a, dict) and isinstance(a.get("ec_transfer_params"), dict)))
