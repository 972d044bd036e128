"""An engine's devices as the launch plan gives them: its logical ``devices`` mapped through
the visibility variable it starts under (``CUDA_VISIBLE_DEVICES`` ...), as vllm-omni 0.30 maps
a stage's devices (vllm_omni/entrypoints/stage_utils.py). Pure: the caller passes the
launcher's environment in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from omni_pd.compile import devices as _devices
from omni_pd.compile.devices import (DEVICE_VARS, VISIBILITY_VARS, parse_devices, parse_visible,
                                     passed_through, physical_ids, visible_value)

#: platform -> the variable that decides its visible devices (None: no device selection):
#: :data:`omni_pd.compile.devices.DEVICE_ENV`, the one table (with ``DEVICE_VARS``, the
#: variables read when it is unset: ROCm's ``HIP_VISIBLE_DEVICES``)
DEVICE_ENV = _devices.DEVICE_ENV


def launcher_visibility(environ: Mapping[str, str]) -> dict[str, str]:
    """The visibility variables (:data:`~omni_pd.compile.devices.VISIBILITY_VARS`) set in
    ``environ`` (the launcher's own environment, which every child inherits): what
    :attr:`LaunchOptions.launcher_env` holds. The CLI passes ``os.environ``; nothing else is
    kept. Pure."""
    return {v: str(environ[v]) for v in VISIBILITY_VARS if v in environ}


@dataclass(frozen=True)
class DeviceMap:
    """:func:`map_devices`'s answer for one engine.

    ``logical``: the stage's entries as written (``"0,1"``). ``physical``: the value the
    child's visibility variable is set to (``"4,5"``). ``visible``: the visibility value
    the entries index (``"4,5"``), None when unset. ``source``: where that value came
    from (``the launcher's environment``, ``--env``, ``the stage's env``). ``dropped``:
    entries outside ``visible`` (vllm-omni drops them). ``passed_through``: no entry was
    inside ``visible``, so the list is read as physical ids. ``read``: the variable
    ``visible`` was read from (ROCm: ``CUDA_VISIBLE_DEVICES``, else ``HIP_VISIBLE_DEVICES``)."""

    logical: str
    physical: str
    visible: str | None = None
    source: str | None = None
    dropped: tuple[int, ...] = ()
    passed_through: bool = False
    read: str | None = None


def map_devices(devices: str | None, var: str | tuple[str, ...] | None, stage_env: Mapping[str, Any] | None,
                opts_env: Mapping[str, str], launcher_env: Mapping[str, str]) -> DeviceMap | None:
    """Map an engine's ``devices`` (``"0,1"``, logical) to the physical ids its
    ``var`` (``CUDA_VISIBLE_DEVICES`` ...) must carry, as vllm-omni 0.30 maps a stage's
    devices (:func:`omni_pd.compile.devices.physical_ids`; vllm_omni/entrypoints/
    stage_utils.py ``resolve_stage_physical_devices``, ``_map_device_list``).

    ``var``: the platform's variables (:data:`~omni_pd.compile.devices.DEVICE_VARS`, the
    deciding one first; a str: that one alone). The visible set is ``var`` in the first of
    ``stage_env`` (the stage's own env, applied before its devices are mapped:
    vllm_omni/engine/stage_init_utils.py ``stage_runtime_setup``), ``opts_env``
    (``launch --env``, given to every process) and ``launcher_env`` (the launcher's own,
    inherited by every child) that holds it (:func:`~omni_pd.compile.devices.visible_value`).
    None when there is nothing to map (no variable, no devices, ``"cpu"``). Pure; raises
    nothing."""
    names = (var,) if isinstance(var, str) else tuple(var or ())
    if not names or devices is None:
        return None
    try:
        entries = parse_devices(devices)
    except ValueError:
        return None
    if not isinstance(entries, tuple) or not entries:
        return None
    hit = visible_value(names, stage_env, opts_env, launcher_env)
    visible = parse_visible(hit[2]) if hit is not None else None
    if hit is None or visible is None:
        return DeviceMap(devices, devices)
    ids = physical_ids(entries, visible)
    return DeviceMap(devices, ",".join(i for i in ids if i is not None), ",".join(visible),
                     ("the stage's env", "--env", "the launcher's environment")[hit[0]],
                     tuple(e for e, i in zip(entries, ids) if i is None), passed_through(entries, visible), hit[1])


def device_note(name: str, var: str, m: DeviceMap) -> str | None:
    """The launch plan's note on process ``name`` when a visibility variable remapped its
    devices (``m.visible`` set), else None: the logical entries, the physical ids the child
    gets, dropped entries and a pass-through list, each as vllm-omni treats it."""
    if m.visible is None:
        return None
    under = f"{m.read or var}={m.visible} ({m.source})"
    if m.passed_through:
        return (f"{name}: devices \"{m.logical}\" have no entry below the {len(m.visible.split(','))} of {under}: "
                f"read as physical ids, it starts with {var}={m.physical}, as vllm-omni passes such a list through "
                "(vllm_omni/entrypoints/stage_utils.py _map_device_list)")
    logical = [int(x) for x in m.logical.split(",")]
    pairs = ", ".join(f"{i}->{p}" for i, p in zip([i for i in logical if i not in m.dropped], m.physical.split(",")))
    out = f"{name}: devices \"{m.logical}\" index {under}: it starts with {var}={m.physical} (logical->physical {pairs})"
    if m.dropped:
        out += (f"; logical device{'s' if len(m.dropped) > 1 else ''} {','.join(map(str, m.dropped))} "
                f"{'are' if len(m.dropped) > 1 else 'is'} outside it and dropped, as vllm-omni drops "
                f"{'them' if len(m.dropped) > 1 else 'it'}")
    return out + " (vllm_omni/entrypoints/stage_utils.py resolve_stage_physical_devices)"


def device_fields(name: str, devices: str | None, var: str | tuple[str, ...] | None,
                  stage_env: Mapping[str, Any] | None, opts_env: Mapping[str, str],
                  launcher_env: Mapping[str, str]) -> tuple[dict[str, Any], str | None]:
    """The device fields of engine ``name``'s :class:`~omni_pd.launch.spec.ProcessSpec`
    (``devices``, ``device_env``, ``logical_devices``, ``visible_devices``; {} when ``var``
    is None or (), i.e. cpu, or the stage names no devices) and the plan's note on it
    (:func:`device_note`; None when nothing was remapped). ``var``: as :func:`map_devices`
    takes it; ``device_env`` is its first. ``devices`` are the stage's entries as
    written; :func:`map_devices` maps them (a value it cannot map, e.g. ``"cpu"``, is kept
    as written). The child's env must carry ``devices`` in every variable of ``var``
    (:func:`device_env_values`). Pure."""
    names = (var,) if isinstance(var, str) else tuple(var or ())
    if not names or devices is None:
        return {}, None
    var = names[0]
    m = map_devices(devices, names, stage_env, opts_env, launcher_env)
    if m is None:
        return {"devices": devices, "device_env": var}, None
    return ({"devices": m.physical, "device_env": var, "logical_devices": m.logical, "visible_devices": m.visible},
            device_note(name, var, m))


def device_env_values(platform: str, dev: Mapping[str, Any]) -> dict[str, str]:
    """The env a child of ``platform`` gets for :func:`device_fields`' ``dev``: its
    ``devices`` in every variable of the platform (:data:`~omni_pd.compile.devices.DEVICE_VARS`;
    ROCm: ``CUDA_VISIBLE_DEVICES`` and ``HIP_VISIBLE_DEVICES``, as vllm-omni's
    ``RocmOmniPlatform.set_device_control_env_var`` sets both); {} for an empty ``dev``."""
    return dict.fromkeys(DEVICE_VARS.get(platform, ()), dev["devices"]) if dev else {}
