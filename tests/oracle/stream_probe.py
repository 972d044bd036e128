"""Streaming PD seams on vllm-omni 0.30, driven by vllm-omni's own code (runs in the oracle venv).

Usage: ``python stream_probe.py STREAM.yaml ONE_PIECE.yaml`` (expand's outputs with and without
``async_chunk``); prints one JSON line:

* ``async_chunk_check``: vllm-omni's ``_validate_async_chunk_support`` on the streaming file's
  resolved pipeline and deploy, as upstream (``off``: the ValueError text) and with omni-pd's
  layer (``on``: None when accepted); the same with a kv_transfer_config on the Talker too (AR-to-DiT
  shape), which must stay refused;
* ``roles``: each stage's connector role from ``load_omni_transfer_config`` +
  ``get_stage_connector_spec`` (what ``stage_receives_chunks`` / ``stage_sends_async_output``
  read), for both files: without the prefill -> decode edge decode is a sender (not prewarmed),
  with it a receiver (prewarmed with a placeholder);
* ``chunk0``: the real ``thinker2talker_async_chunk`` fed a non-PD Thinker's first two steps
  (P prompt rows, then one row) and a PD decode's (its recomputed last prompt token, then one
  row) whose request carries prefill's rows through vllm-omni's own
  ``serialize_additional_information``; chunk 0 as sent, without and with omni-pd's wrapper.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from types import SimpleNamespace


def resolved(path: str):
    """(pipeline, deploy) as vllm-omni's resolver builds them for ``path`` (before the async-chunk check)."""
    import yaml
    from vllm_omni.config import pipeline_registry  # noqa: F401 - registers pipelines
    from vllm_omni.config.stage_config import load_deploy_config

    from omni_pd.upstream import vllm_plugin

    vllm_plugin.register()  # the *_pd pipelines, as omni-pd's plugin entry point does
    data = yaml.safe_load(open(path))
    pipe = vllm_plugin.find_upstream_pipeline(data["pipeline"])
    return pipe, load_deploy_config(path)


def check(fn, pipe, deploy):
    try:
        fn(pipe, deploy)
        return None
    except ValueError as e:
        return str(e)


def roles(path: str) -> dict[int, str | None]:
    import yaml
    from vllm_omni.distributed.omni_connectors.utils.initialization import load_omni_transfer_config
    from vllm_omni.engine.stage_init_utils import get_stage_connector_spec

    tc = load_omni_transfer_config(config_dict=yaml.safe_load(open(path)))
    return {s: (get_stage_connector_spec(tc, s, True).get("extra") or {}).get("role") for s in range(4)}


class Manager:
    """What thinker2talker_async_chunk reads of the chunk adapter: chunk ids, held payloads,
    the model config's accept_hidden_layer (put_req_chunk grows as the adapter does on a send)."""

    def __init__(self, accept: int):
        self.put_req_chunk: dict[str, int] = defaultdict(int)
        self.request_payload: dict = {}
        self.config = SimpleNamespace(hf_config=SimpleNamespace(talker_config=SimpleNamespace(accept_hidden_layer=accept)))


def chunk0(fn, steps, prompt_ids, out_ids_per_step, info) -> dict:
    """Run ``fn`` over ``steps`` (list of {layer: rows}) for one request; the first payload sent."""
    import torch

    mgr = Manager(1)
    for i, layers in enumerate(steps):
        out_ids = out_ids_per_step[: i + 1]
        req = SimpleNamespace(external_req_id="r", prompt_token_ids=list(prompt_ids),
                              all_token_ids=list(prompt_ids) + out_ids, output_token_ids=out_ids,
                              additional_information=info, resumable=False, num_computed_tokens=0)
        mm = {"hidden_states": {"layers": layers}, "embed": {"tts_bos": torch.ones(1, 1, 4)}}
        payload = fn(mgr, mm, req, False)
        if payload is not None:
            e, h = payload.embed.prefill, payload.hidden_states.output
            return {"step": i, "rows": int(e.shape[0]), "embed": e.float().tolist(), "hidden": h.float().tolist(),
                    "ids_all": len(payload.ids.all), "ids_prompt": len(payload.ids.prompt)}
    return {"step": None}


def main() -> int:
    import torch
    from vllm_omni.config import omni_config
    from vllm_omni.engine.serialization import serialize_additional_information
    from vllm_omni.model_executor.stage_input_processors import qwen3_omni

    from omni_pd.upstream import talker_pd, vllm_omni_compat

    stream_file, one_piece_file = sys.argv[1], sys.argv[2]
    out: dict = {}
    pipe, deploy = resolved(stream_file)
    # upstream's own functions (omni-pd's plugin may have installed the layer while the pipeline registered)
    raw_check = getattr(omni_config._validate_async_chunk_support, "__wrapped__", omni_config._validate_async_chunk_support)
    raw_chunk = getattr(qwen3_omni.thinker2talker_async_chunk, "__wrapped__", qwen3_omni.thinker2talker_async_chunk)
    out["roles"] = {"stream": roles(stream_file), "one_piece": roles(one_piece_file)}
    # the prompt of 5 tokens, hidden size 4; layer rows as a non-PD Thinker computes them
    P, H = 5, 4
    prompt_ids, gen_ids = [151644, 872, 10, 11, 77091], [101, 102, 103]
    full = {0: torch.arange(P * H, dtype=torch.float32).reshape(P, H).to(torch.bfloat16),
            1: (torch.arange(P * H, dtype=torch.float32).reshape(P, H) + 100).to(torch.bfloat16)}
    step_rows = [{0: torch.full((1, H), 50.0 + k).to(torch.bfloat16), 1: torch.full((1, H), 150.0 + k).to(torch.bfloat16)}
                 for k in range(3)]
    plain_steps = [full, step_rows[0], step_rows[1]]
    # PD decode: its first step recomputes the last prompt token (prefill's row P-1), then the same rows
    pd_steps = [{i: full[i][-1:] for i in full}, step_rows[0], step_rows[1]]
    info = serialize_additional_information({talker_pd.key_of(i): t for i, t in full.items()})
    out["chunk0_plain"] = chunk0(raw_chunk, plain_steps, prompt_ids, gen_ids, None)
    out["chunk0_pd_off"] = chunk0(raw_chunk, pd_steps, prompt_ids, gen_ids, info)
    out["async_chunk_check"] = {"off": check(raw_check, pipe, deploy)}
    report = vllm_omni_compat.install()  # "already" when the plugin installed it: the wrappers are in place either way
    out["installed"] = {k: v for k, v in vllm_omni_compat.installed().items() if k.startswith("stream_")}
    out["async_chunk_check"]["on"] = check(omni_config._validate_async_chunk_support, pipe, deploy)
    talker = next(s for s in deploy.stages if int(s.stage_id) == 2)
    talker.engine_extras["kv_transfer_config"] = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    out["async_chunk_check"]["ar_to_dit_on"] = check(omni_config._validate_async_chunk_support, pipe, deploy)
    out["chunk0_pd_on"] = chunk0(qwen3_omni.thinker2talker_async_chunk, pd_steps, prompt_ids, gen_ids, info)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
