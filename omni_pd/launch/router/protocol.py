"""The P/D protocol of the router: request bodies and the routing protocols (pure).

What each KV connector needs on its legs is read from its contract module in
:mod:`omni_pd.compile.connectors` (``router_protocol``, ``router_prefill_params``,
``router_decode_params``, ``router_default_bootstrap_port``, ``router_dp_rank_header``):
this module holds one strategy class per *protocol* (:data:`PROTOCOLS`: ``pull``,
``bootstrap``) and builds the per-connector classes of :data:`CONNECTORS` from the
registry, so adding a connector is one contract module and no router edit. The transport
(:mod:`.core`) never looks inside ``kv_transfer_params``. See the package docstring for
the rules and their sources.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Awaitable, Callable, ClassVar, Mapping, Sequence

import omni_pd.compile.connectors as connectors
import omni_pd.compile.connectors.ascend_mooncake as _ascend_mooncake
import omni_pd.compile.connectors.mooncake as _mooncake
import omni_pd.compile.connectors.nixl as _nixl
import omni_pd.launch.router.codec as codec
from omni_pd.compile.connectors.base import KVConnector
from omni_pd.launch.router.backends import Backend, Instance

log = logging.getLogger("omni_pd.router")

#: vLLM's default ``VLLM_MOONCAKE_BOOTSTRAP_PORT``, from the Mooncake contract module.
DEFAULT_MOONCAKE_BOOTSTRAP_PORT = _mooncake.CONNECTOR.router_default_bootstrap_port

#: keys removed from the prefill body (see the package docstring for why)
PREFILL_DROP = ("min_tokens", "min_completion_tokens", "stop", "stop_token_ids", "stream_options")

#: ``get(instance_or_backend, path, port) -> (status, body bytes)``; raises on transport errors
HttpGet = Callable[[Backend, str, "int | None"], Awaitable[tuple[int, bytes]]]


def prefill_request_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any]) -> dict[str, Any]:
    """The body P receives: a copy of the client's ``body`` (a JSON object, unchanged) with
    ``max_tokens`` = 1, ``max_completion_tokens`` = 1 if present, ``min_tokens``,
    ``min_completion_tokens``, ``stop``, ``stop_token_ids`` and ``stream_options`` removed,
    ``ignore_eos`` = true, ``stream`` = false and ``kv_transfer_params`` (copied).

    Source: vLLM toy_proxy_server.py / mooncake_connector_proxy.py (max_tokens, stream,
    stream_options, min_tokens); stop conditions: omni-pd, so P ends LENGTH_CAPPED.
    """
    out = {k: v for k, v in body.items() if k not in PREFILL_DROP}
    out["max_tokens"] = 1
    if "max_completion_tokens" in body:
        out["max_completion_tokens"] = 1
    out["ignore_eos"] = True
    out["stream"] = False
    out["kv_transfer_params"] = dict(kv_transfer_params)
    return out


def decode_request_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The body D receives: the client's ``body`` unchanged, with ``kv_transfer_params``
    replaced by the connector's (a copy). ``None`` leaves the body as the client sent it."""
    out = dict(body)
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = dict(kv_transfer_params)
    return out


def decode_request_bytes(body: Mapping[str, Any], raw: bytes | None,
                         kv_transfer_params: Mapping[str, Any] | None) -> bytes:
    """:func:`decode_request_body` as the UTF-8 JSON bytes D receives, without re-encoding
    the client's body where that is exact: ``raw`` (the client's bytes, of which ``body``
    is the parse; None when the body was changed, e.g. by a pre-leg) is sent as it is
    when there are no parameters to add, and with ``,"kv_transfer_params":{...}`` spliced
    before its closing brace when ``body`` is a non-empty object without that key and
    ``raw`` is UTF-8 text (starts with ``{`` and ends with ``}`` after blanks; UTF-16/32
    and BOM-prefixed text fail that test). Every other case encodes the whole body. The
    JSON value D parses is the same either way."""
    if raw is not None:
        if kv_transfer_params is None:
            return raw
        text = raw.strip()
        if body and "kv_transfer_params" not in body and text[:1] == b"{" and text[-1:] == b"}":
            return b"%s,\"kv_transfer_params\":%s}" % (text[:-1], codec.dumps(kv_transfer_params))
    return codec.dumps(decode_request_body(body, kv_transfer_params))


def transfer_id_for(request_id: str) -> str:
    """Mooncake ``transfer_id`` of a request: ``xfer-<request id>`` (upstream proxy format)."""
    return f"xfer-{request_id}"


@dataclass(frozen=True, eq=False)
class PrefillTarget:
    """One unit of the prefill rotation: an instance and, for Mooncake, one DP rank of it."""

    instance: Instance
    dp_rank: int | None = None

    @property
    def backend(self) -> Backend:
        return self.instance.backend

    def describe(self) -> str:
        return self.backend.url if self.dp_rank is None else f"{self.backend.url}[dp{self.dp_rank}]"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, PrefillTarget) and other.instance is self.instance
                and other.dp_rank == self.dp_rank)

    def __hash__(self) -> int:
        return hash((id(self.instance), self.dp_rank))


class ConnectorStrategy:
    """How one KV connector's routing contract is carried between P and D.

    Per connector, :func:`connector_class` makes a subclass of a protocol class
    (:data:`PROTOCOLS`) with ``name`` (the vLLM ``kv_connector`` name) and ``contract``
    (its :class:`~omni_pd.compile.connectors.base.KVConnector`) set. ``concurrent``: P and
    D dispatched together, or D after P's answer. ``prefills``: the prefill backends
    (normalized by the protocol, e.g. a default bootstrap port); the router builds its
    prefill pool from this list, in order.
    """

    name: ClassVar[str]
    contract: ClassVar[KVConnector]
    concurrent: ClassVar[bool] = False

    def __init__(self, prefills: Sequence[Backend]):
        self.prefills = list(prefills)
        self.instances: list[Instance] = []
        self._targets: list[PrefillTarget] = []

    def bind(self, instances: Sequence[Instance]) -> None:
        """Called once by the router with the prefill pool's instances (same order)."""
        self.instances = list(instances)
        self._targets = [PrefillTarget(i) for i in self.instances]

    async def on_healthy(self, inst: Instance, get: HttpGet) -> None:
        """Called after each ``/health`` 200 of prefill ``inst`` (default: nothing to learn)."""

    def on_down(self, inst: Instance) -> None:
        """Called when prefill ``inst`` is marked down (default: nothing to forget)."""

    def not_ready_reason(self) -> str | None:
        """Why generation requests cannot be routed yet, or None when ready."""
        return None

    def prefill_targets(self) -> list[PrefillTarget]:
        """The prefill rotation, in order (default: one entry per instance). The list is
        the strategy's own (built when the rotation changes, not per request): read it,
        never mutate it."""
        return self._targets

    def prefill_headers(self, target: PrefillTarget) -> dict[str, str]:
        """Extra headers of the prefill leg (default: none)."""
        return {}

    def prefill_kv_params(self, request_id: str, target: PrefillTarget) -> dict[str, Any]:
        """``kv_transfer_params`` of the prefill leg."""
        raise NotImplementedError

    def decode_kv_params(self, request_id: str, target: PrefillTarget,
                         prefill_response: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``kv_transfer_params`` of the decode leg. ``prefill_response`` is P's JSON answer
        (sequential connectors) or None (concurrent ones, called before P answers). None
        means "send D the client's body unchanged"."""
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """Connector state for ``/health`` (JSON-able; no secrets)."""
        return {}


class PullStrategy(ConnectorStrategy):
    """Protocol ``pull``: P first with the contract's ``router_prefill_params``; D gets the
    ``kv_transfer_params`` P answered, verbatim (every key, including ones newer releases
    add). Sources: each contract module (NIXL: vLLM ``toy_proxy_server.py``;
    vllm-ascend ``MooncakeConnectorV1``: its load-balance proxy example)."""

    concurrent = False

    def prefill_kv_params(self, request_id, target):
        return dict(self.contract.router_prefill_params)

    def decode_kv_params(self, request_id, target, prefill_response):
        params = (prefill_response or {}).get("kv_transfer_params")
        return params if isinstance(params, dict) else None


class NoKVStrategy(ConnectorStrategy):
    """No KV connector: the router of an E -> PD layout, whose instances run prefill and
    decode themselves (``PDRouter(..., connector=None)``). No prefill pool, no routing
    fields: the body (with the encoder pre-leg's ``ec_transfer_params``) goes to one
    instance whole, as vLLM's disaggregated-encoder example proxy forwards it when its
    prefill cluster is ``disable`` (examples/online_serving/disaggregated_encoder/
    disagg_epd_proxy.py ``maybe_prefill``). The KV methods are never called."""

    name = "none"

    def prefill_kv_params(self, request_id, target):
        raise AssertionError("no prefill leg without a KV connector")

    def decode_kv_params(self, request_id, target, prefill_response):
        return None


def parse_bootstrap_query(data: Any) -> dict[int, str]:
    """Engine id per DP rank from a Mooncake bootstrap ``GET /query`` answer.

    Shape (vLLM >= 0.18 ``mooncake_connector.py``): ``{"<dp_rank>": {"engine_id": str,
    "worker_addr": {...}}, ...}``. Returns ``{dp_rank: engine_id}`` (non-empty). Raises
    ValueError on any other shape.
    """
    if not isinstance(data, dict) or not data:
        raise ValueError(f"expected a non-empty JSON object, found {type(data).__name__}")
    out: dict[int, str] = {}
    for key, entry in data.items():
        try:
            rank = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"dp rank {key!r} is not an integer") from None
        engine_id = entry.get("engine_id") if isinstance(entry, dict) else None
        if not isinstance(engine_id, str) or not engine_id:
            raise ValueError(f"dp rank {rank} has no engine_id")
        out[rank] = engine_id
    return dict(sorted(out.items()))


@dataclass
class _BootstrapState:
    ready: bool = False
    engine_ids: dict[int, str] = field(default_factory=dict)
    error: str | None = "waiting for prefill /health"
    generation: int = -1  # the instance generation the ids were read in


class BootstrapStrategy(ConnectorStrategy):
    """Protocol ``bootstrap`` (MooncakeConnector, vLLM >= 0.18): P and D at once, joined
    by ``transfer_id``.

    Source: vLLM ``examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py``;
    vllm_kv_connectors.md §3.2 (P answers no kv_transfer_params; D needs all of
    ``remote_bootstrap_addr``, ``remote_engine_id``, ``transfer_id`` or silently runs
    without a transfer). P gets the contract's ``router_prefill_params`` and its DP rank in
    the ``router_dp_rank_header``; D the ``router_decode_params``. Engine ids are read from
    ``GET <bootstrap>/query`` after P's ``/health`` is 200, and read again whenever P comes
    back after being marked down (a restarted engine has new ids).
    """

    concurrent = True

    def __init__(self, prefills: Sequence[Backend]):
        default = self.contract.router_default_bootstrap_port
        missing = [p.url for p in prefills if p.bootstrap_port is None]
        prefills = [p if p.bootstrap_port is not None else Backend(p.url, p.scheme, p.host, p.port, default)
                    for p in prefills]
        super().__init__(prefills)
        if missing:
            log.info("%s: no bootstrap port given for %s; using %d", self.name, ", ".join(missing), default)
        self._state: dict[int, _BootstrapState] = {}

    def bind(self, instances):
        super().bind(instances)
        self._state = {id(i): _BootstrapState() for i in self.instances}
        self._rebuild_targets()

    def _rebuild_targets(self) -> None:
        self._targets = [PrefillTarget(i, rank) for i in self.instances
                         for rank in (self._state[id(i)].engine_ids if self._state[id(i)].ready else ())]

    async def on_healthy(self, inst, get):
        st = self._state[id(inst)]
        if st.ready and st.generation == inst.generation:
            return
        try:
            status, raw = await get(inst.backend, "/query", inst.backend.bootstrap_port)
            if status != 200:
                raise ValueError(f"bootstrap {inst.backend.bootstrap_addr}/query answered {status}")
            engine_ids = parse_bootstrap_query(json.loads(raw))
        except (OSError, ValueError) as exc:
            st.ready, st.error = False, str(exc) or type(exc).__name__
            self._rebuild_targets()
            return
        if st.engine_ids and st.engine_ids != engine_ids:
            log.info("%s: prefill %s came back with new engine ids %s", self.name, inst.url, engine_ids)
        else:
            log.info("%s: prefill %s engine ids %s", self.name, inst.url, engine_ids)
        st.engine_ids, st.ready, st.error, st.generation = engine_ids, True, None, inst.generation
        self._rebuild_targets()

    def on_down(self, inst):
        st = self._state[id(inst)]
        st.ready, st.error = False, f"prefill marked down ({inst.last_error})"
        self._rebuild_targets()

    def not_ready_reason(self):
        if any(st.ready for st in self._state.values()):
            return None
        pending = [f"{i.url} ({self._state[id(i)].error})" for i in self.instances]
        kind = self.name.removesuffix("Connector")
        return f"waiting for the {kind} bootstrap /query of prefill " + ", ".join(pending)

    def prefill_headers(self, target):
        header = self.contract.router_dp_rank_header
        return {header: str(target.dp_rank)} if header else {}

    def prefill_kv_params(self, request_id, target):
        return {**self.contract.router_prefill_params, "transfer_id": transfer_id_for(request_id)}

    def decode_kv_params(self, request_id, target, prefill_response):
        engine_id = self._state[id(target.instance)].engine_ids[target.dp_rank]
        return {**self.contract.router_decode_params,
                "remote_bootstrap_addr": target.backend.bootstrap_addr,
                "remote_engine_id": engine_id, "transfer_id": transfer_id_for(request_id)}

    def state(self):
        urls = [i.url for i in self.instances]
        out = {}
        for i in self.instances:
            st = self._state[id(i)]
            key = i.url if urls.count(i.url) == 1 else f"{i.url} [{i.index}]"
            out[key] = {"addr": i.backend.bootstrap_addr, "ready": st.ready,
                        "engine_ids": {str(k): v for k, v in st.engine_ids.items()}, "error": st.error}
        return {"bootstrap": out}


#: routing protocol (a contract's ``router_protocol``) -> strategy class. ``push_front``
#: (decode first) is :mod:`omni_pd.launch.ascend_proxy`, started by the router's command line.
PROTOCOLS: dict[str, type[ConnectorStrategy]] = {"pull": PullStrategy, "bootstrap": BootstrapStrategy}


@lru_cache(maxsize=None)
def _strategy_for(contract: KVConnector) -> type[ConnectorStrategy]:
    base = PROTOCOLS[contract.router_protocol]
    return type(f"{contract.name}Strategy", (base,), {
        "name": contract.name, "contract": contract, "__module__": __name__,
        "__doc__": f"{contract.name} on the router's ``{contract.router_protocol}`` protocol "
                   f"(contract: {type(contract).__module__})."})


#: connector name -> strategy class, for every registered contract whose ``router_protocol``
#: is one of :data:`PROTOCOLS`. Adding a connector is one contract module.
CONNECTORS: dict[str, type[ConnectorStrategy]] = {
    name: _strategy_for(c) for name, c in sorted(connectors.registry().items()) if c.router_protocol in PROTOCOLS}

#: the strategies of the connectors the router served first, by their contract modules' names
NixlStrategy = CONNECTORS[_nixl.CONNECTOR.name]
MooncakeStrategy = CONNECTORS[_mooncake.CONNECTOR.name]
AscendMooncakeStrategy = CONNECTORS[_ascend_mooncake.CONNECTOR.name]


def connector_class(name: str) -> type[ConnectorStrategy]:
    """The strategy for ``name``: a key of :data:`CONNECTORS`, spelled any way the
    connector registry accepts (:func:`omni_pd.compile.connectors.canonical`:
    case-insensitive, with or without the ``Connector`` suffix: ``nixl``, ``Mooncake``).
    Raises ValueError listing the names the router serves."""
    cls = CONNECTORS.get(connectors.canonical(name) or "")
    if cls is None:
        raise ValueError(f"unknown connector {name!r}; the router knows {', '.join(CONNECTORS)}")
    return cls
