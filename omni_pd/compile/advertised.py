"""Who advertises an address a peer on another host dials: presets/targets/advertised_addresses.yaml.

Pure data, loaded once. Read by validate's cross-host address rules (OPD503 for the KV
side-channel rows it owns, OPD507 for the rest) and available to the placement pass
(``omni_pd/compile/placement.py``) that sets each side's own host address. Each row's
``sources`` name the upstream file and line.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

#: values that name the advertiser's own host, never a routable peer address
LOCAL = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "")


@dataclass(frozen=True)
class Listener:
    """One row of the table. ``setting``: ``("env" | "key" | "extra", name)`` or None
    (not in the deploy config); ``default``: the value when unset (None: no default);
    ``kind``: ``listener`` (advertiser announces, ``dialed_by`` peers dial) or ``shared``
    (every stage names one endpoint, e.g. a proxy)."""

    id: str
    transport: str
    config: str
    connector_key: str
    connectors: tuple[str, ...]
    advertiser: tuple[str, ...]
    dialed_by: tuple[str, ...]
    kind: str
    setting: tuple[str, str] | None
    default: str | None
    checked_by: str | None
    in_config: bool
    sources: tuple[str, ...]
    #: ``(major, minor)`` from which an absent or empty setting is the advertiser's own routable
    #: address (vLLM's ``get_ip()``: ECCPUConnector from 0.34); None: the ``default`` always holds
    own_ip_since: tuple[int, int] | None = None

    def own_ip(self, version: tuple[int, ...], value: Any, written: bool) -> bool:
        """True when, on vLLM ``version``, the setting (``value``, ``written`` or the default)
        resolves to the advertiser's own routable address: unset or empty from
        :attr:`own_ip_since` on."""
        if self.own_ip_since is None or tuple(version[:2]) < self.own_ip_since:
            return False
        return not written or str(value).strip() == ""

    @property
    def role_key(self) -> str:
        """``kv_role`` or ``ec_role``: the role field of :attr:`config`."""
        return self.connector_key.replace("_connector", "_role")


def _row(d: dict[str, Any]) -> Listener:
    s = d.get("setting")
    setting = None
    if s is not None:
        if not isinstance(s, dict) or len(s) != 1 or next(iter(s)) not in ("env", "key", "extra"):
            raise ValueError(f"advertised_addresses.yaml {d.get('id')}: setting must be one of env/key/extra")
        setting = (str(next(iter(s))), str(next(iter(s.values()))))
    if d.get("kind") not in ("listener", "shared"):
        raise ValueError(f"advertised_addresses.yaml {d.get('id')}: kind must be listener or shared")
    return Listener(id=str(d["id"]), transport=str(d["transport"]), config=str(d["config"]),
                    connector_key=str(d["connector_key"]), connectors=tuple(map(str, d["connectors"])),
                    advertiser=tuple(map(str, d["advertiser"])), dialed_by=tuple(map(str, d["dialed_by"])),
                    kind=str(d["kind"]), setting=setting,
                    default=None if d.get("default") is None else str(d["default"]),
                    checked_by=d.get("checked_by"), in_config=bool(d.get("in_config", True)),
                    sources=tuple(map(str, d.get("sources") or ())),
                    own_ip_since=tuple(int(x) for x in str(d["own_ip_since"]).split(".")[:2])  # type: ignore[arg-type]
                    if d.get("own_ip_since") else None)


@lru_cache(maxsize=1)
def listeners() -> tuple[Listener, ...]:
    """Every row of presets/targets/advertised_addresses.yaml, in file order.
    Raises ValueError on a malformed row (a packaging bug, caught by the tests)."""
    from omni_pd.resources import data_dir, load_data

    return tuple(_row(r) for r in load_data(data_dir("presets") / "targets" / "advertised_addresses.yaml")["listeners"])
