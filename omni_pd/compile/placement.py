"""Placement across hosts: which host each compiled stage runs on, and what that means for
its devices, ports and advertised addresses. Pure functions, no I/O.

Input: an inventory (``omni-pd expand|launch|render --inventory hosts.yaml``, the format
of :mod:`omni_pd.check.context`: hosts with ``address`` and ``count``, and ``placement``:
compiled stage id -> host, ``all`` for every stage not listed). The object is read by
attribute (:class:`InventoryLike`), so this layer does not import the checker's types.

Rules (each applied by :func:`place_split` / :func:`resolve_placement`):

* **Proposal.** An inventory without ``placement:`` gets one: with one host every stage is
  on it; with two or more, prefill on the first host listed and decode plus every other
  stage on the second. Downstream stages follow decode because decode's output feeds them
  (Thinker decode -> Talker -> Code2Wav), so those stage edges stay on one host, where
  vllm-omni's default ``SharedMemoryConnector`` works (it is same-host only:
  vllm_omni/distributed/omni_connectors/connectors/shm_connector.py). A partial placement
  without ``all:`` places its missing stages by the same rule.
* **Devices per host.** Device ids are indices into the visibility variable of the host the
  stage runs on, so they restart at 0 on every host: on each host, the device ids its
  stages use (after expand's one-host allocation, :func:`omni_pd.compile.alloc.split_devices`)
  map in ascending order onto 0, 1, ...; devices distinct before stay distinct, shared
  ones stay shared (:func:`host_devices`). A host needing more devices than its ``count``
  is a placement the inventory cannot hold (:class:`PlacementError`).
* **Ports per host.** prefill and decode on different hosts each get their connector range
  from the port base on their own host (pd_split's allocation, ``ExpandOptions.side_hosts``);
  on one host they stay disjoint.
* **Advertised addresses.** prefill and decode advertise their own host's ``address`` (NIXL
  ``VLLM_NIXL_SIDE_CHANNEL_HOST``, Mooncake ``kv_ip`` where the runtime reads it: the
  connector contract's ``configure`` with the host as the :class:`~omni_pd.compile.
  connectors.base.Endpoint` host). Two hosts without addresses cannot reach each other:
  :class:`PlacementError`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from omni_pd.compile.topology import Devices


class HostLike(Protocol):
    """One inventory host (:class:`omni_pd.check.context.Host`): its ``address`` (what
    peers dial) and ``count`` (accelerators visible on it; None: unknown)."""

    name: str
    address: str | None
    count: int | None


class InventoryLike(Protocol):
    """The inventory (:class:`omni_pd.check.context.Inventory`): hosts in file order,
    ``placement`` (stage id -> host name) and ``default_host`` (``placement.all``)."""

    hosts: Mapping[str, HostLike]
    placement: Mapping[int, str]
    default_host: str | None


class PlacementError(ValueError):
    """A placement the inventory cannot hold. ``help``: what to change."""

    def __init__(self, message: str, help: str | None = None) -> None:
        super().__init__(message)
        self.help = help


@dataclass(frozen=True)
class Placement:
    """Where every compiled stage runs.

    ``stage_host``: compiled stage id -> host name; ``addresses``: host name -> address
    (hosts without one are absent); ``hosts``: every inventory host, in file order;
    ``proposed``: the stage ids omni-pd placed itself (the inventory did not say).
    """

    stage_host: Mapping[int, str]
    addresses: Mapping[str, str]
    hosts: tuple[str, ...]
    proposed: tuple[int, ...] = ()

    def host_of(self, stage_id: int) -> str:
        """The host of ``stage_id`` (KeyError for a stage the placement does not know)."""
        return self.stage_host[stage_id]

    def stages_on(self, host: str) -> tuple[int, ...]:
        """The stage ids placed on ``host``, ascending."""
        return tuple(sorted(s for s, h in self.stage_host.items() if h == host))

    def describe(self) -> str:
        """``"stage 0 -> A, stage 1 -> B"``: the placement as one line (the note expand prints)."""
        return ", ".join(f"stage {s} -> {h}" for s, h in sorted(self.stage_host.items()))


def resolve_placement(stages: Sequence[Any], inventory: InventoryLike) -> Placement:
    """The host of every stage of ``stages`` (objects with ``stage_id`` and ``pd_role``:
    the compiled pipeline's :class:`~omni_pd.compile.pipelines.PipelineStage` s) under
    ``inventory``: its ``placement``, then ``all``, then the proposal rule (module
    docstring). Raises :class:`PlacementError` when the inventory has no hosts."""
    names = tuple(inventory.hosts)
    if not names:
        raise PlacementError("the inventory lists no hosts", help="add hosts: {NAME: {address: ..., count: ...}}")
    prefill = next((s.stage_id for s in stages if getattr(s, "pd_role", None) == "prefill"), None)
    out: dict[int, str] = {}
    proposed: list[int] = []
    for s in stages:
        sid = s.stage_id
        if sid in inventory.placement:
            out[sid] = inventory.placement[sid]
        elif inventory.default_host:
            out[sid] = inventory.default_host
        else:
            out[sid] = names[0] if (len(names) == 1 or sid == prefill) else names[1]
            proposed.append(sid)
    addresses = {n: str(h.address) for n, h in inventory.hosts.items() if h.address}
    return Placement(out, addresses, names, tuple(proposed))


def host_devices(layout: Mapping[int, Devices], stage_host: Mapping[int, str]) -> dict[int, Devices]:
    """``layout`` (stage id -> devices, one host's numbering) renumbered per host: on each
    host the device ids its stages use map in ascending order onto 0, 1, ...; ``"cpu"`` and
    None are kept. ``{0: (0,), 1: (1,)}`` with stages 0 on A, 1 on B -> ``{0: (0,), 1: (0,)}``;
    ``{1: (1,), 2: (2,), 3: (2,)}`` all on B -> ``{1: (0,), 2: (1,), 3: (1,)}``. Stages
    absent from ``stage_host`` keep their devices. Pure."""
    used: dict[str, set[int]] = {}
    for sid, devs in layout.items():
        if isinstance(devs, tuple) and sid in stage_host:
            used.setdefault(stage_host[sid], set()).update(devs)
    maps = {h: {d: i for i, d in enumerate(sorted(ids))} for h, ids in used.items()}
    out: dict[int, Devices] = {}
    for sid, devs in layout.items():
        if isinstance(devs, tuple) and sid in stage_host:
            out[sid] = tuple(maps[stage_host[sid]][d] for d in devs)
        else:
            out[sid] = devs
    return out


def check_capacity(devices: Mapping[int, Devices], placement: Placement, inventory: InventoryLike) -> None:
    """Raise :class:`PlacementError` when a host's stages need more distinct devices
    (after :func:`host_devices`) than its ``count``; hosts of unknown count pass."""
    for host in placement.hosts:
        need = {d for sid in placement.stages_on(host) for d in (devices.get(sid) or ())
                if isinstance(devices.get(sid), tuple)}
        count = inventory.hosts[host].count
        if count is not None and len(need) > count:
            stages = ", ".join(str(s) for s in placement.stages_on(host))
            raise PlacementError(
                f"host {host} has {count} device(s) but stages {stages} placed on it need {len(need)}",
                help=f"place some of them on another host (placement: in the inventory), or raise hosts.{host}.count")


def side_addresses(placement: Placement, prefill_id: int, decode_id: int,
                   fallback: str) -> tuple[str, str]:
    """The addresses prefill and decode advertise: each host's ``address``, ``fallback``
    (``--kv-host``) for a host without one. Raises :class:`PlacementError` when they are on
    different hosts and either host has no address (the peer could not dial it)."""
    hp, hd = placement.host_of(prefill_id), placement.host_of(decode_id)
    if hp != hd:
        for side, h in (("prefill", hp), ("decode", hd)):
            if h not in placement.addresses:
                raise PlacementError(
                    f"{side} is placed on {h}, which has no address, and its peer is on another host",
                    help=f"set hosts.{h}.address to the address the other host reaches it at")
    return placement.addresses.get(hp, fallback), placement.addresses.get(hd, fallback)


def place_devices(base: Mapping[int, Devices], overlays: Mapping[str, Mapping[int, Devices]],
                  placement: Placement) -> tuple[dict[int, Devices], dict[str, dict[int, Devices]]]:
    """:func:`host_devices` of the base device map and of every platform overlay's map
    (each overlay renumbered together with the base entries it does not override; only
    its own entries are returned). Pure."""
    new_base = host_devices(base, placement.stage_host)
    new_over: dict[str, dict[int, Devices]] = {}
    for pname, over in overlays.items():
        merged = host_devices({**base, **over}, placement.stage_host)
        new_over[pname] = {sid: merged[sid] for sid in over}
    return new_base, new_over
