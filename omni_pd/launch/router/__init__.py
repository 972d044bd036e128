"""PD router: one OpenAI-compatible HTTP front for N prefill and M decode `vllm serve`.

``omni-pd launch`` starts one ``vllm serve`` per prefill (P) and per decode (D) instance
of a single-LLM pipeline and this router in front of them::

    python -m omni_pd.launch.router --connector NixlConnector --port 8000 \\
        --prefill http://10.0.0.1:8100 --decode http://10.0.0.2:8200

    python -m omni_pd.launch.router --connector MooncakeConnector --port 8000 \\
        --prefill http://10.0.0.1:8100,25201 --prefill http://10.0.0.1:8101,25203 \\
        --decode http://10.0.0.2:8200

``--prefill URL[,BOOTSTRAP_PORT]`` (upstream's space form ``--prefill URL PORT`` is accepted
too); the bootstrap port is the prefill engine's ``VLLM_MOONCAKE_BOOTSTRAP_PORT``
(Mooncake only; default 8998, vLLM's default).

An encoder split in front of one instance (E -> PD, ``expand --encoder-split 1e1pd``) has
no P/D pair and no KV connector::

    python -m omni_pd.launch.router --port 8000 \
        --instance http://10.0.0.1:8100 --encoder http://10.0.0.1:8300

Each request's media items go to E first (:mod:`.encode`), then the whole request, with
E's ``ec_transfer_params``, to one ``--instance`` (pool ``pd``: picked, retried, health
polled and relayed as the decode leg is), as vLLM's disaggregated-encoder example proxy
does with ``--prefill-servers-urls disable``.

Routes
------
``POST /v1/completions``, ``POST /v1/chat/completions``
    Two legs per request; each leg's instance is picked on its own (least outstanding
    requests, ties in turn; ``--balance round_robin`` as an option), skipping instances
    the health poller or a failed leg marked down. Both legs carry the same
    ``X-Request-Id`` (UUID-shaped, unique per request: ``core.RequestIds``; echoed in the
    response) and the client's ``Authorization`` header. D's answer is relayed: JSON with
    its ``Content-Length``, or a stream (SSE) chunk by chunk as D produces it.
``GET /health``
    Probes every backend now (concurrently). 200 only when every backend's ``/health``
    answers 200 and the connector is ready; else 503. The body is JSON with one entry per
    backend and per instance (outstanding legs, served, failures) either way.
``GET /v1/models``
    Proxied to a decode instance (healthy first, the next one on a connection error).

The prefill leg (both connectors; :func:`prefill_request_body`)
----------------------------------------------------------------
``max_tokens`` = 1 (and ``max_completion_tokens`` = 1 when present), ``min_tokens`` and
``min_completion_tokens`` removed, ``stop`` and ``stop_token_ids`` removed (vLLM's
defaults are empty), ``ignore_eos`` = true, ``stream`` = false, ``stream_options``
removed, ``kv_transfer_params`` set by the connector. Why: P must finish its one token
with ``FINISHED_LENGTH_CAPPED`` for the connector to keep the KV blocks for D (Mooncake
keeps them only then; NIXL on 0.11 only then, later also on STOPPED —
vllm_kv_connectors.md §3.1/§3.2), so nothing may stop it earlier (a stop string, a stop
token, EOS), and ``min_tokens`` > 1 would fail vLLM's ``min_tokens <= max_tokens``
check. The toy proxies (§4.1, §4.2) set max_tokens/stream and drop min_tokens and
stream_options; clearing stop conditions and EOS is omni-pd's addition.

Connector contracts (:data:`CONNECTORS`, keyed by the ``kv_connector`` name)
---------------------------------------------------------------------------
Each connector's routing behaviour is read from its contract module in
:mod:`omni_pd.compile.connectors` (``router_protocol`` ``pull`` | ``bootstrap`` |
``push_front``, ``router_prefill_params``, ``router_decode_params``,
``router_default_bootstrap_port``, ``router_dp_rank_header``); the router holds one
strategy per protocol (:data:`PROTOCOLS`) and no connector names of its own.
NixlConnector (sequential; vLLM ``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``)
    P gets ``{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id":
    null, "remote_block_ids": null, "remote_host": null, "remote_port": null}``; the
    router waits for P's JSON answer and gives D the original body with P's
    ``kv_transfer_params`` dict verbatim (every key, including ones added by newer vLLM).
    A P answer without ``kv_transfer_params`` is logged and D runs without them (D then
    computes the prompt itself: correct output, no disaggregation), as upstream does.
MooncakeConnector (concurrent, vLLM >= 0.18 protocol;
``examples/disaggregated/mooncake_connector/mooncake_connector_proxy.py``)
    After P's ``/health`` is 200 the router reads ``GET http://<P host>:<bootstrap
    port>/query`` (``{dp_rank: {"engine_id": ...}}``) and cycles over every (P, dp rank).
    Per request ``transfer_id = "xfer-<request id>"``; P gets ``{"do_remote_decode": true,
    "do_remote_prefill": false, "transfer_id": ...}`` and header ``X-data-parallel-rank``;
    D gets, at the same time, the original body with ``{"do_remote_decode": false,
    "do_remote_prefill": true, "remote_bootstrap_addr": "http://<P host>:<port>",
    "remote_engine_id": <engine id of that dp rank>, "transfer_id": ...}``. D's answer is
    relayed once P's leg has succeeded; if P's leg fails first, D's request is aborted.
    Until some prefill's engine ids are known, generation requests get 503. The ids of a
    prefill are read again whenever it comes back after being marked down (a restarted
    engine has new ones); a prefill being rediscovered is out of the rotation.

Errors
------
Always JSON ``{"error": {"message", "type", "code", ...}}``, never a traceback. A prefill
leg that cannot be reached, times out, answers 5xx or answers non-JSON gives **502**
naming the backend (``"backend"``, ``"leg": "prefill"``); a 4xx from P (the client's
request is invalid, e.g. an unknown model or a bad API key) is relayed with P's status
and body. A decode backend that cannot be reached gives 502 naming it; any HTTP answer of
D but 503 is relayed as it is, except a 5xx while another prefill is available: the pair
is run again with that prefill first (D may have failed to read the KV of a prefill that
died), up to ``--retries`` times; with one prefill and several decodes (NIXL, 1P2D) the
pair is run again with the same prefill on a decode that has not failed it (vLLM answers
500 for a request whose KV load failed); with one prefill and one decode (NIXL) the pair is
run once more (D's handshake with P times out after 5 s on a starved host, and the next
request handshakes again). A body that is not a JSON object gives 400; more than
``--max-concurrency`` requests in flight give 503 with ``Retry-After``.

Secrets: the incoming ``Authorization`` header is passed through to both legs and to
``/v1/models``; no header value is ever logged. There is no fallback to
``$OPENAI_API_KEY`` (the toy proxies' behaviour), so an unauthenticated client cannot use
the router's credentials.

Serving behaviour
-----------------
* Transport: aiohttp on both sides, on one asyncio loop (uvloop when installed): its
  low-level server faces the clients; one long-lived ``ClientSession`` (pooled keep-alive
  ``TCPConnector``, no cookie jar, no decompression, bytes bodies, one ``ClientTimeout``
  per leg kind built once) carries the backend legs, health probes and ``/v1/models``.
  Why aiohttp: vLLM itself depends on it, so a vLLM host has it; one well-kept package
  gives both a pooled keep-alive client and a server that streams without a thread per
  stream, enforces body limits, accepts chunked uploads and cancels a handler when its
  client disconnects. A hand-written HTTP/1.1 client measured cheaper (~17 against ~57
  µs of CPU per POST, bench/router_legs_micro.py) and was removed: an HTTP client is
  outside omni-pd's core. JSON: orjson when importable (:mod:`.codec`); D's body is the
  client's bytes with ``kv_transfer_params`` spliced in, not a re-encoding. aiohttp is an
  omni-pd dependency (pyproject), so the router runs under omni-pd's own interpreter
  (``sys.executable`` of ``omni-pd launch``); ``pip install 'omni-pd[router]'`` adds
  uvloop and orjson.
* Backend connections are pooled and kept alive (no connect per leg); TCP_NODELAY on
  both sides; listen backlog 4096.
* Retry: a leg that cannot connect, is dropped, times out, or gets 5xx from P / 503 from
  D is retried on another instance (``--retries``, default 2) as long as nothing reached
  the client; the failed instance is marked down until its next ``/health`` 200.
* Health: every ``--health-interval`` seconds the router polls every backend's
  ``/health``; instances marked down are skipped (tried only when all of a pool are down,
  so the error names a backend).
* Client gone: the request's handler is cancelled; every leg in flight (prefill and/or
  decode) is cancelled and its backend connection closed, which makes vLLM abort it.
* Timeouts: ``--timeout`` (a backend's longest silence), ``--prefill-timeout`` (the whole
  prefill leg), ``--connect-timeout``, ``--health-timeout``.

Adding a leg before P/D (the E in E->P->D)
------------------------------------------
:class:`~omni_pd.launch.router.core.PreLeg` is the seam: a subclass names its pool
(``role = "encode"``) and implements ``async apply(ctx, body) -> body``; the router is
built with ``PDRouter(..., pre_legs=[(EncodeLeg(), encoder_backends)])``. ``apply`` runs
before the P/D legs of every generation request and calls ``ctx.call_json("encode", path,
item_body)`` once per media item, getting picking, load balancing, health skipping,
retry and client-disconnect cancellation from the router, then returns the client body
with the items' ``ec_transfer_params`` merged in. Its pool appears in ``/health``. The
P/D protocol (:mod:`.protocol`) and the transport (:mod:`.core`) are not edited.

Modules: :mod:`.backends` (URLs, instance state, picking), :mod:`.protocol` (bodies,
routing protocols), :mod:`.core` (legs on aiohttp's client, retry, health),
:mod:`.codec` (JSON), :mod:`.server` (aiohttp front), :mod:`.cli` (command line).
"""

from omni_pd.launch.router.backends import (  # noqa: F401 - the package's public names
    BALANCE_POLICIES, Backend, Instance, Pool, parse_backend)
from omni_pd.launch.router.cli import RouterConfig, build_parser, main, make_server, parse_args  # noqa: F401
from omni_pd.launch.router.core import (  # noqa: F401
    LegContext, LegError, PDRouter, PreLeg, Timeouts, error_payload)
from omni_pd.launch.router.protocol import (  # noqa: F401
    CONNECTORS, DEFAULT_MOONCAKE_BOOTSTRAP_PORT, PREFILL_DROP, PROTOCOLS, BootstrapStrategy, ConnectorStrategy,
    MooncakeStrategy, NixlStrategy, PrefillTarget, PullStrategy, connector_class, decode_request_body,
    decode_request_bytes, parse_bootstrap_query, prefill_request_body, transfer_id_for)
from omni_pd.launch.router.server import GENERATE_ROUTES, MAX_BODY_BYTES, Front, RouterServer  # noqa: F401
