"""The contract every EC (encoder-cache) connector module fulfils.

Encoder disaggregation (vLLM ``docs/features/disagg_encoder.md``): an encoder-only
instance E runs the multimodal encoder and is the ``ec_producer``; the instance that runs
prefill (the combined instance of E->PD, the prefill instance of E->P->D) is the
``ec_consumer`` and loads E's outputs instead of encoding. A contract answers, for one
side and one vLLM target: the ``ec_transfer_config`` to emit, the env, the shared
storage it needs (directory both sides must see), and the ports it binds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

if TYPE_CHECKING:
    from omni_pd.compile.targets import Target

ECSide = Literal["producer", "consumer"]

#: ec_role per side (vLLM config/ec_transfer.py ECTransferConfig.ec_role); ec_both
#: (an instance that encodes and consumes its own cache) is never emitted.
EC_ROLE = {"producer": "ec_producer", "consumer": "ec_consumer"}


def ec_facts() -> dict[str, Any]:
    """``presets/targets/ec_connectors.yaml`` (the one source of EC facts)."""
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / "ec_connectors.yaml")


def _v(text: str) -> tuple[int, int]:
    a, b = str(text).split(".")[:2]
    return int(a), int(b)


def ec_row(name: str, version: tuple[int, int]) -> dict[str, Any] | None:
    """The ``connectors.<name>`` row that applies at vLLM ``version`` (the last whose
    ``since`` <= version), or None when the release does not register ``name``."""
    out = None
    for row in ec_facts()["connectors"].get(name) or []:
        if version >= _v(row["since"]):
            out = row
    return out


def encoder_only_flag(target: "Target") -> bool:
    """True when E must be given ``mm_encoder_only: true`` explicitly: the flag exists
    (vLLM >= 0.18) and the release does not yet switch it on for an ec_producer by itself
    (< 0.30; vLLM 0.30.0 config/vllm.py ``_resolve_mm_encoder_only``). Facts:
    ``encoder_only`` in presets/targets/ec_connectors.yaml."""
    f = ec_facts()["encoder_only"]
    return _v(f["flag_since"]) <= target.version < _v(f["automatic_since"])


@dataclass(frozen=True)
class ECSideConfig:
    """Connector output for one side: ``ec_transfer_config`` (ordered) and env to set."""

    ec_transfer_config: dict[str, Any]
    env: dict[str, str]


class ECConnector:
    """Base EC contract. Subclasses set the class attributes and override the methods."""

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    #: ec_connector_extra_config key holding the shared directory, or None (no storage)
    storage_key: ClassVar[str | None] = None

    def configure(self, side: ECSide, engine_id: str, target: "Target", *,
                  storage: str | None = None) -> ECSideConfig:
        """``ec_transfer_config`` and env for ``side``. Raises ValueError when the
        connector is not registered at ``target`` (message names the release)."""
        raise NotImplementedError

    def storage_path(self, ec: dict[str, Any]) -> str | None:
        """The directory a side configured with ``ec`` reads/writes (the release's default
        when the key is absent), or None for a connector without shared storage."""
        return None

    def cache_file(self, storage: str, mm_hash: str) -> str | None:
        """Where the producer stores one item's encoder output (for ``launch --smoke`` and
        tests), or None when it is not a file."""
        return None

    def load_log(self) -> str | None:
        """The consumer's log text when it loads an item from the producer (DEBUG level)."""
        return None


@dataclass(frozen=True)
class ECPortUse:
    """``[port, port + span)`` an EC connector binds for one engine. ``env``/``key``: the env
    var or ``ec_transfer_config`` field that set it (None: the release's default)."""

    port: int
    span: int
    purpose: str
    env: str | None = None
    key: str | None = None


def ec_ports(ec: dict[str, Any], env: dict[str, Any] | None, tp: int, dp: int,
             version: tuple[int, int]) -> list[ECPortUse]:
    """Ports the EC connector of ``ec`` binds on its host for a stage of TP ``tp`` and DP
    ``dp`` at vLLM ``version`` (``ports`` in presets/targets/ec_connectors.yaml): one range
    per DP rank (``base + dp_index x tp``) when the span is per TP rank; ``dp`` consecutive
    ports from the base when it is per DP index (ECCPUConnector 0.34). [] when the connector
    binds none on this side, the value is not a port, or it is 0 (OS-assigned: 0.34's
    ECCPUConnector default)."""
    role = ec.get("ec_role")
    rows = [r for r in (ec_facts().get("ports") or {}).get(str(ec.get("ec_connector")), [])
            if version >= _v(r["since"])]
    out: list[ECPortUse] = []
    for row in rows[-1:]:
        side = "ec_producer" if row["side"] == "producer" else "ec_consumer"
        if role not in (side, "ec_both"):
            continue
        if "env" in row:
            raw, env_key, key = (env or {}).get(row["env"], row["default"]), row["env"], None
            env_key = env_key if row["env"] in (env or {}) else None
        else:
            raw, env_key, key = ec.get(row["key"], row["default"]), None, (row["key"] if row["key"] in ec else None)
        try:
            base = int(str(raw))
        except ValueError:
            continue
        if base == 0:  # 0.34's ECCPU default: the OS assigns a free port, none is fixed
            continue
        if row["span"] == "dp":
            out.append(ECPortUse(base, max(dp, 1), row["purpose"], env_key, key))
        elif row["span"] == "tp":
            out += [ECPortUse(base + i * tp, tp, row["purpose"], env_key, key) for i in range(max(dp, 1))]
        else:
            out.append(ECPortUse(base, int(row["span"]), row["purpose"], env_key, key))
    return out


def zero_port_settings(ec: dict[str, Any] | None, version: tuple[int, int]) -> frozenset[str]:
    """The env variables and ``ec_transfer_config`` keys of the EC connector ``ec`` loads whose
    value 0 asks the operating system for a free port at vLLM ``version``: those of its
    ``ports`` row (presets/targets/ec_connectors.yaml) whose default is 0, i.e.
    ECCPUConnector's ``VLLM_EC_SIDE_CHANNEL_PORT`` from 0.34 (vllm 0.34.0 envs.py:1861-1865).
    Empty for every other connector and release (0 is no port there)."""
    if not isinstance(ec, dict):
        return frozenset()
    rows = [r for r in (ec_facts().get("ports") or {}).get(str(ec.get("ec_connector")), [])
            if version >= _v(r["since"])]
    return frozenset(str(r.get("env") or r.get("key")) for r in rows[-1:] if r.get("default") == 0)


def zero_port_envs(version: tuple[int, int]) -> frozenset[str]:
    """Every env variable some EC connector reads as "0: the OS picks a free port" at vLLM
    ``version`` (:func:`zero_port_settings` over all connectors of
    presets/targets/ec_connectors.yaml ``ports``; ``VLLM_EC_SIDE_CHANNEL_PORT`` from 0.34)."""
    out: set[str] = set()
    for name in (ec_facts().get("ports") or {}):
        out |= {k for k in zero_port_settings({"ec_connector": name}, version) if k.isupper()}
    return frozenset(out)
