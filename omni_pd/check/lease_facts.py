"""The NIXL KV lease facts (``presets/targets/nixl_lease.yaml``): what the OPD623 rule
(omni_pd/check/rules/nixl_lease.py) judges and what the launch plan writes
(:func:`planned_lease`) and notes. A module of facts, not a rule, so the planner reads them
without importing the rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omni_pd.compile.targets import Target

EXTRA = "kv_connector_extra_config"


@dataclass(frozen=True)
class LeaseFacts:
    """``presets/targets/nixl_lease.yaml``: the extra-config ``key`` and vLLM's
    ``default_s`` for the releases ``since``..``until``, the ``connectors`` that read it and
    ``platform_lease_s`` (launch platform -> seconds it needs)."""

    key: str
    default_s: int
    since: str
    until: str
    connectors: frozenset[str]
    platform_lease_s: dict[str, int]

    def applies(self, target: "Target", connector: Any) -> bool:
        """True for a connector that reads the lease on a release the facts were read for."""
        from omni_pd.compile.targets import parse_version

        return (connector in self.connectors
                and parse_version(self.since) <= target.version <= parse_version(self.until))

    def needed_s(self, platform: str | None) -> int | None:
        """Seconds ``platform`` needs; None: vLLM's default is enough there."""
        return self.platform_lease_s.get(platform or "")


@lru_cache(maxsize=1)
def facts() -> LeaseFacts:
    """The parsed ``presets/targets/nixl_lease.yaml``."""
    from omni_pd.resources import data_dir, load_data

    d = load_data(data_dir("presets") / "targets" / "nixl_lease.yaml")
    lease = d["lease"]
    return LeaseFacts(key=str(lease["key"]), default_s=int(lease["default_s"]), since=str(lease["since"]),
                      until=str(lease["until"]), connectors=frozenset(d["connectors"]),
                      platform_lease_s={str(k): int(v) for k, v in (d.get("platform_lease_s") or {}).items()})


def configured(kv: dict[str, Any] | None) -> tuple[bool, Any]:
    """``(set?, value)`` of the lease in a stage's ``kv_transfer_config``."""
    extra = (kv or {}).get(EXTRA)
    if isinstance(extra, dict) and facts().key in extra:
        return True, extra[facts().key]
    return False, None


def vllm_name(kv: dict[str, Any], platform: str | None) -> str | None:
    """The vLLM connector ``kv`` loads on ``platform``, or None when it loads another
    package's class (``kv_connector_module_path``: :mod:`omni_pd.compile.connectors.identity`),
    whose lease vLLM's facts do not describe."""
    from omni_pd.compile.connectors.identity import identify

    ident = identify(kv, platform)
    return ident.vllm_row() if ident is not None else None


def planned_lease(kv: dict[str, Any] | None, platform: str | None, target: "Target") -> dict[str, Any] | None:
    """``kv`` with the lease ``platform`` needs written into its extra config, for an
    engine the launcher starts (runtime ``vllm``); None when nothing is to be added (not a
    lease-reading connector on this release, a platform vLLM's default serves, or a lease
    the file sets, which stays as written and :func:`launch_findings` judges). Pure: ``kv``
    is not modified."""
    f = facts()
    need = f.needed_s(platform)
    if kv is None or need is None or not f.applies(target, vllm_name(kv, platform)) or configured(kv)[0]:
        return None
    extra = kv.get(EXTRA)
    return {**kv, EXTRA: {**(extra if isinstance(extra, dict) else {}), f.key: need}}
