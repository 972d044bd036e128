"""Device and port allocation for a prefill/decode split. Pure functions.

Devices are logical indices into the launcher's visibility variable
(``CUDA_VISIBLE_DEVICES``, ``ASCEND_RT_VISIBLE_DEVICES``, ...), as vllm-omni's
``devices: "0,1"`` uses them. Ports are TCP ports on one host (1..65535).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from omni_pd.compile.topology import Devices

MAX_PORT = 65535


class AllocationError(ValueError):
    """No valid allocation exists (e.g. the port space above the base is exhausted)."""


@dataclass(frozen=True)
class DeviceLayout:
    """Result of :func:`split_devices`: prefill and decode devices, and the new devices
    of every other stage, keyed by its *old* stage id."""

    prefill: Devices
    decode: Devices
    others: dict[int, Devices]


def split_devices(layout: Mapping[int, Devices], split_id: int, world: int,
                  prefill: tuple[int, ...] | None = None,
                  decode: tuple[int, ...] | None = None,
                  downstream: tuple[int, ...] | None = None,
                  decode_count: int | None = None) -> DeviceLayout:
    """Place prefill and decode on disjoint device sets and move the other stages out
    of their way.

    ``layout``: old stage id -> devices (the split stage included). ``world``: devices
    per engine (TP x PP x DP). Rules:

    * prefill keeps the split stage's devices (or the first ``world`` from its lowest
      device, when ``world`` changed); ``prefill=`` overrides;
    * decode gets as many devices as prefill (``decode_count`` when given: xPyD with a
      different number of decode instances), the next ones above it that no one uses, else
      ``decode=``;
    * a stage that shared a device with the split stage keeps sharing it with prefill
      (same list position, while prefill still has that position; else it moves);
    * every other device in use maps, in ascending order, to the smallest id at or above
      itself that prefill/decode do not use, so distinct devices stay distinct and shared
      devices stay shared; ``downstream=`` places all other stages there instead;
    * "cpu" and None stages are left alone; a "cpu" split stage gives "cpu" to both.
    """
    t_dev = layout.get(split_id)
    others_in = {k: v for k, v in layout.items() if k != split_id}
    if t_dev == "cpu" and prefill is None and decode is None:
        return DeviceLayout("cpu", "cpu", dict(others_in))
    used_other = sorted({d for v in others_in.values() if isinstance(v, tuple) for d in v})
    if isinstance(t_dev, tuple) and t_dev:
        base = t_dev
    else:
        # no devices on the split stage: start after everything in use
        start = (max(used_other) + 1) if used_other else 0
        base = tuple(range(start, start + world))
    if prefill is not None:
        p = tuple(prefill)
    elif len(base) == world:
        p = base
    else:
        p = tuple(range(min(base), min(base) + world))
    taken = set(p)
    if decode is not None:
        d = tuple(decode)
    else:
        d_list: list[int] = []
        cand = max(p) + 1
        while len(d_list) < (decode_count or len(p)):
            if cand not in taken and (cand not in used_other or isinstance(t_dev, tuple)):
                d_list.append(cand)
            cand += 1
        d = tuple(d_list)
    if set(p) & set(d):
        raise AllocationError(f"prefill devices \"{_fmt(p)}\" and decode devices \"{_fmt(d)}\" overlap")
    if decode_count is not None and len(d) != decode_count:
        raise AllocationError(f"decode has {len(d)} device(s) (\"{_fmt(d)}\") but its instances need "
                              f"{decode_count}")
    if decode_count is None and len(p) != len(d):
        raise AllocationError(f"prefill has {len(p)} device(s) (\"{_fmt(p)}\") but decode has {len(d)} "
                              f"(\"{_fmt(d)}\"); both halves need the same count")
    taken |= set(d)
    t_list = list(t_dev) if isinstance(t_dev, tuple) else []
    remap: dict[int, int] = {}
    last = -1
    for dev in used_other:
        if dev in t_list and t_list.index(dev) < len(p):
            # shared with the split stage: keep sharing the same position of prefill
            # (a position prefill no longer has, after a smaller --tp, is moved like
            # any other device, so two devices never collapse into one)
            remap[dev] = p[t_list.index(dev)]
            continue
        cand = max(dev, last + 1)
        while cand in taken:
            cand += 1
        remap[dev] = cand
        last = cand
    others: dict[int, Devices] = {}
    for k, v in others_in.items():
        if downstream is not None and isinstance(v, tuple):
            others[k] = tuple(downstream)
        elif isinstance(v, tuple):
            others[k] = tuple(remap[x] for x in v)
        else:
            others[k] = v
    return DeviceLayout(p, d, others)


def _fmt(devs: tuple[int, ...]) -> str:
    """``(0, 1)`` -> ``"0,1"``."""
    return ",".join(str(x) for x in devs)


def allocate_ports(requests: Iterable[int], used: Iterable[tuple[int, int]], base: int) -> list[int]:
    """First-fit port ranges.

    ``requests``: the span (number of consecutive ports) of each range wanted, in order.
    ``used``: ``(port, span)`` ranges already taken on the host. Returns each range's
    first port, the lowest at or above ``base`` that overlaps nothing taken so far.
    Raises :class:`AllocationError` when a range would pass port 65535.
    """
    taken: list[tuple[int, int]] = [(p, p + max(s, 1)) for p, s in used]
    out: list[int] = []
    for span in requests:
        span = max(int(span), 1)
        start = base
        while True:
            end = start + span
            if end - 1 > MAX_PORT:
                raise AllocationError(f"no free range of {span} port(s) at or above {base}")
            clash = next((hi for lo, hi in taken if lo < end and start < hi), None)
            if clash is None:
                break
            start = clash
        out.append(start)
        taken.append((start, start + span))
    return out
