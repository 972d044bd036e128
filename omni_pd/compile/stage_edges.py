"""Stage-to-stage payload edges across hosts: which omni connector carries each edge. Pure.

vllm-omni 0.30 moves a stage's output to the next stage's worker through an *omni
connector* chosen per edge (not the KV connector of the PD pair). Facts this module
relies on (vllm-omni 0.30.0 wheel, ``vllm_omni/``):

* **Which connector an edge gets.** ``distributed/omni_connectors/utils/initialization.py``
  ``load_omni_transfer_config`` (lines ~300-430): a stage's ``input_connectors:
  {from_stage_N: NAME}`` (or ``output_connectors``) names a top-level ``connectors:``
  entry (or an inline ``{name, extra}``); every ``edges:`` entry (and every
  ``engine_input_source``) left without one is given ``SharedMemoryConnector``
  ("Auto-configuring SharedMemoryConnector for edge").
* **SharedMemoryConnector is same-host only**: ``connectors/shm_connector.py`` reads and
  writes POSIX shared memory segments named by key (``/dev/shm``); remote metadata is
  ignored. An edge whose two stages run on different hosts never delivers.
* **Who moves the payload.** With ``async_chunk: false`` the sending stage's *worker*
  ``put`` s its full payload (``model_runner/omni_connector_payload_transport.py``
  ``send_full_payload_outputs``, key ``{request}_{stage}_{chunk}``) and the receiving
  worker ``get`` s it (``_poll_single_request``, which reads from ``stage_id - 1``), told
  the sender's listener by the orchestrator (``engine/orchestrator.py``
  ``_build_payload_sender_info`` -> ``engine/stage_engine_core_client.py``
  ``_build_payload_sender_info``: the sender's configured ``host``/``sender_host``, else the
  address the headless replica registered, ``replica_host``). So the edge crosses hosts
  exactly when the two stages do, wherever the orchestrator runs.
* **The prefill -> decode edge carries no payload**: the orchestrator builds decode's
  request from the original prompt plus the KV connector's params (``orchestrator.py``
  ``_forward_to_next_stage_unguarded``, the "PD disaggregation" branch); prefill's KV
  crosses hosts through the KV connector (``kv_ip``, side channels; OPD503). That edge is
  not judged here, but it still decides decode's connector (next point).
* **One connector per stage worker.** ``engine/stage_init_utils.py``
  ``get_stage_connector_spec`` (lines 1923-1965) gives a stage the spec of its *first
  incoming* edge (role ``receiver``), and its outgoing edge's only when it has no incoming
  one. A middle stage therefore sends through its incoming edge's connector:
  ``MooncakeTransferEngineConnector`` built as a receiver refuses every ``put``
  (``connectors/mooncake_transfer_engine_connector.py`` ``put``: "connector is in receiver
  mode"), while ``NixlConnector`` carries the outgoing edge's ``host``/``zmq_port`` as
  ``extra.outgoing`` and serves both directions, and requires NIXL on the outgoing edge
  ("A NIXL middle stage requires NIXL on its outgoing edge", line 1940). Thinker decode
  under PD always has an incoming edge (``{from: prefill, to: decode}``), and the Talker
  is a middle stage, so **NixlConnector is the one cross-host omni connector that works on
  a PD pipeline's decode -> Talker -> Code2Wav chain**, and only when every edge of the
  chain, the prefill -> decode one included, is NIXL.
* **NIXL endpoint.** ``connectors/nixl_connector.py``: the sender binds its ZMQ handshake
  listener on ``extra.host`` (``auto``: a route probe) at the port
  ``initialization.py`` ``compute_connector_zmq_port`` derives: ``zmq_port`` + ``from_stage``
  (+ 1024 per replica, + 16 per TP rank); a receiver dials ``sender_host`` (default: the
  edge's ``host``, else ``127.0.0.1``: ``resolve_connector_spec``). Payload tensors move by
  NIXL READ over UCX (CPU tensors are registered as DRAM; no extra service). So each
  edge's ``host`` is the *sending* stage's own host address.

:func:`payload_edges` reads the edges of a deploy tree; :func:`crossing` the ones whose
stages are on different hosts; :func:`cross_host_plan` what ``expand --inventory`` writes
instead (NixlConnector on the whole chain, each edge's ``host`` the sender's address).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

#: omni connectors that reach only the same host (shm_connector.py: POSIX shared memory)
SAME_HOST_ONLY = frozenset({"SharedMemoryConnector"})
#: what vllm-omni 0.30 gives an edge that names no connector (initialization.py ~400)
AUTO_CONNECTOR = "SharedMemoryConnector"
#: the cross-host omni connector expand writes (module docstring: the only one a middle stage can send through)
CROSS_HOST_CONNECTOR = "NixlConnector"
#: ``zmq_port`` of expand's NIXL edges: ``--port-base`` + this; a sender binds it + its stage id
PAYLOAD_PORT_OFFSET = 64


@dataclass(frozen=True)
class Edge:
    """One stage-to-stage edge: ``src`` -> ``dst`` (stage ids), the omni connector that
    carries it (``connector``: its ``name``; ``AUTO_CONNECTOR`` when none is named),
    ``ref`` the ``connectors:`` key the receiving stage names (None: inline or none),
    ``explicit`` whether a stage names one, ``extra`` the connector's ``extra``."""

    src: int
    dst: int
    connector: str
    ref: str | None = None
    explicit: bool = False
    extra: Mapping[str, Any] | None = None


def _stage_block(entry: Mapping[str, Any], key: str) -> Any:
    for holder in (entry.get("runtime"), entry.get("engine_args"), entry):
        if isinstance(holder, Mapping) and key in holder:
            return holder[key]
    return None


def _as_int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def payload_edges(tree: Mapping[str, Any]) -> list[Edge]:
    """Every stage edge of the deploy ``tree`` (a plain or round-trip mapping), in order:
    those named by a stage's ``input_connectors``/``output_connectors`` first, then the
    ``edges:`` entries no stage names (carried by :data:`AUTO_CONNECTOR`). An
    undefined ``connectors:`` reference keeps its key as ``ref`` and ``connector`` ``""``
    (vllm-omni refuses to start; not this module's finding). Raises nothing."""
    glob = tree.get("connectors") if isinstance(tree.get("connectors"), Mapping) else {}
    out: dict[tuple[int, int], Edge] = {}
    for entry in tree.get("stages") or ():
        if not isinstance(entry, Mapping):
            continue
        sid = _as_int(entry.get("stage_id"))
        if sid is None:
            continue
        for key, prefix in (("input_connectors", "from_stage_"), ("output_connectors", "to_stage_")):
            block = _stage_block(entry, key)
            if not isinstance(block, Mapping):
                continue
            for k, ref in block.items():
                other = _as_int(str(k).replace(prefix, "")) if str(k).startswith(prefix) else None
                if other is None:
                    continue
                src, dst = (other, sid) if key == "input_connectors" else (sid, other)
                if (src, dst) in out:
                    continue
                if isinstance(ref, str):
                    spec = glob.get(ref) if isinstance(glob.get(ref), Mapping) else {}
                    out[(src, dst)] = Edge(src, dst, str(spec.get("name") or ""), ref, True,
                                           spec.get("extra") if isinstance(spec.get("extra"), Mapping) else None)
                elif isinstance(ref, Mapping):
                    out[(src, dst)] = Edge(src, dst, str(ref.get("name") or ""), None, True,
                                           ref.get("extra") if isinstance(ref.get("extra"), Mapping) else None)
    for e in tree.get("edges") or ():
        if isinstance(e, Mapping):
            src, dst = _as_int(e.get("from")), _as_int(e.get("to"))
            if src is not None and dst is not None and (src, dst) not in out:
                out[(src, dst)] = Edge(src, dst, AUTO_CONNECTOR)
    return list(out.values())


def crossing(edges: list[Edge], stage_host: Mapping[int, str],
             pd_pair: tuple[int, int] | None) -> list[Edge]:
    """The edges of ``edges`` whose two stages are placed on different hosts
    (``stage_host``: stage id -> host), without the prefill -> decode edge ``pd_pair``
    (it carries no payload). Stages absent from ``stage_host`` count as on no host
    (never crossing)."""
    return [e for e in edges if (e.src, e.dst) != pd_pair and e.src in stage_host and e.dst in stage_host
            and stage_host[e.src] != stage_host[e.dst]]


@dataclass(frozen=True)
class EdgeRewrite:
    """One edge as ``expand --inventory`` writes it: the receiving stage ``dst`` names
    ``connectors.<name>`` under ``input_connectors.from_stage_<src>``; that entry is
    ``{name: NixlConnector, extra: extra}``."""

    src: int
    dst: int
    name: str
    extra: Mapping[str, Any]


def cross_host_plan(edges: list[Edge], stage_host: Mapping[int, str], addresses: Mapping[str, str],
                    pd_pair: tuple[int, int] | None, port_base: int) -> list[EdgeRewrite]:
    """What expand writes when a payload edge crosses hosts (:func:`crossing` non-empty):
    every edge of ``edges`` becomes :data:`CROSS_HOST_CONNECTOR` (the chain rule of the
    module docstring: decode sends through its incoming prefill -> decode edge's
    connector, a NIXL middle stage needs NIXL on its outgoing edge), each with ``host``
    = the address of its sending stage's host (``addresses``: host -> address) and
    ``zmq_port`` = ``port_base`` + :data:`PAYLOAD_PORT_OFFSET`; the edge's other
    ``extra`` keys (the codec chunk sizes) are kept. [] when no payload edge crosses.
    Raises ``ValueError`` naming a sending host without an address (its receiver on
    another host could not dial it)."""
    if not crossing(edges, stage_host, pd_pair):
        return []
    out = []
    for e in sorted(edges, key=lambda e: (e.src, e.dst)):
        host = stage_host.get(e.src)
        if host is None:
            continue
        if host not in addresses:
            raise ValueError(f"stage {e.src} sends to stage {e.dst} from {host}, which has no address")
        extra = {k: v for k, v in (e.extra or {}).items() if k not in ("host", "zmq_port", "sender_host",
                                                                         "sender_zmq_port", "role")}
        extra.update({"host": addresses[host], "zmq_port": port_base + PAYLOAD_PORT_OFFSET})
        out.append(EdgeRewrite(e.src, e.dst, f"connector_of_nixl_{e.src}_{e.dst}", extra))
    return out


def sender_port(zmq_port: int, from_stage: int, replica: int = 0, rank: int = 0) -> int:
    """The port a NIXL / Mooncake Transfer Engine omni connector's sender binds:
    ``zmq_port`` + 1024 x ``replica`` + 16 x ``rank`` + ``from_stage`` (request
    forwarding; vllm_omni/distributed/omni_connectors/utils/initialization.py
    ``compute_connector_zmq_port``)."""
    return zmq_port + 1024 * replica + 16 * rank + from_stage
