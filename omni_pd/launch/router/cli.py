"""Command line of the router: ``python -m omni_pd.launch.router --help``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Sequence

from omni_pd.launch.router.backends import BALANCE_POLICIES, Backend, parse_backend, parse_port
from omni_pd.launch.router.core import PDRouter, Timeouts
import omni_pd.compile.connectors as connectors
from omni_pd.launch.router.protocol import CONNECTORS, ConnectorStrategy, connector_class
from omni_pd.launch.router.server import RouterServer, run_loop
from omni_pd.launch.router.sizing import MAX_DEFAULT, default_workers

log = logging.getLogger("omni_pd.router")

#: the router's log line: time, level, logger, message (no source location, thread or process)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True)
class RouterConfig:
    """Parsed command line. Times in seconds. ``workers``: router processes accepting on
    the one listening socket (each with its own pooled connections, poller and counts).

    ``timeout``: longest silence of a backend on a request; ``prefill_timeout``: bound on
    the whole prefill leg (None: none beyond ``timeout``); ``max_concurrency``: generation
    requests in flight before 503 + Retry-After; ``retries``: other instances a failed
    leg is tried on; ``balance``: ``least_outstanding`` | ``round_robin``; ``encoders``:
    encoder-only instances (E of E->P->D, :mod:`.encode`), empty without encoder split;
    ``instances``: instances that run prefill and decode themselves (E -> PD, ``--instance``;
    then ``connector`` is None and ``prefills``/``decodes`` are empty).
    """

    host: str
    port: int
    connector: type[ConnectorStrategy] | None
    prefills: tuple[Backend, ...]
    decodes: tuple[Backend, ...]
    timeout: float = 3600.0
    connect_timeout: float = 5.0
    health_timeout: float = 2.0
    prefill_timeout: float | None = None
    health_interval: float = 2.0
    max_concurrency: int = 1024
    retries: int = 2
    balance: str = "least_outstanding"
    log_level: str = "INFO"
    workers: int = 1
    encoders: tuple[Backend, ...] = ()
    instances: tuple[Backend, ...] = ()


def _bootstrap_connectors() -> list[str]:
    """Names of the served connectors whose prefills have a bootstrap port (``router_bootstrap``)."""
    return [name for name, cls in CONNECTORS.items() if cls.contract.router_bootstrap]


def build_parser() -> argparse.ArgumentParser:
    """The router's argparse parser."""
    short = ", ".join(n.removesuffix("Connector").lower() for n in CONNECTORS if n.endswith("Connector"))
    boot = [(n, CONNECTORS[n].contract.router_default_bootstrap_port) for n in _bootstrap_connectors()]
    p = argparse.ArgumentParser(
        prog="python -m omni_pd.launch.router",
        description="PD router for single-LLM pipelines: sends each request to a prefill and a "
                    "decode vllm serve, carrying the KV connector's kv_transfer_params; or, with "
                    "--instance (E -> PD), each request whole to an instance that runs both.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on; 0 = any free (default 8000)")
    p.add_argument("--connector",
                   help=f"KV connector of the P/D engines: {', '.join(CONNECTORS)} (or {short}); "
                        "required with --prefill/--decode, none with --instance")
    p.add_argument("--prefill", action="append", nargs="+", default=[], metavar="URL",
                   help="prefill base URL, repeatable. "
                        + "; ".join(f"{n}: URL,BOOTSTRAP_PORT (or URL BOOTSTRAP_PORT; default port {port})"
                                    for n, port in boot))
    p.add_argument("--decode", action="append", default=[], metavar="URL",
                   help="decode base URL, repeatable")
    p.add_argument("--instance", action="append", default=[], metavar="URL",
                   help="an instance that runs prefill and decode itself (E -> PD: no KV connector, no "
                        "--prefill/--decode): each request goes to one of them whole (repeatable)")
    p.add_argument("--encoder", action="append", default=[], metavar="URL",
                   help="encoder-only instance (E of E->P->D or E->PD): media items are encoded there first "
                        "(repeatable)")
    p.add_argument("--balance", default="least_outstanding", choices=BALANCE_POLICIES,
                   help="how an instance is picked per leg (default least_outstanding)")
    p.add_argument("--max-concurrency", type=int, default=1024,
                   help="generation requests in flight; more get 503 + Retry-After (default 1024)")
    p.add_argument("--retries", type=int, default=2,
                   help="other instances a failed leg is tried on before the client sees it (default 2)")
    p.add_argument("--timeout", type=float, default=3600.0,
                   help="seconds a backend may stay silent on a request (default 3600)")
    p.add_argument("--prefill-timeout", type=float, default=None,
                   help="seconds the whole prefill leg may take (default: no bound beyond --timeout)")
    p.add_argument("--connect-timeout", type=float, default=5.0, help="seconds per connect (default 5)")
    p.add_argument("--health-timeout", type=float, default=2.0,
                   help="seconds per backend /health probe (default 2)")
    p.add_argument("--health-interval", type=float, default=2.0,
                   help="seconds between background /health polls of every backend (default 2)")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="router processes sharing the listening socket (default: a quarter of the CPUs, "
                        f"at least 1, at most {MAX_DEFAULT}: {default_workers()} here; more use more cores, "
                        "each balancing on its own counts)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def parse_args(argv: Sequence[str] | None = None) -> RouterConfig:
    """Parse the command line into a :class:`RouterConfig`; bad usage exits with status 2
    and an argparse message."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.instance:
        return _parse_instances(parser, ns)
    if ns.connector is None:
        parser.error("give --connector with --prefill/--decode (or --instance URL for E -> PD)")
    try:
        connector = connector_class(ns.connector)
    except ValueError as exc:
        parser.error(str(exc))
    prefills = []
    for words in ns.prefill:
        try:
            if len(words) > 2:
                raise ValueError(f"--prefill takes URL[,BOOTSTRAP_PORT] or URL BOOTSTRAP_PORT, got {words}")
            bp = None
            if len(words) == 2 and words[1].lower() != "none":
                bp = parse_port(words[1], what="bootstrap port", text=" ".join(words))
            backend = parse_backend(words[0], bootstrap_port=bp)
        except ValueError as exc:
            parser.error(f"--prefill: {exc}")
        if backend.bootstrap_port is not None and not connector.contract.router_bootstrap:
            parser.error(f"--prefill {' '.join(words)}: a bootstrap port applies to "
                         f"{' and '.join(_bootstrap_connectors())} only")
        prefills.append(backend)
    decodes = _backends(parser, "--decode", ns.decode)
    if not prefills or not decodes:
        parser.error("give at least one --prefill and one --decode")
    return _config(parser, ns, connector=connector, prefills=tuple(prefills), decodes=decodes)


def _backends(parser: argparse.ArgumentParser, flag: str, texts: Sequence[str]) -> tuple[Backend, ...]:
    """Each of ``texts`` parsed as a backend URL; bad usage (exit 2) naming ``flag``."""
    out = []
    for text in texts:
        try:
            out.append(parse_backend(text))
        except ValueError as exc:
            parser.error(f"{flag}: {exc}")
    return tuple(out)


def _parse_instances(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> RouterConfig:
    """The E -> PD front (``--instance``): no KV connector, no prefill/decode pools."""
    if ns.prefill or ns.decode or ns.connector is not None:
        parser.error("--instance runs prefill and decode in one instance: give it without --prefill, --decode "
                     "and --connector")
    return _config(parser, ns, connector=None, prefills=(), decodes=(),
                   instances=_backends(parser, "--instance", ns.instance))


def _config(parser: argparse.ArgumentParser, ns: argparse.Namespace, **backends) -> RouterConfig:
    """The :class:`RouterConfig` of ``ns`` with ``backends`` (connector and pools), after
    the checks every mode shares (encoders, port, timeouts, sizes)."""
    encoders = _backends(parser, "--encoder", ns.encoder)
    if not 0 <= ns.port <= 65535:
        parser.error(f"--port {ns.port} is outside 0..65535")
    for name in ("timeout", "connect_timeout", "health_timeout", "health_interval", "prefill_timeout"):
        v = getattr(ns, name)
        if v is not None and v <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if ns.max_concurrency < 1 or ns.retries < 0 or not 1 <= ns.workers <= 64:
        parser.error("--max-concurrency must be >= 1, --retries >= 0 and --workers 1..64")
    return RouterConfig(host=ns.host, port=ns.port, timeout=ns.timeout, connect_timeout=ns.connect_timeout,
                        health_timeout=ns.health_timeout, prefill_timeout=ns.prefill_timeout,
                        health_interval=ns.health_interval, max_concurrency=ns.max_concurrency,
                        retries=ns.retries, balance=ns.balance, log_level=ns.log_level, workers=ns.workers,
                        encoders=encoders, **backends)


def _pre_legs(config: RouterConfig) -> list:
    """The encoder pre-leg when ``--encoder`` was given (:mod:`.encode`)."""
    if not config.encoders:
        return []
    from omni_pd.launch.router.encode import EncodeLeg

    return [(EncodeLeg(), config.encoders)]


def make_server(config: RouterConfig, *, discovery_interval: float = 1.0) -> RouterServer:
    """Bind the router (raises OSError when the address is taken). Serve with
    ``serve_forever()`` (or ``await serve()``); stop with ``shutdown()``, then
    ``server_close()``. ``discovery_interval``: seconds between polls while a prefill's
    Mooncake ids are unknown or an instance is down."""
    router = PDRouter(config.prefills, config.decodes or config.instances, config.connector,
                      timeouts=Timeouts(read=config.timeout, prefill=config.prefill_timeout,
                                        connect=config.connect_timeout, health=config.health_timeout),
                      balance=config.balance, retries=config.retries,
                      health_interval=config.health_interval, discovery_interval=discovery_interval,
                      pre_legs=_pre_legs(config))
    return RouterServer((config.host, config.port), router, max_concurrency=config.max_concurrency)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, bind, serve until SIGTERM/SIGINT. Exit status 0 on a clean stop,
    1 when the address cannot be bound, 2 on bad usage."""
    args = list(sys.argv[1:] if argv is None else argv)
    if _connector_protocol(args) == "push_front":  # vllm-ascend layerwise push: decode first
        from omni_pd.launch.ascend_proxy import main as push_main

        return push_main(args)
    config = parse_args(argv)
    logging.basicConfig(level=config.log_level, stream=sys.stderr, format=LOG_FORMAT)
    lean_log_records()
    try:
        server = make_server(config)
    except OSError as exc:
        print(f"error: cannot listen on {config.host}:{config.port}: {exc}", file=sys.stderr)
        return 1

    children = _fork_workers(server, config.workers - 1)

    def started() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_stop)
        if config.connector is None:
            log.info("listening on %s (no KV connector; balance %s; instance %s; encoder %s)", server.url,
                     config.balance, ", ".join(i.url for i in config.instances),
                     ", ".join(e.url for e in config.encoders) or "-")
            return
        log.info("listening on %s (connector %s; balance %s; prefill %s; decode %s)", server.url,
                 config.connector.name, config.balance,
                 ", ".join(p.url if p.bootstrap_port is None else f"{p.url} bootstrap {p.bootstrap_port}"
                           for p in server.router.prefills),
                 ", ".join(d.url for d in config.decodes))

    try:
        run_loop(server.serve(on_started=started))
    finally:
        server.server_close()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
    return 0


def lean_log_records() -> None:
    """Stop :mod:`logging` collecting, for every record, what :data:`LOG_FORMAT` never
    prints: the caller's source file, line and function (a walk up the stack), the thread,
    process and asyncio task names. These are the settings of the Python logging HOWTO,
    "Optimization" (``logging._srcfile = None``, ``logThreads``, ``logProcesses``,
    ``logMultiprocessing``, ``logAsyncioTasks``); the router's own process only (called by
    :func:`main`). The router logs one line per request at INFO, its default level
    (bench/RESULTS.md, "Router CPU per request")."""
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging.logAsyncioTasks = False  # Python >= 3.12


def _connector_protocol(args: Sequence[str]) -> str | None:
    """``router_protocol`` of the registered connector named by ``--connector X`` /
    ``--connector=X`` in ``args`` (any spelling :func:`omni_pd.compile.connectors.canonical`
    accepts), or None."""
    for i, a in enumerate(args):
        value = a.split("=", 1)[1] if a.startswith("--connector=") else (
            args[i + 1] if a == "--connector" and i + 1 < len(args) else None)
        if value is not None:
            contract = connectors.get(connectors.canonical(value) or "")
            return contract.router_protocol if contract is not None else None
    return None


def _fork_workers(server: RouterServer, n: int) -> list[int]:
    """Fork ``n`` worker processes serving ``server``'s listening socket (pre-fork: the
    kernel spreads accepted connections). Called before any event loop or thread exists.
    A worker stops on SIGTERM/SIGINT and when the main process dies (Linux parent-death
    signal). Returns the workers' pids."""
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid:
            pids.append(pid)
            continue
        code = 0
        try:
            _parent_death_signal(signal.SIGTERM)

            def stop_on_signals() -> None:
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, server.request_stop)

            run_loop(server.serve(on_started=stop_on_signals))
        except BaseException:  # noqa: BLE001 - a worker never returns into the parent's code
            code = 1
        finally:
            os._exit(code)
    return pids


def _parent_death_signal(sig: int) -> None:
    """``prctl(PR_SET_PDEATHSIG, sig)`` on Linux (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(sig), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
