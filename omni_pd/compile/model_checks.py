"""Field checks the deploy model runs before typing a value, shared by the pydantic model
(:mod:`omni_pd.compile.model`) and its compiled projection (:mod:`omni_pd.compile.model_lite`).

Standard library only. Each check takes the raw value (a plain YAML tree node) and returns
the value to type, or raises :class:`FieldCheckError` (``type``: the error type both
runtimes report, e.g. ``devices_format``; ``message``: the error's ``msg``). The model
spec (``model_spec.json``) names checks by their key in :data:`CHECKS`.
"""

from __future__ import annotations

from typing import Any, Callable


class FieldCheckError(ValueError):
    """A value a field check refuses: ``type`` (pydantic error type) and ``message`` (its msg)."""

    def __init__(self, type_: str, message: str) -> None:
        super().__init__(message)
        self.type = type_
        self.message = message


def devices_as_str(v: Any) -> Any:
    """vllm-omni accepts ``devices: 3`` for ``"3"`` (set_stage_devices). A string must
    read as device indices (``"0,1"``) or ``"cpu"``: anything else is a located OPD101
    at parse time (type ``devices_format``, the parser's reason as msg), so later passes
    never meet a malformed device list. Other values are returned unchanged (the field's
    type judges them)."""
    v = str(v) if isinstance(v, int) and not isinstance(v, bool) else v
    if isinstance(v, str):
        from omni_pd.compile.devices import parse_devices

        try:
            parse_devices(v)
        except ValueError as e:
            raise FieldCheckError("devices_format", str(e)) from None
    return v


#: check name (as the model spec writes it) -> the check
CHECKS: dict[str, Callable[[Any], Any]] = {"devices_as_str": devices_as_str}
