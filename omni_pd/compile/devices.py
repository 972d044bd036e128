"""Stage device lists: the ``devices`` value of a deploy stage, parsed and formatted, the
platforms they live on, and how they map to physical devices.

A leaf module (no omni-pd imports) so that the model, the topology and the emitter can
all use it without importing one another.
"""

from __future__ import annotations

from typing import Any, Mapping, Union

#: Platform names a deploy file's ``platforms:`` block may hold, one per accelerator kind a
#: stage's devices can be (vllm-omni 0.30.0 ``_apply_platform_overrides``,
#: config/stage_config.py: the overlay named after ``current_omni_platform.device_name``).
PLATFORMS = ("cuda", "rocm", "npu", "xpu", "musa")

#: Platforms an engine can run on (``launch --platform``, ``validate --platform``): every
#: overlay platform, plus ``cpu`` (vLLM's CPU backend, omni-pd's CPU omni platform): no
#: devices and no overlay of its own, so a CPU run reads the base stages; what differs there
#: is judged for the run itself (the NIXL KV lease, OPD623). :data:`DEVICE_ENV` has one
#: entry per name (tests/test_validate_cpu_platform.py).
RUN_PLATFORMS = PLATFORMS + ("cpu",)

#: platform -> the variables that select its visible devices, the one that decides first:
#: the platform's ``device_control_env_var`` (vLLM 0.30 vllm/platforms/cuda.py, rocm.py,
#: xpu.py; vllm-ascend's NPU platform; vllm-omni 0.30's MUSA platform writes
#: ``MUSA_VISIBLE_DEVICES``, vllm_omni/platforms/musa/platform.py), which vllm-omni 0.30
#: reads to map a stage's devices (vllm_omni/entrypoints/stage_utils.py
#: ``resolve_stage_physical_devices``), then the variables vLLM also reads when that one is
#: unset. ``cpu``: none (no devices).
#:
#: ROCm: vLLM 0.30's ``RocmPlatform.device_control_env_var`` is ``CUDA_VISIBLE_DEVICES``
#: ("rocm shares the same device control env var as CUDA"); ``HIP_VISIBLE_DEVICES`` is read
#: only when ``CUDA_VISIBLE_DEVICES`` is unset or empty: vllm/platforms/rocm.py
#: ``_sync_hip_cuda_env_vars`` copies it into ``CUDA_VISIBLE_DEVICES`` at import (an empty
#: value counts as unset), and raises ValueError ("Inconsistent GPU visibility env vars")
#: when both are set and differ. So ``CUDA_VISIBLE_DEVICES`` wins when both are set
#: (:func:`visible_value`), and every child gets both set to its list, as vllm-omni 0.30's
#: ``RocmOmniPlatform.set_device_control_env_var`` writes them (vllm_omni/platforms/rocm/
#: platform.py), so vLLM's check passes in it. ``ROCR_VISIBLE_DEVICES`` (the ROCr runtime's
#: filter, applied below HIP: the ids above index what it leaves visible) is read by neither
#: vLLM nor vllm-omni and is left alone.
DEVICE_VARS: dict[str, tuple[str, ...]] = {
    "cuda": ("CUDA_VISIBLE_DEVICES",), "rocm": ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"),
    "npu": ("ASCEND_RT_VISIBLE_DEVICES",), "xpu": ("ZE_AFFINITY_MASK",), "musa": ("MUSA_VISIBLE_DEVICES",),
    "cpu": (),
}

#: platform -> the variable that decides its visible devices (:data:`DEVICE_VARS`' first;
#: None: no device selection): the name plans and messages give (``device_env``)
DEVICE_ENV: dict[str, str | None] = {p: (vs[0] if vs else None) for p, vs in DEVICE_VARS.items()}

#: every variable of :data:`DEVICE_VARS`, once each (what ``launch`` keeps of its own environment)
VISIBILITY_VARS: tuple[str, ...] = tuple(dict.fromkeys(v for vs in DEVICE_VARS.values() for v in vs))


def visible_value(names: tuple[str, ...], *envs: Mapping[str, Any] | None) -> tuple[int, str, str] | None:
    """Where a platform's visible set comes from: ``(i, name, value)`` for the first of
    ``envs`` (highest precedence first: a stage's env, ``--env``, the launcher's) that holds
    any of ``names`` (:data:`DEVICE_VARS` of the platform): ``i`` its index in ``envs``,
    ``name`` the first of ``names`` set non-blank there (the first present when all are
    blank: every device visible), ``value`` its value as a string. None when no env holds
    any. ``("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")`` with both set:
    ``CUDA_VISIBLE_DEVICES``, as vLLM 0.30 reads it (:data:`DEVICE_VARS`). Pure."""
    for i, env in enumerate(envs):
        present = [n for n in names if env and n in env]
        if present:
            name = next((n for n in present if str(env[n]).strip()), present[0])  # type: ignore[index]
            return i, name, str(env[name])  # type: ignore[index]
    return None


#: A stage's devices: logical indices, the string "cpu", or None (default visibility).
Devices = Union[tuple[int, ...], str, None]

def parse_devices(raw: Any) -> Devices:
    """``"0,1"`` -> ``(0, 1)``; ``3`` -> ``(3,)``; ``"cpu"``/None -> unchanged.

    Raises ValueError for anything else (negative or non-integer entries, duplicates).
    Source: vllm-omni ``set_stage_devices`` (devices are logical indices into the
    launcher's visibility variable).
    """
    if raw is None:
        return None
    if isinstance(raw, bool):
        raise ValueError(f"devices must be a list like \"0,1\", found {raw!r}")
    if isinstance(raw, int):
        if raw < 0:
            raise ValueError(f"device index must be >= 0, found {raw}")
        return (raw,)
    s = str(raw).strip()
    if s.lower() == "cpu":
        return "cpu"
    parts = [p.strip() for p in s.split(",")]
    out: list[int] = []
    for p in parts:
        if not p.isdigit():
            raise ValueError(f"devices must be comma-separated device indices like \"0,1\", found {s!r}")
        out.append(int(p))
    if len(set(out)) != len(out):
        raise ValueError(f"devices lists a device twice: {s!r}")
    return tuple(out)


def format_devices(d: Devices) -> str | None:
    """``(0, 1)`` -> ``"0,1"``; ``"cpu"``/None unchanged (the inverse of :func:`parse_devices`)."""
    if d is None or isinstance(d, str):
        return d
    return ",".join(str(i) for i in d)


# --- logical -> physical ---------------------------------------------------------------------------
#
# The one place omni-pd maps a stage's ``devices`` entries to the devices an engine really
# uses. The rules, all from vllm-omni 0.30.0 / vLLM 0.30.0:
#
# * ``devices`` entries are logical indices into the visibility variable the stage starts
#   under (``CUDA_VISIBLE_DEVICES``, ``ASCEND_RT_VISIBLE_DEVICES``, ...): entry ``i`` is
#   ``visible[i]``; with the variable unset, logical == physical
#   (vllm_omni/entrypoints/stage_utils.py ``resolve_stage_physical_devices``,
#   ``_map_device_list``). A stage's own ``env``/``runtime.env`` is applied before its
#   devices are mapped (engine/stage_init_utils.py ``stage_runtime_setup``), so a stage
#   env value of the variable is that stage's visible set.
# * An entry outside the visible set is dropped (a warning, "Falling back to mapped
#   subset"), unless *every* entry is outside it: then the whole list is passed through
#   as physical ids (``_map_device_list``'s replica pass-through).
# * The engine then sees only the mapped list, and vLLM's worker for local rank ``r``
#   takes ``cuda:(dp_local_rank * TP * PP + r)`` with ``r = pp_rank * TP + tp_rank``
#   (vllm/v1/worker/gpu_worker.py ``Worker.init_device``): the ranks take the entries in
#   order, per DP replica, and entries past the world size are used by no rank.
# * A pool of ``num_replicas`` (``len(devices) == world * num_replicas``) gives replica
#   ``r`` the ``r``-th run of ``world`` consecutive entries; a list of one replica's
#   ``world`` entries is a template: replica ``r`` gets ``r * world + a`` for each entry
#   ``a`` (< ``world``, else ValueError); each replica's list is then mapped on its own
#   (engine/stage_init_utils.py ``split_devices_for_replicas``: :func:`split_replica_devices`).


def parse_visible(raw: Any) -> tuple[str, ...] | None:
    """A visibility variable's value -> its ids (``"4, 5,"`` -> ``("4", "5")``); None when
    unset or blank (every device visible, logical == physical)."""
    if raw is None or not str(raw).strip():
        return None
    return tuple(p.strip() for p in str(raw).split(",") if p.strip())


def physical_ids(devices: tuple[int, ...], visible: tuple[str, ...] | None) -> tuple[str | None, ...]:
    """The physical id of each entry of ``devices`` (same length), None for an entry
    vllm-omni drops (outside ``visible`` while another entry is inside it). ``visible``:
    :func:`parse_visible`'s result. Pure; raises nothing."""
    if visible is None or (devices and all(i >= len(visible) for i in devices)):
        return tuple(str(i) for i in devices)  # unset, or vllm-omni's pass-through as physical ids
    return tuple(visible[i] if i < len(visible) else None for i in devices)


def passed_through(devices: tuple[int, ...], visible: tuple[str, ...] | None) -> bool:
    """True when vllm-omni reads ``devices`` as physical ids: ``visible`` is set and no
    entry indexes into it (``_map_device_list``)."""
    return visible is not None and bool(devices) and all(i >= len(visible) for i in devices)


def device_name(logical: int, visible: tuple[str, ...] | None, var: str | None, word: str = "GPU",
                all_outside: bool = False, short: bool = False) -> str:
    """How a message names entry ``logical`` of a stage's devices, e.g. ``logical device 1
    (physical GPU 5 under CUDA_VISIBLE_DEVICES=4,5)``; with the variable unset ``physical
    GPU 1`` (logical == physical). ``all_outside``: the stage's list is passed through
    (:func:`passed_through`). ``short``: the form for one term of a sum whose physical
    device is named already (``logical device 1 of CUDA_VISIBLE_DEVICES=4,5``)."""
    under = f"{var or 'the visibility variable'}={','.join(visible)}" if visible is not None else ""
    if short:
        if visible is None:
            return f"logical device {logical}, {var or 'the visibility variable'} unset"
        if all_outside:
            return f"device {logical} read as physical: no entry below the {len(visible)} visible"
        return f"logical device {logical} of {under}"
    if visible is None:
        return f"physical {word} {logical}"
    if all_outside:
        return (f"device {logical} (read as physical {word} {logical}: no entry of the stage's devices is below "
                f"the {len(visible)} in {under})")
    if logical >= len(visible):
        return f"logical device {logical} (outside {under}: vllm-omni drops it)"
    return f"logical device {logical} (physical {word} {visible[logical]} under {under})"


def rank_names(count: int, tp: int, pp: int, dp: int, world: int, replicas: int = 1) -> tuple[str | None, ...]:
    """The engine rank on each of a stage's ``count`` device entries, as vLLM assigns them
    (module notes): ``"TP rank 1"``, ``"DP rank 1, TP rank 0"``, ``"replica 1, TP rank 1"``;
    ``""`` for a one-device engine; ``"rank 3"`` when ``world`` (the devices one replica
    needs) is not TP x PP x DP (prefill context or diffusion parallelism); None for an
    entry no rank uses (past ``world`` x ``replicas``, ``replicas`` > 1 in pool mode only).
    Sizes are ints >= 1."""
    pool = replicas > 1 and count == world * replicas
    used = world * (replicas if pool else 1)
    out: list[str | None] = []
    for k in range(count):
        if k >= used:
            out.append(None)
            continue
        j = k % world
        parts = [f"replica {k // world}"] if pool else []
        if world == tp * pp * dp:
            tp_pp = tp * pp
            if dp > 1:
                parts.append(f"DP rank {j // tp_pp}")
            if pp > 1:
                parts.append(f"PP rank {j % tp_pp // tp}")
            if tp > 1:
                parts.append(f"TP rank {j % tp}")
        elif world > 1:
            parts.append(f"rank {j}")
        out.append(", ".join(parts))
    return tuple(out)


class ReplicaSplitError(ValueError):
    """A ``devices`` value vllm-omni cannot split into ``num_replicas`` replicas (the
    ValueErrors of ``split_devices_for_replicas``). ``kind``: ``"offset"`` (template mode,
    an entry outside ``[0, per_replica)``: ``bad`` lists them), ``"int"`` (template mode, an
    entry that is not an integer) or ``"length"`` (neither ``per_replica`` nor
    ``num_replicas x per_replica`` entries). The message is vllm-omni's own."""

    def __init__(self, message: str, kind: str, bad: tuple[int, ...] = ()):
        super().__init__(message)
        self.kind, self.bad = kind, bad


def split_replica_devices(devices: str | None, num_replicas: int, per_replica: int,
                          stage_id: int = 0) -> list[str | None]:
    """vllm-omni 0.30.0's ``split_devices_for_replicas(devices_str, num_replicas,
    devices_per_replica, stage_id)`` (vllm_omni/engine/stage_init_utils.py, called by
    ``compute_replica_layout`` with ``get_stage_devices_per_replica``: TP x local DP x PP
    for an LLM stage, the diffusion world size otherwise), re-implemented: one devices
    string per replica, always ``max(1, num_replicas)`` of them.

    * ``devices`` None: ``[None] * num_replicas`` (no placement: the launcher's visibility).
    * ``num_replicas`` <= 1: ``[devices]`` unchanged.
    * **pool mode**, ``len == num_replicas x per_replica``: replica r gets entries
      ``[r*per_replica, (r+1)*per_replica)``: ``("1,2,3,4", 2, 2) -> ["1,2", "3,4"]``.
    * **template mode**, ``len == per_replica``: replica r gets ``r*per_replica + a`` for
      each entry ``a``, which must lie in ``[0, per_replica)``: ``("0,1", 2, 2) -> ["0,1",
      "2,3"]``, ``("0", 2, 1) -> ["0", "1"]``; ``("1", 2, 1)`` raises (offset 1 out of
      range [0, 1)).
    * any other length raises.

    Entries are split on ``,`` and stripped, blanks dropped, as upstream. Raises
    :class:`ReplicaSplitError` (a ValueError) with vllm-omni's message and a ``kind``.
    Pure (tests/test_replica_devices.py compares it with the real function)."""
    if devices is None:
        return [None] * max(1, num_replicas)
    if num_replicas <= 1:
        return [devices]
    items = [d.strip() for d in devices.split(",") if d.strip()]
    if len(items) == num_replicas * per_replica:
        return [",".join(items[r * per_replica:(r + 1) * per_replica]) for r in range(num_replicas)]
    if len(items) == per_replica:
        try:
            offsets = [int(a) for a in items]
        except ValueError:
            raise ReplicaSplitError(f"Stage {stage_id}: template-mode devices must be ints, got {devices!r}",
                                    "int") from None
        bad = [a for a in offsets if not 0 <= a < per_replica]
        if bad:
            raise ReplicaSplitError(f"Stage {stage_id}: template-mode device offset(s) {bad} out of range "
                                    f"[0, {per_replica}); devices={devices!r}", "offset", tuple(bad))
        return [",".join(str(r * per_replica + a) for a in offsets) for r in range(num_replicas)]
    raise ReplicaSplitError(
        f"Stage {stage_id}: devices={devices!r} has {len(items)} id(s); need either {per_replica} (per-replica "
        f"template) or {num_replicas * per_replica} (pool / legacy). num_replicas={num_replicas}, "
        f"devices_per_replica={per_replica}.", "length")


def replica_devices(devices: Devices, num_replicas: int, per_replica: int) -> tuple[Devices, ...] | None:
    """The devices of each of a stage's ``num_replicas`` replicas (one entry per replica,
    >= 1), :func:`split_replica_devices` on parsed devices: ``((0,), 2, 1) -> ((0,), (1,))``
    (template), ``((0, 1), 2, 1) -> ((0,), (1,))`` (pool); "cpu"/None: every replica gets
    it as written. None when vllm-omni refuses the split (the error: call
    :func:`split_replica_devices`). Pure."""
    reps = max(1, num_replicas)
    if not isinstance(devices, tuple):
        return (devices,) * reps
    try:
        parts = split_replica_devices(format_devices(devices), reps, max(1, per_replica))
    except ReplicaSplitError:
        return None
    return tuple(parse_devices(p) for p in parts)
