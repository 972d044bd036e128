"""vllm-omni 0.30: the orchestrator never keeps prefill's rows under PD (upstream-only reproducer).

Run with vllm-omni 0.30.0 + vLLM 0.30.0 and no plugin: ``VLLM_PLUGINS= python repro_orchestrator_prefill_mm.py``.

Builds a finished prefill-stage output exactly as ``outputs/output_processor.py`` hands it
to the orchestrator (a vLLM ``RequestOutput`` whose ``outputs[0]`` is vllm-omni's
``MultimodalCompletionOutput`` carrying the Thinker's hidden-state layers) and runs the
real ``OrchestratorBase._route_output`` on it with a PD pair (0, 1) and a minimal ``self``.
"""

from __future__ import annotations

import asyncio
import types

import torch
from vllm.outputs import RequestOutput
from vllm_omni.engine.orchestrator import OrchestratorBase, OrchestratorRequestState
from vllm_omni.outputs.mm_outputs import MultimodalCompletionOutput, MultimodalPayload

P, H = 21, 8
rows = {"hidden_states": {"layers": {0: torch.zeros(P, H), 24: torch.ones(P, H)}}, "latent": torch.zeros(P, H)}
completion = MultimodalCompletionOutput(multimodal_output=MultimodalPayload.from_dict(rows), index=0, text="",
                                        token_ids=[31], cumulative_logprob=None, logprobs=None, finish_reason="length")
output = RequestOutput(request_id="r", prompt=None, prompt_token_ids=list(range(P)), prompt_logprobs=None,
                       outputs=[completion], finished=True, kv_transfer_params={"remote_request_id": "r"})


async def intercept(*args, **kwargs):  # stop before forwarding to decode: not under test
    return True


me = types.SimpleNamespace(
    stage_pools={0: types.SimpleNamespace(final_output=False)}, _pd_pair=(0, 1), _pd_kv_params={},
    _cfg_tracker=types.SimpleNamespace(is_companion=lambda r: False), _intercept_stage_output=intercept)
state = OrchestratorRequestState(request_id="r")
asyncio.run(OrchestratorBase._route_output(me, 0, 0, output, state, None))

print("type(output):", type(output).__name__, "| hasattr(output, 'multimodal_output'):",
      hasattr(output, "multimodal_output"))
print("output.outputs[0].multimodal_output layers:",
      {k: tuple(v.shape) for k, v in output.outputs[0].multimodal_output["hidden_states"]["layers"].items()})
print("kept kv_transfer_params:", me._pd_kv_params.get("r"))
print("req_state.pd_prefill_multimodal_output:", state.pd_prefill_multimodal_output)
