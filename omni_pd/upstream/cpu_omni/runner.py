"""CPU model runners for vllm-omni's AR stages (Thinker, Talker) and generation stages (Code2Wav).

Each runner is, in MRO order: :class:`CpuOmniRunnerMixin`, vllm-omni's runner
(``vllm_omni/worker/gpu_ar_model_runner.py`` ``GPUARModelRunner`` or
``gpu_generation_model_runner.py`` ``GPUGenerationModelRunner``, both over
``gpu_model_runner.py`` ``OmniGPUModelRunner``), then vLLM's
``vllm/v1/worker/cpu_model_runner.py`` ``CPUModelRunner``, then vLLM's ``GPUModelRunner``.
So the omni logic (per-request hidden states, additional_information, multimodal outputs,
the Talker's code predictor) runs on vLLM's CPU runner (CPU attention, no CUDA streams or
events, synchronous ``_to_list``). Two things the combination needs (vllm-omni 0.30.0):

* **buffer pairs**: ``CPUModelRunner.__init__`` points every ``CpuGpuBuffer.gpu`` at its
  ``.cpu`` tensor (``_postprocess_tensors``) right after ``GPUModelRunner.__init__``; the
  omni runners then make more pairs after that (``GPUARModelRunner.__init__``:
  ``input_ids``, ``inputs_embeds``, gpu_ar_model_runner.py:368-379; and, while loading the
  Talker, ``OmniGPUModelRunner._init_talker_mtp``, gpu_model_runner.py:288-291). Unaliased,
  the host side is written and the "device" copy the model reads stays zero. The mixin runs
  ``_postprocess_tensors`` again after ``__init__`` and after ``load_model``.
* **capture size**: ``_init_talker_mtp`` sizes its buffers
  ``max(max_num_reqs, compilation_config.max_cudagraph_capture_size)``
  (gpu_model_runner.py:287); on CPU there is no CUDA graph and the size is None, a
  ``TypeError`` while loading the Talker and Code2Wav. It is read as 0 for that call.

CUDA-only paths stay off by configuration: CpuPlatform forces ``async_scheduling=False``
(so the async omni output copy streams, gpu_ar_model_runner.py:180-235, are never built),
and the stages run ``enforce_eager`` (no Code2Wav CUDA graph).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
from vllm_omni.worker.gpu_generation_model_runner import GPUGenerationModelRunner


@contextmanager
def capture_size_as_zero(compilation_config: Any) -> Iterator[None]:
    """``compilation_config.max_cudagraph_capture_size`` read as 0 while it is None (CPU:
    no CUDA graphs), restored afterwards; unchanged when it has a value."""
    if getattr(compilation_config, "max_cudagraph_capture_size", 0) is not None:
        yield
        return
    compilation_config.max_cudagraph_capture_size = 0
    try:
        yield
    finally:
        compilation_config.max_cudagraph_capture_size = None


class CpuOmniRunnerMixin:
    """What a vllm-omni runner needs on top of vLLM's ``CPUModelRunner`` (module docstring).
    Must come first in the bases, before the omni runner and ``CPUModelRunner``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._postprocess_tensors()  # CPUModelRunner's: alias the pairs the omni __init__ made

    def _init_talker_mtp(self) -> None:
        with capture_size_as_zero(self.compilation_config):
            super()._init_talker_mtp()  # type: ignore[misc]

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)  # type: ignore[misc]
        self._postprocess_tensors()  # and those _init_talker_mtp made while loading


class CPUOmniARModelRunner(CpuOmniRunnerMixin, GPUARModelRunner, CPUModelRunner):
    """vllm-omni's AR runner (Thinker, Talker) on vLLM's CPU runner."""


class CPUOmniGenerationModelRunner(CpuOmniRunnerMixin, GPUGenerationModelRunner, CPUModelRunner):
    """vllm-omni's generation runner (Code2Wav) on vLLM's CPU runner."""
