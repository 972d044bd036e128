"""``CpuOmniPlatform``: vllm-omni's ``OmniPlatform`` interface on vLLM's ``CpuPlatform``.

Adapts ``vllm_omni/platforms/cuda/platform.py`` ``CudaOmniPlatform`` (the same two-base
shape: ``OmniPlatform`` first for the omni hooks, vLLM's platform for everything else) to
``vllm/platforms/cpu.py`` ``CpuPlatform`` (vllm-omni 0.30.0, vLLM 0.30.0). What differs
from simply inheriting:

* ``device_control_env_var``: CpuPlatform's is ``CPU_VISIBLE_MEMORY_NODES``
  (``vllm/utils/cpu_resource_utils.py``), so a stage's ``devices: "1"``, which vllm-omni
  writes into the platform's variable (``engine/stage_engine_startup.py``
  ``set_device_control_env_var``), would bind the engine to NUMA node 1. Here the
  variable is :data:`DEVICE_ENV`, read by nothing but vllm-omni's device bookkeeping
  (``engine/stage_phase_lock.py``, ``stage_init_utils.py``): stage devices are labels
  on CPU, every engine uses the host's cores and memory.
* ``OmniPlatform`` declares ``get_torch_device``, ``get_device_count``, ``synchronize``,
  ``get_free_memory`` ... as ``NotImplementedError`` and comes first in the MRO, so each
  is defined here; ``empty_cache`` too: ``torch.cpu`` has none and vLLM's
  ``Platform.__getattr__`` would hand back None for it.
* ``supports_torch_inductor`` / ``supports_talker_mtp_graph_capture``: False, so model
  code that would compile or graph-capture a sub-module on an accelerator stays eager
  (``model_executor/models/common/qwen3_code_predictor.py``).
* the worker classes are :mod:`omni_pd.upstream.cpu_omni.worker`'s.

Imported only when :func:`omni_pd.upstream.cpu_omni.platform_plugin` activated it.
"""

from __future__ import annotations

import os

import psutil
import torch
from vllm.platforms.cpu import CpuPlatform
from vllm_omni.platforms.interface import OmniPlatform, OmniPlatformEnum

#: the device-control variable vllm-omni sets per stage on this platform (labels only)
DEVICE_ENV = "OMNI_PD_CPU_OMNI_DEVICES"
_WORKERS = "omni_pd.upstream.cpu_omni.worker"


class CpuOmniPlatform(OmniPlatform, CpuPlatform):
    """vllm-omni on vLLM's CPU backend: one "device", the host (see the module docstring)."""

    _omni_enum = OmniPlatformEnum.OOT
    device_control_env_var = DEVICE_ENV

    @classmethod
    def get_omni_ar_worker_cls(cls) -> str:
        return f"{_WORKERS}.CPUOmniARWorker"

    @classmethod
    def get_omni_generation_worker_cls(cls) -> str:
        return f"{_WORKERS}.CPUOmniGenerationWorker"

    @classmethod
    def get_default_stage_config_path(cls) -> str:
        return "vllm_omni/deploy"  # the bundled deploy files, as on CUDA

    @classmethod
    def get_torch_device(cls, local_rank: int | None = None) -> torch.device:
        return torch.device("cpu")

    @classmethod
    def get_device_count(cls) -> int:
        return 1

    @classmethod
    def get_device_version(cls) -> str | None:
        return None

    @classmethod
    def synchronize(cls) -> None:
        return None  # CPU kernels run synchronously

    @classmethod
    def empty_cache(cls) -> None:
        return None  # no caching allocator on CPU

    @classmethod
    def supports_torch_inductor(cls) -> bool:
        return False

    @classmethod
    def supports_talker_mtp_graph_capture(cls) -> bool:
        return False

    @classmethod
    def get_free_memory(cls, device: torch.device | None = None) -> int:
        """Bytes of host memory available (``psutil``), whatever ``device``."""
        return int(psutil.virtual_memory().available)

    @classmethod
    def get_device_memory(cls, device: torch.device | None = None) -> tuple[int, int]:
        """(available, total) host memory in bytes."""
        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)

    @classmethod
    def get_device_total_memory(cls, device_id: int = 0) -> int:
        """Total host memory in bytes. CpuPlatform reads NUMA node ``device_id``, but
        here ``device_id`` is a stage's device label, not a memory node."""
        return int(psutil.virtual_memory().total)

    @classmethod
    def get_current_memory_usage(cls, device: torch.types.Device | None = None) -> float:
        """This process's resident memory in bytes."""
        return float(psutil.Process(os.getpid()).memory_info().rss)
