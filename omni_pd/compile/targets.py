"""What a given vLLM release accepts and binds: version facts as data.

The facts live in ``presets/targets/vllm.yaml`` (one edit per release, each with its
source); this module only reads them and answers questions for one version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

Version = tuple[int, int]


def parse_version(text: str) -> Version:
    """``"0.30"``, ``"0.30.1"``, ``"v0.30.0rc1"`` -> ``(0, 30)``. Raises ValueError."""
    m = re.fullmatch(r"\s*v?(\d+)\.(\d+)(?:\.\d+)?(?:[.+-]?\w+)*\s*", str(text))
    if not m:
        raise ValueError(f"not a vLLM version: {text!r} (expected MAJOR.MINOR, e.g. 0.30)")
    return int(m.group(1)), int(m.group(2))


def _in(v: Version, fact: dict[str, Any]) -> bool:
    since = parse_version(fact["since"]) if fact.get("since") else (0, 0)
    removed = parse_version(fact["removed"]) if fact.get("removed") else None
    return v >= since and (removed is None or v < removed)


def _stepped(v: Version, steps: list[dict[str, Any]], key: str) -> Any:
    out = None
    for s in steps:
        if v >= parse_version(s["since"]):
            out = s[key]
    return out


@lru_cache(maxsize=1)
def _facts() -> dict[str, Any]:
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / "vllm.yaml")


@lru_cache(maxsize=1)
def _bootstrap_facts() -> dict[str, Any]:
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / "mooncake_bootstrap.yaml")


#: The two runtimes omni-pd launches (``presets/pipelines/*.yaml`` ``runtime:``).
RUNTIMES = ("vllm", "vllm-omni")


@dataclass(frozen=True)
class MooncakeBootstrap:
    """Which setting decides the Mooncake bootstrap port on one runtime and version
    (``presets/targets/mooncake_bootstrap.yaml``; field meanings and upstream sources there).

    ``key``: ``"env"`` (the stage's ``VLLM_MOONCAKE_BOOTSTRAP_PORT``) or a dotted
    ``kv_transfer_config`` path (``"kv_connector_extra_config.bootstrap_port"``).
    ``default``: port bound when the key is absent. ``replica_offset``: replica *r* of a
    stage binds ``port + r``. ``env_overwritten``: the runtime replaces the env value.
    ``unread_keys``: dotted ``kv_transfer_config`` paths nothing reads on this target.
    ``runtime``/``label``: what the facts are for (``"vllm-omni"``, ``"0.30"``).
    """

    runtime: str
    label: str
    env: str
    key: str
    default: int
    replica_offset: bool
    env_overwritten: bool
    unread_keys: tuple[str, ...]
    engine_id: str
    source: str

    @property
    def extra_key(self) -> str | None:
        """The ``kv_connector_extra_config`` key that decides the port, or None (env decides)."""
        prefix = "kv_connector_extra_config."
        return self.key[len(prefix):] if self.key.startswith(prefix) else None

    @property
    def where(self) -> str:
        """The deciding setting as a user writes it (``env VLLM_MOONCAKE_BOOTSTRAP_PORT``)."""
        return f"env {self.env}" if self.key == "env" else self.key


def default_version() -> str:
    return str(_facts()["default_version"])


@dataclass(frozen=True)
class Target:
    """The facts for one vLLM ``major.minor``. Build it with :func:`target`."""

    version: Version

    @property
    def label(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    def kv_fields(self) -> frozenset[str]:
        """KVTransferConfig keys this version accepts."""
        return frozenset(k for k, f in _facts()["kv_transfer_config_fields"].items() if _in(self.version, f))

    def kv_field_known(self, name: str) -> bool:
        """True if ``name`` was a KVTransferConfig field in any version."""
        return name in _facts()["kv_transfer_config_fields"]

    def kv_field_history(self, name: str) -> dict[str, Any]:
        """``{"since": "0.11", "removed": "0.32"}`` for the KVTransferConfig field ``name``
        (``removed`` absent while it exists); ``{}`` for a name no release had."""
        return dict(_facts()["kv_transfer_config_fields"].get(name) or {})

    @property
    def rejects_unknown_kv_keys(self) -> bool:
        return self.version >= parse_version(_facts()["unknown_kv_keys_rejected_since"])

    def connectors(self) -> frozenset[str]:
        """KV connector names registered in vLLM's KVConnectorFactory for this version."""
        return frozenset(k for k, f in _facts()["kv_connectors"].items() if _in(self.version, f))

    def connector_renames(self) -> dict[str, list[str]]:
        return dict(_facts()["kv_connector_renames"])

    def connector_history(self, name: str) -> dict[str, Any] | None:
        return _facts()["kv_connectors"].get(name)

    def connector_names_ever(self) -> tuple[str, ...]:
        """Every KV connector name any known vLLM release registered (file order)."""
        return tuple(_facts()["kv_connectors"])

    @property
    def kv_both_deprecated(self) -> bool:
        return self.version >= parse_version(_facts()["kv_both_deprecated_since"])

    @property
    def nixl_side_channel_default_port(self) -> int:
        return int(_stepped(self.version, _facts()["nixl"]["side_channel_default_port"], "value"))

    @property
    def nixl_connector_version(self) -> int | None:
        """NIXL's ``NIXL_CONNECTOR_VERSION`` (v1/nixl/metadata.py, in the handshake compat
        hash): 15 for 0.33, 16 from 0.34 (presets/targets/vllm.yaml ``nixl.connector_version``);
        None for a release before the first one read."""
        v = _stepped(self.version, _facts()["nixl"].get("connector_version") or [], "value")
        return None if v is None else int(v)

    def nixl_side_channel_span(self, tp: int, dp: int) -> int:
        """Side-channel ports one NIXL engine binds from its base (per host)."""
        per = _stepped(self.version, _facts()["nixl"]["side_channel_span"], "per")
        return dp * tp if per == "dp_tp" else dp

    def mooncake_bootstrap_span(self, tp: int, dp: int) -> int:
        """Bootstrap ports one Mooncake prefill engine binds from its base (per host)."""
        per = _stepped(self.version, _facts()["mooncake"]["bootstrap_span"], "per")
        return dp * tp if per == "dp_tp" else 1


    def mooncake_bootstrap(self, runtime: str = "vllm") -> MooncakeBootstrap:
        """Bootstrap-port facts for ``runtime`` (``"vllm"`` or ``"vllm-omni"``) at this
        version (vllm-omni's minor version follows vLLM's). Versions older than every
        entry get the oldest entry. Raises ValueError for an unknown runtime."""
        facts = _bootstrap_facts()
        steps = facts["runtimes"].get(runtime)
        if steps is None:
            raise ValueError(f"unknown runtime {runtime!r} (expected one of {', '.join(RUNTIMES)})")
        chosen = steps[0]
        for s in steps:
            if self.version >= parse_version(s["since"]):
                chosen = s
        return MooncakeBootstrap(
            runtime=runtime, label=self.label, env=str(facts["env"]), key=str(chosen["key"]),
            default=int(chosen["default"]), replica_offset=bool(chosen["replica_offset"]),
            env_overwritten=bool(chosen["env_overwritten"]),
            unread_keys=tuple(str(k) for k in chosen.get("unread_keys") or ()),
            engine_id=str(chosen["engine_id"]), source=" ".join(str(chosen["source"]).split()))


def target(version: str | None = None) -> Target:
    """The :class:`Target` for ``version`` (default: presets/targets/vllm.yaml's default).

    Raises ValueError for a malformed version string.
    """
    return Target(parse_version(version or default_version()))
