"""Which connector a ``kv_transfer_config`` loads: its identity from ``kv_connector``,
``kv_connector_module_path`` and the platform, so capability rules read the right row.

vLLM's ``KVConnectorFactory.get_connector_class`` (``kv_connector/factory.py``, every release
0.11-0.34) imports ``kv_connector_module_path`` when it is set and takes the class named
``kv_connector`` from that module; only without a module path is ``kv_connector`` a registry
name. So ``kv_connector: MooncakeConnector`` with
``kv_connector_module_path: vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector`` is
vllm-ascend's pull connector (registered there as ``MooncakeConnectorV1``: vllm-ascend
0.23.0.post1 ``vllm_ascend/distributed/kv_transfer/__init__.py``, presets/targets/vllm_ascend.yaml
``extracted.<release>.connectors``), with vllm-ascend's capabilities, not vLLM's
MooncakeConnector. On npu, vllm-ascend registers its own classes under some of vLLM's names
(``MultiConnector`` -> ``AscendMultiConnector``), so a registry name there is vllm-ascend's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: module path prefixes -> the package whose connector a module path names
PACKAGES = (("vllm.", "vllm"), ("vllm_ascend.", "vllm-ascend"), ("lmcache.", "lmcache"))


@dataclass(frozen=True)
class ConnectorIdentity:
    """The connector a ``kv_transfer_config`` (or a MultiConnector child) loads.

    ``name``: the row name capability tables key on: vLLM's registry name for vLLM's own
    connectors, vllm-ascend's registered name for a vllm-ascend class (``MooncakeConnectorV1``),
    else ``"<module path>:<class>"``, which matches no vLLM row. ``package``: ``"vllm"``,
    ``"vllm-ascend"``, ``"lmcache"`` or ``"out-of-tree"``. ``class_name``: the class loaded
    (``kv_connector`` as written). ``module_path``: ``kv_connector_module_path`` or None."""

    name: str
    package: str
    class_name: str
    module_path: str | None = None

    @property
    def is_vllm(self) -> bool:
        """True when vLLM's own connector of that name is loaded (vLLM's rows apply)."""
        return self.package == "vllm"

    @property
    def registered(self) -> bool:
        """True for a class registered in vLLM's or vllm-ascend's factory (``name`` is a row
        name), False for a class only a module path names (``"<module path>:<class>"``)."""
        return ":" not in self.name

    def vllm_row(self) -> str | None:
        """The name to look up in vLLM's per-connector tables; None for another package's
        connector (vLLM's row of a same-named class does not describe it)."""
        return self.name if self.is_vllm else None

    def describe(self) -> str:
        """How a message names it: ``"MooncakeConnector"`` for vLLM's,
        ``"vllm-ascend's MooncakeConnectorV1 (MooncakeConnector from vllm_ascend....)"`` for a
        registered class of another package, ``"MooncakeConnector from mypkg.conn (out-of-tree)"``
        for a class only its module path names."""
        if self.is_vllm and self.module_path is None:
            return self.name
        if not self.registered:
            return f"{self.class_name} from {self.module_path} ({self.package})"
        origin = f"{self.class_name} from {self.module_path}" if self.module_path else self.class_name
        return f"{self.package}'s {self.name}" + (f" ({origin})" if origin != self.name else "")


def _ascend_classes() -> dict[str, str]:
    """``"module:Class"`` -> vllm-ascend's registered name, over every vllm-ascend release in
    presets/targets/vllm_ascend.yaml (``extracted.<release>.connectors``)."""
    from omni_pd.compile import ascend

    out: dict[str, str] = {}
    for rel in (ascend.facts().get("extracted") or {}).values():
        conns = ((rel or {}).get("connectors") or {}).get("value") or {}
        for registered, where in conns.items():
            out.setdefault(str(where), str(registered))
    return out


def identify(kv: dict[str, Any] | None, platform: str | None = None) -> ConnectorIdentity | None:
    """The :class:`ConnectorIdentity` of ``kv`` (a ``kv_transfer_config`` or a MultiConnector
    child) on ``platform`` (``"cuda"``, ``"npu"``, ...; None: cuda). None when ``kv`` names no
    connector (``kv_connector`` missing, empty or not a string). Pure; never raises."""
    if not isinstance(kv, dict):
        return None
    name = kv.get("kv_connector")
    if not isinstance(name, str) or not name.strip():
        return None
    path = kv.get("kv_connector_module_path")
    if isinstance(path, str) and path.strip():
        path = path.strip()
        package = next((pkg for prefix, pkg in PACKAGES if path.startswith(prefix)), "out-of-tree")
        if package == "vllm":
            return ConnectorIdentity(name, "vllm", name, path)
        if package == "vllm-ascend":
            registered = _ascend_classes().get(f"{path}:{name}")
            if registered:
                return ConnectorIdentity(registered, package, name, path)
        return ConnectorIdentity(f"{path}:{name}", package, name, path)
    if platform == "npu":
        from omni_pd.compile import ascend

        if name in ascend.registered():
            return ConnectorIdentity(name, "vllm-ascend", name)
    return ConnectorIdentity(name, "vllm", name)
