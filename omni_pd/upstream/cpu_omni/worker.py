"""CPU workers for vllm-omni stages: vllm-omni's ``OmniWorkerMixin`` on vLLM's ``CPUWorker``.

vllm-omni 0.30.0's own workers (``vllm_omni/worker/gpu_ar_worker.py`` ``GPUARWorker``,
``gpu_generation_worker.py`` ``GPUGenerationWorker``) derive from
``worker/base.py`` ``OmniGPUWorkerBase``, whose ``init_device`` refuses any device but
cuda/musa and whose ``determine_available_memory`` profiles device memory; on CPU neither
applies. These workers keep what vllm-omni's workers add that is not device code,
``worker/mixins.py`` ``OmniWorkerMixin`` (loads vllm-omni's general plugins in the worker
process, fans the Mooncake KV config out after ``initialize_from_config``), and take the
rest from ``vllm/v1/worker/cpu_worker.py`` ``CPUWorker`` (gloo, thread binding, host
memory accounting for the KV cache, ``VLLM_CPU_KVCACHE_SPACE``).

``CPUWorker.init_device`` ends by building vLLM's ``CPUModelRunner`` (a module-level name
of ``cpu_worker``); :func:`runner_class_during_init` points that name at the omni runner
for the duration of the call, so one runner is built, the omni one, by vLLM's own
``init_device``. vLLM's V2 model runner has no omni counterpart on CPU and is refused.

vLLM 0.30's ``MooncakeConnectorWorker.__init__``
(``vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py``) asks
``torch.accelerator.current_device_index()`` for the device its sender threads bind to;
with no accelerator torch raises ``RuntimeError: Cannot access accelerator device when none
is available`` and a Mooncake stage dies while its KV connector is built
(``Worker.initialize_from_config`` -> ``ensure_kv_transfer_initialized``).
:func:`cpu_device_index` answers 0 there for the duration of that call only, and only when
torch sees no accelerator; ``CpuPlatform.set_device(0)`` is then ``torch.cpu.set_device``,
a no-op. Nothing else in the connector touches a
device: the Transfer Engine registers the host KV cache like any buffer (``tcp`` protocol).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import vllm.v1.worker.cpu_worker as cpu_worker
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm_omni.worker.mixins import OmniWorkerMixin

from .runner import CPUOmniARModelRunner, CPUOmniGenerationModelRunner


@contextmanager
def runner_class_during_init(runner_cls: type) -> Iterator[None]:
    """``vllm.v1.worker.cpu_worker.CPUModelRunner`` is ``runner_cls`` inside the block
    (``CPUWorker.init_device`` constructs the runner through that name), restored after."""
    original = cpu_worker.CPUModelRunner
    cpu_worker.CPUModelRunner = runner_cls
    try:
        yield
    finally:
        cpu_worker.CPUModelRunner = original


@contextmanager
def cpu_device_index() -> Iterator[None]:
    """Inside the block ``torch.accelerator.current_device_index()`` returns 0 when torch
    has no accelerator (it raises ``RuntimeError`` then); with an accelerator, or after the
    block, it is torch's own function."""
    import torch

    original = torch.accelerator.current_device_index
    if not torch.accelerator.is_available():
        torch.accelerator.current_device_index = lambda: 0
    try:
        yield
    finally:
        torch.accelerator.current_device_index = original


class _CPUOmniWorkerBase(OmniWorkerMixin, CPUWorker):
    """``CPUWorker`` whose ``init_device`` builds :attr:`model_runner_cls`."""

    model_runner_cls: type = CPUOmniARModelRunner

    def init_device(self) -> None:
        if self.use_v2_model_runner or getattr(self.model_config, "use_v2_model_runner", False):
            raise RuntimeError("omni-pd CPU OmniPlatform: vLLM's V2 model runner has no vllm-omni CPU runner; "
                               "unset VLLM_USE_V2_MODEL_RUNNER / use_v2_model_runner for this stage")
        with runner_class_during_init(self.model_runner_cls):
            super().init_device()
        if not isinstance(self.model_runner, self.model_runner_cls):
            raise RuntimeError(f"omni-pd CPU OmniPlatform: CPUWorker.init_device built {type(self.model_runner)!r}, "
                               f"not {self.model_runner_cls.__name__}: vLLM's CPU worker changed")

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        """vLLM's (and ``OmniWorkerMixin``'s) ``initialize_from_config`` with the KV
        connector built under :func:`cpu_device_index` (MooncakeConnector's worker asks for
        an accelerator index)."""
        with cpu_device_index():
            super().initialize_from_config(kv_cache_config)

    def encoder_loaded(self) -> bool:
        """vllm-omni's ``collective_rpc`` probe for voice-cloning encoders
        (``worker/base.py`` ``OmniGPUWorkerBase.encoder_loaded``)."""
        model: Any = getattr(self.model_runner, "model", None)
        return bool(model is not None and hasattr(model, "encoder_loaded") and model.encoder_loaded())


class CPUOmniARWorker(_CPUOmniWorkerBase):
    """Worker of an autoregressive omni stage (Thinker, Talker) on CPU."""

    model_runner_cls = CPUOmniARModelRunner


class CPUOmniGenerationWorker(_CPUOmniWorkerBase):
    """Worker of a generation stage (Code2Wav) on CPU. ``CPUWorker.compile_or_warm_up_model``
    already warms up only models without a KV cache, as vllm-omni's
    ``GPUGenerationWorker.compile_or_warm_up_model`` wants for generation stages."""

    model_runner_cls = CPUOmniGenerationModelRunner
