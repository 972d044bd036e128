"""The table of the vllm-omni compatibility layer (``presets/targets/vllm_omni_compat.yaml``)
and what its wrappers share: the environment switch, the wrapper mark, the logger and
the log-once helper. The layer itself (install, the gate) is
:mod:`omni_pd.upstream.vllm_omni_compat`; its wrappers are :mod:`omni_pd.upstream.compat_pd`
(PD detection and the decode handoff) and :mod:`omni_pd.upstream.compat_stream` (the Talker
handoff and streaming PD). Split out of vllm_omni_compat.py in issue 38.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: Environment switch: ``0`` (or ``false``/``off``/``no``) turns the layer off.
ENV_SWITCH = "OMNI_PD_VLLM_OMNI_COMPAT"
#: Marker attribute on every wrapper: the patch name (idempotence, introspection).
MARK = "__omni_pd_compat__"

# vLLM configures the ``vllm`` logger (handler, format); a child of it is visible in
# ``vllm serve`` output next to vllm-omni's own PD lines.
logger = logging.getLogger("vllm.omni_pd.compat")


# --------------------------------------------------------------------------- table


@dataclass(frozen=True)
class Patch:
    """One row of ``presets/targets/vllm_omni_compat.yaml`` ``patches``.

    ``target``: ``module:Class.attr``; ``kind``: ``staticmethod`` or ``function``;
    ``signature``: parameter list as :func:`signature_of` renders it, e.g.
    ``(self, req_id, sp)``; ``why``/``source``: the upstream fact (file and function)."""

    name: str
    target: str
    kind: str
    signature: str
    why: str
    source: str
    steps_in: str = ""
    #: a finer environment switch (``OMNI_PD_VLLM_OMNI_TALKER_PD``): ``0`` skips this patch
    switch: str = ""

    @property
    def module(self) -> str:
        return self.target.split(":", 1)[0]

    @property
    def owner_and_attr(self) -> tuple[str, str]:
        """(class path inside the module, attribute); the class path is ``""`` for a
        module-level function (``module:function``)."""
        qual = self.target.split(":", 1)[1]
        owner, _, attr = qual.rpartition(".")
        return owner, attr


@dataclass(frozen=True)
class CompatTable:
    """The parsed table: patches by name and, per vllm-omni release series
    (``"0.30"``), the names of the patches it needs."""

    patches: dict[str, Patch]
    versions: dict[str, tuple[str, ...]]

    def needed(self, version: str) -> tuple[Patch, ...]:
        """Patches release ``version`` (``"0.30.0"``, ``"0.30.1.dev3"``) needs; () when
        its series is not listed. Raises ``KeyError`` for a name missing from ``patches``."""
        return tuple(self.patches[n] for n in self.versions.get(release_series(version), ()))


def release_series(version: str) -> str:
    """``major.minor`` of a version string: ``"0.30.0rc1"`` -> ``"0.30"``."""
    parts = version.split(".")
    minor = "".join(ch for ch in (parts[1] if len(parts) > 1 else "") if ch.isdigit())
    return f"{parts[0]}.{minor}"


def parse_table(data: Mapping[str, Any]) -> CompatTable:
    """A :class:`CompatTable` from the YAML document's data. Raises ``ValueError`` when a
    version lists a patch the table does not define."""
    patches = {name: Patch(name=name, **{k: str(v) for k, v in row.items()})
               for name, row in (data.get("patches") or {}).items()}
    versions = {str(k): tuple(v.get("patches") or ()) for k, v in (data.get("versions") or {}).items()}
    for series, names in versions.items():
        unknown = [n for n in names if n not in patches]
        if unknown:
            raise ValueError(f"vllm_omni_compat.yaml: version {series} lists unknown patches {unknown}")
    return CompatTable(patches, versions)


def load_table() -> CompatTable:
    """The bundled table (``presets/targets/vllm_omni_compat.yaml``)."""
    from ..resources import data_dir, load_data

    return parse_table(load_data(data_dir("presets") / "targets" / "vllm_omni_compat.yaml"))


def signature_of(fn: Callable[..., Any]) -> str:
    """``fn``'s parameter list without annotations and defaults: ``(self, req_id, sp)``.
    Keyword-only and variadic parameters keep their ``*``/``**`` marks."""
    out: list[str] = []
    star = False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            out.append("*" + p.name)
            star = True
        elif p.kind is p.VAR_KEYWORD:
            out.append("**" + p.name)
        else:
            if p.kind is p.KEYWORD_ONLY and not star:
                out.append("*")
                star = True
            out.append(p.name)
    return "(" + ", ".join(out) + ")"


_SAID: set[tuple[str, str]] = set()


def _once(log: logging.Logger, level: int, msg: str) -> None:
    """Log ``msg`` once per process and logger: vllm-omni loads plugins several times
    (vLLM's group, its own group, every ``OmniEngineArgs``), the log line is one."""
    if (log.name, msg) not in _SAID:
        _SAID.add((log.name, msg))
        log.log(level, msg)


def env_disabled(environ: Mapping[str, str], name: str = ENV_SWITCH) -> bool:
    """True when ``name`` (default ``OMNI_PD_VLLM_OMNI_COMPAT``) is ``0``/``false``/``off``/``no``."""
    return environ.get(name, "").strip().lower() in ("0", "false", "off", "no")
