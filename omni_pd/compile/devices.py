"""Stage device lists: the ``devices`` value of a deploy stage, parsed and formatted.

A leaf module (no omni-pd imports) so that the model, the topology and the emitter can
all use it without importing one another.
"""

from __future__ import annotations

from typing import Any, Union

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
