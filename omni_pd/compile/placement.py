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
* **An instance spanning hosts.** ``placement: {0: [A, B]}`` runs one instance of stage 0
  over hosts A and B, vLLM's own multi-node launch (``--nnodes 2``, ``--node-rank``,
  ``--master-addr`` the first host's address; vllm/engine/arg_utils.py, no Ray): the first
  host (node rank 0) holds the API server, the scheduler and every listener a peer dials, so
  the rules below read it as the stage's host. Each host runs ``world / nnodes`` of its ranks
  on the same local device ids (:func:`span_devices`; vLLM needs ``--nnodes`` to divide the
  world size), counted on every host it spans (:func:`host_devices`, :func:`check_capacity`).
* **Advertised addresses.** prefill and decode advertise their own host's ``address`` (NIXL
  ``VLLM_NIXL_SIDE_CHANNEL_HOST``, Mooncake ``kv_ip`` where the runtime reads it: the
  connector contract's ``configure`` with the host as the :class:`~omni_pd.compile.
  connectors.base.Endpoint` host). Two hosts without addresses cannot reach each other:
  :class:`PlacementError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    #: stage id -> the hosts one instance spans, node rank order (read with ``getattr``: absent = none)
    spans: Mapping[int, tuple[str, ...]]


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
    ``proposed``: the stage ids omni-pd placed itself (the inventory did not say);
    ``spans``: stage id -> every host one instance of it spans, node rank order (the first is
    its ``stage_host``); a stage absent runs on its one host.
    """

    stage_host: Mapping[int, str]
    addresses: Mapping[str, str]
    hosts: tuple[str, ...]
    proposed: tuple[int, ...] = ()
    spans: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    def host_of(self, stage_id: int) -> str:
        """The host of ``stage_id`` (its node rank 0 when it spans hosts; KeyError for a
        stage the placement does not know)."""
        return self.stage_host[stage_id]

    def nodes_of(self, stage_id: int) -> tuple[str, ...]:
        """Every host one instance of ``stage_id`` runs on, node rank order: its span, else
        its one host. KeyError for a stage the placement does not know."""
        return tuple(self.spans.get(stage_id) or (self.stage_host[stage_id],))

    def stages_on(self, host: str) -> tuple[int, ...]:
        """The stage ids with ranks on ``host`` (placed there or spanning it), ascending."""
        return tuple(sorted(s for s in self.stage_host if host in self.nodes_of(s)))

    def describe(self) -> str:
        """``"stage 0 -> A, stage 1 -> B"``: the placement as one line (the note expand prints);
        a stage spanning hosts: ``stage 0 -> A + B``."""
        return ", ".join(f"stage {s} -> {' + '.join(self.nodes_of(s))}" for s in sorted(self.stage_host))


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
    spans = {sid: tuple(hs) for sid, hs in (getattr(inventory, "spans", None) or {}).items() if sid in out}
    return Placement(out, addresses, names, tuple(proposed), spans)


def span_devices(devices: Devices, nodes: int, stage_id: int) -> Devices:
    """The devices each host of a stage spanning ``nodes`` hosts uses: the first
    ``len(devices) / nodes`` of its one-host list (every host uses the same local ids).
    ``devices`` "cpu" or None, or ``nodes`` 1: unchanged. Raises :class:`PlacementError`
    when ``nodes`` does not divide the world size (vLLM 0.30: "`--nnodes` must evenly divide
    the total world size", vllm/engine/arg_utils.py ``create_engine_config``)."""
    if nodes <= 1 or not isinstance(devices, tuple):
        return devices
    if len(devices) % nodes:
        raise PlacementError(
            f"stage {stage_id} spans {nodes} hosts but its world size is {len(devices)}: vLLM needs --nnodes to "
            "divide the world size (TP x PP x DP)",
            help=f"list {nodes} hosts whose count divides {len(devices)}, or change the stage's parallel sizes")
    return devices[:len(devices) // nodes]


def host_devices(layout: Mapping[int, Devices], stage_host: Mapping[int, str],
                 spans: Mapping[int, tuple[str, ...]] | None = None) -> dict[int, Devices]:
    """``layout`` (stage id -> devices, one host's numbering) renumbered per host: on each
    host the device ids its stages use map in ascending order onto 0, 1, ...; ``"cpu"`` and
    None are kept. ``{0: (0,), 1: (1,)}`` with stages 0 on A, 1 on B -> ``{0: (0,), 1: (0,)}``;
    ``{1: (1,), 2: (2,), 3: (2,)}`` all on B -> ``{1: (0,), 2: (1,), 3: (1,)}``. Stages
    absent from ``stage_host`` keep their devices.

    ``spans``: stage id -> the hosts one instance spans (its ``layout`` entry: the devices of
    one host, :func:`span_devices`). A spanning stage uses the same local ids on every host
    it spans, so on each host its ids are numbered first (0, 1, ...) and the other stages'
    after them. Raises :class:`PlacementError` when two spanning stages share a host but
    not every host (their ids could not be the same on each). Pure."""
    spans = {sid: hs for sid, hs in (spans or {}).items() if len(hs) > 1 and isinstance(layout.get(sid), tuple)}
    members: dict[str, list[int]] = {}
    for sid, devs in layout.items():
        if isinstance(devs, tuple) and sid in stage_host:
            for h in spans.get(sid, (stage_host[sid],)):
                members.setdefault(h, []).append(sid)
    maps: dict[str, dict[int, int]] = {}
    for h, sids in members.items():
        first = [d for sid in sorted(s for s in sids if s in spans) for d in layout[sid]]  # type: ignore[union-attr]
        rest = sorted({d for sid in sids if sid not in spans for d in layout[sid]} - set(first))  # type: ignore[union-attr]
        maps[h] = {d: i for i, d in enumerate(dict.fromkeys(first + rest))}
    out: dict[int, Devices] = {}
    for sid, devs in layout.items():
        if isinstance(devs, tuple) and sid in stage_host:
            per_host = {tuple(maps[h][d] for d in devs) for h in spans.get(sid, (stage_host[sid],))}
            if len(per_host) > 1:
                raise PlacementError(
                    f"stage {sid} spans hosts {', '.join(spans[sid])} but its local device ids differ between them "
                    "(another spanning stage shares some of those hosts)",
                    help="give the spanning stages disjoint hosts, or the same list of hosts")
            out[sid] = per_host.pop()
        else:
            out[sid] = devs
    return out


def overlay_elsewhere(platform: str | None, accelerator: str | None) -> bool:
    """True when the ``platforms.<platform>`` overlay cannot run on a host of ``accelerator``
    (an xpu overlay on a cuda host: vllm-omni applies the overlay of the platform it runs on,
    vllm_omni/config/stage_config.py ``_apply_platform_overrides``), so the host's ``count``
    says nothing about it. The base stages (None) and hosts of unknown kind are judged."""
    return platform not in (None, "cpu") and accelerator is not None and platform != accelerator


def check_capacity(devices: Mapping[int, Devices], placement: Placement, inventory: InventoryLike,
                   platform: str | None = None) -> None:
    """Raise :class:`PlacementError` when a host's stages need more distinct devices
    (after :func:`host_devices`) than its ``count``; hosts of unknown count pass.
    ``platform``: ``devices`` is the whole layout of the ``platforms.<platform>`` overlay
    (validate ``--all-platforms`` judges each overlay against the host's count too: OPD402),
    named in the message; None: the base stages. A host whose ``accelerator`` is another
    platform's is not judged for that overlay (it applies only where that platform runs)."""
    for host in placement.hosts:
        need = {d for sid in placement.stages_on(host) for d in (devices.get(sid) or ())
                if isinstance(devices.get(sid), tuple)}
        count = inventory.hosts[host].count
        if overlay_elsewhere(platform, getattr(inventory.hosts[host], "accelerator", None)):
            continue  # validate's OPD402 judges alike
        if count is not None and len(need) > count:
            stages = ", ".join(str(s) for s in placement.stages_on(host))
            where = f" with the platforms.{platform} overlay" if platform else ""
            drop = f", or leave platforms.{platform} out of the input" if platform else ""
            raise PlacementError(
                f"host {host} has {count} device(s) but stages {stages} placed on it need {len(need)}{where}",
                help=f"place some of them on another host (placement: in the inventory), or raise "
                     f"hosts.{host}.count{drop}")


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
    its own entries are returned). Pure.

    Pass each overlay's whole layout (every stage's devices on that platform, expand's
    ``OverlayLayout.devices``): an overlay map holding only the entries that differ from the
    input would be renumbered against base entries that are not its devices on that platform
    (the Thinker's copied ``devices: "0,1"`` on npu kept 0,1 while the Talker beside it on
    the same host was renumbered onto 1: OPD404)."""
    new_base = host_devices(base, placement.stage_host, placement.spans)
    new_over: dict[str, dict[int, Devices]] = {}
    for pname, over in overlays.items():
        merged = host_devices({**base, **over}, placement.stage_host, placement.spans)
        new_over[pname] = {sid: merged[sid] for sid in over}
    return new_base, new_over
