"""``omni-pd launch --smoke``: one request through the entrypoint, then proof the KV moved.

Silent recompute is the classic PD failure: decode answers correctly but computed the
prompt itself because the transfer never happened. So the smoke check reads decode's
Prometheus counters before and after one greedy request and requires one that only grows
when KV arrives from prefill (:data:`KV_RECEIVED`). stdlib only.

Where decode's counters are, per runtime (:func:`smoke_target`):

* ``vllm`` (one ``vllm serve`` per instance + omni-pd's router): decode's own ``/metrics``;
  vLLM's ``PrometheusStatLogger`` (vllm/v1/metrics/loggers.py) labels every series
  ``engine="0"``, so every matching series on that page is decode's.
* ``vllm-omni`` (one ``vllm serve --omni`` server): the server's ``/metrics``. Its
  orchestrator thread records each stage engine's stats through
  ``OmniPrometheusStatLogger`` (vllm_omni/metrics/stat_logger.py), which replaces vLLM's
  ``engine`` label by ``stage`` + ``replica``; ``stage`` is the stage's index in the
  orchestrator's ``stage_pools`` (engine/orchestrator.py ``_init_metrics_state``), which
  is its ``stage_id`` in an ``expand`` output. Only series with decode's ``stage`` count:
  prefill's and the Talker's counters grow on every request. The series exist only when
  stats are on (``--disable-log-stats`` unset, the default); a page without them cannot
  prove anything and fails the check. vllm-omni's own ``vllm_omni:kv_wait_s`` measures its
  stage-to-stage KV channel, not the vLLM KV connector between prefill and decode, and is
  not used. The request goes to ``/v1/chat/completions`` with ``modalities: ["text"]``
  (Qwen3-Omni refuses ``/v1/completions``; text stops at the decode stage).

Whose fault a failure is: a server that does not answer, answers an HTTP error, a body
that is not JSON or JSON that is not the OpenAI reply shape is the server's
(:class:`ServerError`, exit 1, ``error_kind: server``); counters that did not grow are the
deployment's (exit 1, ``error_kind: check``); any other exception is a bug in omni-pd's
own smoke code (exit :data:`EXIT_BUG`, ``error_kind: omni-pd bug``; ``OMNI_PD_DEBUG=1``
lets it propagate). What cannot be measured is said, never passed silently:
``not_checked`` in ``smoke.json``.

Counters that grew are not the whole proof: on a loaded CPU, vLLM 0.30's NIXL prefill
released a request's blocks when its KV lease ran out (30 s by default) while decode was
still to read them, and decode then read blocks that may already hold another request's
KV; the counters grow all the same (issue 24 item 4). So the check also reads the engines'
logs (``<run-dir>/<name>.log``, written by the supervisor) for the lines of
:data:`KV_LOG_PROBLEMS` that name its own request, and fails on them
(:func:`kv_log_findings`). Its request is known by ``X-Request-Id``: the smoke request
carries one, and omni-pd's router answers with the id it gave both legs
(omni_pd/launch/router ``RequestIds``); vLLM builds its request id from that header
(vllm/entrypoints/serve/engine/serving.py ``_base_request_id``, then ``cmpl-<id>-<n>`` and
a random suffix, vllm/v1/engine/input_processor.py), so the id appears inside vLLM's.
Lines that appear only after the check (an expiry that comes a whole lease after the
request ended, when decode never read) are not seen; the counters catch that case.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import struct
import time
import traceback
import uuid
import zlib
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, TextIO

#: decode-side counters that grow only with KV received from a remote prefill, as
#: (sample name, labels the sample must carry): vLLM v1 metrics
#: (vllm/v1/metrics/loggers.py ``vllm:prompt_tokens_by_source`` with
#: ``source="external_kv_transfer"``, fed by ``PrefillStats.num_external_cached_tokens``)
#: and the NIXL connector's transfer count (``vllm:nixl_xfer_time_seconds``).
KV_RECEIVED: tuple[tuple[str, dict[str, str]], ...] = (
    ("vllm:prompt_tokens_by_source_total", {"source": "external_kv_transfer"}),
    ("vllm:nixl_xfer_time_seconds_count", {}),
)
#: exit status of a smoke check that failed because of a bug in omni-pd itself (the
#: status ``omni-pd`` gives every internal error, see omni_pd/cli_validate.py ``exit_status``)
EXIT_BUG = 3
#: long enough that whole KV blocks move (CPU block size is 128 tokens)
PROMPT = " ".join(f"def f{i}(x): return x * {i}" for i in range(60))



@dataclass(frozen=True)
class KVLogProblem:
    """A vLLM log line that says a request's KV blocks expired or were read after expiry.

    ``kind``: a short name (``smoke.json``); ``pattern``: matches the line's text with the
    request id as group ``request``; ``meaning``: what it means for the smoke request;
    ``source``: vLLM file and function (vLLM 0.30, kv_connector/v1/nixl/)."""

    kind: str
    pattern: re.Pattern[str]
    meaning: str
    source: str


#: the NIXL connector's expired / invalid KV messages in vLLM 0.30 (format strings read in
#: vllm/distributed/kv_transfer/kv_connector/v1/nixl/), request id as group ``request``
KV_LOG_PROBLEMS: tuple[KVLogProblem, ...] = (
    KVLogProblem(
        "lease expired",
        re.compile(r"Releasing expired KV blocks for request (?P<request>\S+) which were retrieved by "
                   r"(?P<readers>\d+) remote worker\(s\) before lease expired"),
        "prefill's KV lease ran out before decode had read the blocks, and prefill freed them",
        "base_worker.py NixlBaseConnectorWorker.get_transfer_results (WARNING)"),
    KVLogProblem(
        "read after expiry",
        re.compile(r"Potentially invalid KV blocks for unrecognized request (?P<request>\S+) were retrieved by "
                   r"a decode worker"),
        "decode read blocks prefill had already freed: the KV it used may be another request's",
        "pull_worker.py NixlPullConnectorWorker._get_new_notifs (ERROR)"),
    KVLogProblem(
        "push notification after expiry",
        re.compile(r"Unrecognized request (?P<request>\S+) notif \(may have expired\)"),
        "a push transfer finished for a request neither side still tracked (its lease expired)",
        "push_worker.py NixlPushConnectorWorker (ERROR)"),
    KVLogProblem(
        "expired read declined",
        re.compile(r"Declining expired remote read for (?P<request>\S+) from engine"),
        "decode's cached blocks for the read had expired; the transfer was failed",
        "pull_worker.py NixlPullConnectorWorker._read_blocks_for_req (WARNING)"),
)


@dataclass(frozen=True)
class KVLogFinding:
    """One :data:`KV_LOG_PROBLEMS` line: the log file, its line number (1-based, in the
    part of the file read), the problem, vLLM's request id and the line itself."""

    log: str
    line_no: int
    problem: KVLogProblem
    request: str
    line: str

    def to_json(self) -> dict[str, Any]:
        return {"log": self.log, "line": self.line_no, "kind": self.problem.kind, "request": self.request,
                "text": self.line}


def kv_log_findings(text: str, log: str, request_ids: tuple[str, ...], first_line: int = 1
                    ) -> tuple[list[KVLogFinding], list[KVLogFinding]]:
    """The :data:`KV_LOG_PROBLEMS` lines of ``text`` (a part of ``log`` starting at line
    ``first_line``), as ``(about the smoke request, about other requests)``: a line is
    the smoke request's when vLLM's request id in it contains one of ``request_ids``
    (``cmpl-<X-Request-Id>-0-<suffix>``). Pure."""
    mine: list[KVLogFinding] = []
    other: list[KVLogFinding] = []
    for i, line in enumerate(text.splitlines(), first_line):
        for problem in KV_LOG_PROBLEMS:
            m = problem.pattern.search(line)
            if m is None:
                continue
            rid = m.group("request").rstrip(".,")
            f = KVLogFinding(log, i, problem, rid, line.strip())
            (mine if any(r and r in rid for r in request_ids) else other).append(f)
            break
    return mine, other


def _log_marks(paths: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """``path -> (bytes, lines)`` of each log now (0, 0 for one not written yet)."""
    marks = {}
    for p in paths:
        try:
            with open(p, "rb") as f:
                data = f.read()
            marks[p] = (len(data), data.count(b"\n"))
        except OSError:
            marks[p] = (0, 0)
    return marks


def _read_logs(marks: dict[str, tuple[int, int]], request_ids: tuple[str, ...]
               ) -> tuple[list[KVLogFinding], list[KVLogFinding]]:
    """:func:`kv_log_findings` over what each log got since ``marks`` (a log that shrank,
    as a restarted engine's truncated one, is read from its start)."""
    mine: list[KVLogFinding] = []
    other: list[KVLogFinding] = []
    for p, (size, lines) in marks.items():
        try:
            with open(p, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if len(data) < size:
            size, lines = 0, 0
        m, o = kv_log_findings(data[size:].decode("utf-8", "replace"), p, request_ids, lines + 1)
        mine += m
        other += o
    return mine, other


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')


def _unescape(v: str) -> str:
    """A label value as written in the text format (``\\\\``, ``\\"``, ``\\n`` escaped)."""
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def samples(metrics_text: str):
    """``(name, labels, value)`` of every sample line of a Prometheus text page
    (comments and unparsable lines skipped; label values unescaped)."""
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = {k: _unescape(v) for k, v in _LABEL.findall(m.group(2) or "")}
        yield m.group(1), labels, value


def kv_received(metrics_text: str, stage: str | None = None) -> float:
    """Sum of the :data:`KV_RECEIVED` counters in a Prometheus text page.

    ``stage``: count only series labelled ``stage="<stage>"`` (a vllm-omni server's page
    holds every stage's counters); None: every matching series (decode's own page)."""
    total = 0.0
    for name, labels, value in samples(metrics_text):
        if stage is not None and labels.get("stage") != stage:
            continue
        for want, need in KV_RECEIVED:
            if name == want and all(labels.get(k) == v for k, v in need.items()):
                total += value
    return total


def has_stage_counters(metrics_text: str, stage: str) -> bool:
    """True when the page carries vLLM's prompt-token counters for ``stage`` (vllm-omni
    registers them only with stats on)."""
    return any(name == KV_RECEIVED[0][0] and labels.get("stage") == stage
               for name, labels, _ in samples(metrics_text))


@dataclass(frozen=True)
class SmokeTarget:
    """Where the smoke request goes and where decode's counters are.

    ``metrics_url``: decode's counters (None: not measurable); ``decode_stage``: the
    ``stage`` label of decode's series on a vllm-omni page (None: the page is decode's
    own); ``chat``: send ``/v1/chat/completions`` with text output (vllm-omni) instead of
    ``/v1/completions``; ``not_checked``: why ``metrics_url`` is None (said in the result
    line and ``smoke.json`` instead of passing silently)."""

    entrypoint: str
    model: str
    metrics_url: str | None
    decode_stage: str | None = None
    chat: bool = False
    #: encoder split: the EC connector, its shared directory and the log of the
    #: ec_consumer (prefill) where its DEBUG load line appears (:func:`ec_smoke`)
    ec_connector: str | None = None
    ec_storage: str | None = None
    ec_log: str | None = None
    #: what the results call the ec_consumer: ``prefill`` (E -> P -> D), or the instance's
    #: process name (``pd-0``, E -> PD)
    ec_consumer: str = "prefill"
    not_checked: str | None = None
    #: the engines' logs read for :data:`KV_LOG_PROBLEMS` about the smoke request
    #: (prefill and decode instances, or the vllm-omni server's); () when unknown
    kv_logs: tuple[str, ...] = ()


#: process roles whose logs hold the KV connector's lines (``omni``: the vllm-omni server
#: whose stage engines write to its output)
_KV_LOG_ROLES = ("prefill", "decode", "omni")


def smoke_target(plan: Any, model: str, decode_stage_id: int | None, run_dir: str | None = None) -> SmokeTarget:
    """The :class:`SmokeTarget` of a :class:`~omni_pd.launch.spec.LaunchPlan`.

    ``decode_stage_id``: the decode stage of the compiled config (used on the vllm-omni
    runtime). ``run_dir``: where the supervisor writes ``<name>.log`` (the ec_consumer's
    log is read for the encoder split, and every prefill, decode or vllm-omni server log
    for :data:`KV_LOG_PROBLEMS`). Pure."""
    logs = tuple(os.path.join(run_dir, p.name + ".log") for p in plan.processes
                 if p.role in _KV_LOG_ROLES) if run_dir is not None else ()
    if plan.runtime == "vllm-omni":
        return SmokeTarget(plan.entrypoint, model, plan.entrypoint.rstrip("/") + "/metrics",
                           None if decode_stage_id is None else str(decode_stage_id), chat=True, kv_logs=logs)
    decode = next((p for p in plan.processes if p.role == "decode"), None)
    whole = next((p for p in plan.processes if p.role == "pd"), None)  # E -> PD: no decode, no KV transfer
    metrics = decode.health.url.rsplit("/", 1)[0] + "/metrics" if decode and decode.health else None
    why = None
    if decode is None and whole is not None:
        why = f"E -> PD: {whole.name} runs prefill and decode itself, so no KV moves between instances"
    elif decode is None:
        why = "the plan has no decode process"
    elif metrics is None:
        why = f"{decode.name} has no health URL, so its /metrics is not known"
    ec_log, ec_consumer = None, "prefill" if whole is None else whole.name
    if getattr(plan, "ec_storage", None) and run_dir is not None:
        consumer = whole or next((p for p in plan.processes if p.role == "prefill"), None)
        ec_log = os.path.join(run_dir, consumer.name + ".log") if consumer else None
    return SmokeTarget(plan.entrypoint, model, metrics, ec_connector=getattr(plan, "ec_connector", None),
                       ec_storage=getattr(plan, "ec_storage", None), ec_log=ec_log, ec_consumer=ec_consumer,
                       not_checked=why, kv_logs=logs)


def tiny_png(width: int = 112, height: int = 112, seed: int | None = None) -> bytes:
    """A ``width`` x ``height`` RGB PNG (stdlib zlib): a gradient salted with ``seed`` so
    that each smoke run sends an image the encoder has not stored yet (a new mm_hash)."""
    seed = int.from_bytes(os.urandom(4), "big") if seed is None else seed
    rows = []
    for y in range(height):
        row = bytearray([0])
        for x in range(width):
            row += bytes(((x * 2 + seed) % 256, (y * 2 + (seed >> 8)) % 256, ((x + y) + (seed >> 16)) % 256))
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))


def stored_items(storage: str) -> set[str]:
    """mm_hashes with an encoder output in ECExampleConnector's directory
    (``<storage>/<mm_hash>/encoder_cache.safetensors``; the empty folders a consumer's
    lookup of a missing item creates do not count)."""
    try:
        names = os.listdir(storage)
    except OSError:
        return set()
    return {n for n in names if os.path.isfile(os.path.join(storage, n, "encoder_cache.safetensors"))}


@dataclass
class ECSmokeResult:
    """``new``: mm_hashes E stored during the request; ``loaded``: those the consumer's log
    says it loaded (None: its log has no DEBUG lines, so loads cannot be seen)."""

    text: str
    new: set[str]
    loaded: set[str] | None
    seconds: float


def ec_smoke(target: SmokeTarget, *, max_tokens: int = 4, timeout_s: float = 300.0,
             log_wait_s: float = 5.0) -> ECSmokeResult:
    """One greedy chat request with a fresh image through the entrypoint (so through the
    router's encoder leg), then what E stored and what the consumer logged.
    Source of the log text: vLLM 0.30.0 ec_connector/example_connector.py
    ``start_load_caches`` ("Success load encoder cache for hash %s", DEBUG)."""
    assert target.ec_storage is not None
    from omni_pd.compile import ec_connectors

    contract = ec_connectors.get(target.ec_connector or "")
    before = stored_items(target.ec_storage)
    image = "data:image/png;base64," + base64.b64encode(tiny_png()).decode()
    url = target.entrypoint.rstrip("/") + "/v1/chat/completions"
    t0 = time.monotonic()
    r = _post(url,
              {"model": target.model, "max_tokens": max_tokens, "temperature": 0,
               "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}},
                                                         {"type": "text", "text": "What is in the image?"}]}]},
              timeout_s)
    dt = time.monotonic() - t0
    text = answer_text(r, True, "POST " + url)
    new = stored_items(target.ec_storage) - before
    loaded: set[str] | None = None
    line = contract.load_log() if contract is not None else None
    if target.ec_log and line:
        deadline = time.monotonic() + log_wait_s  # the supervisor copies the engine's output with a lag
        while True:
            try:
                with open(target.ec_log, encoding="utf-8", errors="replace") as f:
                    log = f.read()
            except OSError:
                log = ""
            loaded = {h for h in new if f"{line} {h}" in log} if "DEBUG" in log else None
            if loaded is None or loaded == new or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    return ECSmokeResult(text=text, new=new, loaded=loaded, seconds=dt)


def ec_smoke_check(target: SmokeTarget, out: TextIO, report: dict[str, Any] | None = None) -> int:
    """:func:`ec_smoke` as a check: 0 when E stored the image's output and (where its DEBUG
    log shows loads) the consumer loaded it; 1 otherwise; one line either way.
    ``report``: filled with ``ok``, ``storage``, ``stored``/``loaded`` (mm_hashes; loaded
    None when not visible), ``answer_excerpt``, ``seconds``, ``error``, ``error_kind`` and
    ``message``. A server's failure is 1 (``error_kind: server``), an exception of omni-pd's
    own code :data:`EXIT_BUG` (see :func:`smoke_check`)."""
    rep: dict[str, Any] = report if report is not None else {}
    rep.update(ok=False, storage=target.ec_storage, log=target.ec_log, stored=None, loaded=None,
               answer_excerpt=None, seconds=None, error=None, error_kind=None, message=None)

    def say(msg: str, error: str | None = None) -> int:
        _say(out, rep, msg, error, None if error is None else "check")
        rep["ok"] = error is None
        return 0 if error is None else 1

    try:
        res = ec_smoke(target)
    except ServerError as e:
        _say(out, rep, f"smoke: image request failed: {e}", str(e), "server")
        return 1
    except Exception as e:
        return _bug(out, rep, e)
    rep.update(stored=sorted(res.new), loaded=None if res.loaded is None else sorted(res.loaded),
               answer_excerpt=_excerpt(res.text), seconds=round(res.seconds, 3))
    if not res.new:
        return say(f"smoke: FAILED: the image request answered {res.text!r} but the encoder stored nothing in "
                   f"{target.ec_storage}: the encoder leg did not run or E is not an ec_producer there",
                   "the encoder stored nothing")
    hashes = ", ".join(sorted(res.new))
    who = target.ec_consumer
    if res.loaded is None:
        return say(f"smoke: encoder ok in {res.seconds:.2f} s: E stored {hashes} in {target.ec_storage}; whether "
                   f"{who} loaded it is not visible without DEBUG logs (--env VLLM_LOGGING_LEVEL=DEBUG)")
    if res.loaded != res.new:
        return say(f"smoke: FAILED: E stored {hashes} but {who}'s log ({target.ec_log}) shows no load of "
                   f"{', '.join(sorted(res.new - res.loaded))}: it encoded the image itself",
                   f"{who} did not load the encoder's output")
    return say(f"smoke: encoder ok in {res.seconds:.2f} s: E stored {hashes} and {who} loaded it "
               f"({target.ec_log}); answer {res.text!r}")


class ServerError(Exception):
    """A server the smoke check asked failed: no answer, an HTTP error status, a reply that
    is not JSON or not the OpenAI reply shape. ``str()``: ``"<METHOD> <url>: <what>"``."""


#: what a server's failure raises on the way (``urllib.error.URLError``/``HTTPError`` and
#: timeouts are OSErrors; a connection dropped mid-reply an ``http.client.HTTPException``)
_TRANSPORT_ERRORS = (OSError, http.client.HTTPException)


def _get(url: str, timeout: float) -> str:
    """The body of ``GET url`` as text (bytes that are not UTF-8 replaced), no proxy.
    Raises :class:`ServerError`."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=timeout) as r:
            return r.read().decode("utf-8", "replace")
    except _TRANSPORT_ERRORS as e:
        raise ServerError(f"GET {url}: {type(e).__name__}: {e}") from e


def _post(url: str, body: dict, timeout: float) -> Any:
    """``POST url`` with the JSON ``body``, no proxy; the reply parsed as JSON (any JSON
    value: its shape is :func:`answer_text`'s to check). Raises :class:`ServerError`."""
    return _post_reply(url, body, timeout)[0]


def _post_reply(url: str, body: dict, timeout: float, headers: dict[str, str] | None = None) -> tuple[Any, Any]:
    """:func:`_post` with extra request ``headers``; ``(reply JSON, response headers)``."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with opener.open(req, timeout=timeout) as r:
            data = r.read()
            got = r.headers
    except urllib.error.HTTPError as e:  # the server's own words: vLLM's error message, or the router's
        raise ServerError(f"POST {url}: {type(e).__name__}: {e}{_error_body(e)}") from e
    except _TRANSPORT_ERRORS as e:
        raise ServerError(f"POST {url}: {type(e).__name__}: {e}") from e
    try:
        return json.loads(data), got
    except ValueError as e:  # JSONDecodeError, or bytes that are no Unicode
        raise ServerError(f"POST {url}: the reply is not JSON: {type(e).__name__}: {e}") from e


def _error_body(e: urllib.error.HTTPError) -> str:
    """``": <body>"`` of an HTTP error answer, whitespace collapsed, at most
    :data:`EXCERPT_CHARS` characters (``"..."`` after a cut); ``""`` when the body is empty
    or cannot be read. E.g. vLLM's 500 names the failure (``{"error": {"message": ...}}``)."""
    try:
        body = e.read()
    except (OSError, http.client.HTTPException):
        return ""
    text = " ".join(body.decode("utf-8", "replace").split())
    return f": {_excerpt(text)}" if text else ""


#: the JSON type name of a value ``json.loads`` returns
_JSON_KIND = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
              type(None): "null"}


def _not(where: str, value: Any, want: str) -> str:
    return f"{where} is a JSON {_JSON_KIND[type(value)]}, not {want}"


def answer_text(reply: Any, chat: bool, request: str) -> str:
    """The answer of an OpenAI-style reply: ``choices[0].message.content`` of a chat
    completion (``chat``), ``choices[0].text`` of a completion. Absent or null parts read
    as empty text (no choice, no content); parts of another JSON type raise
    :class:`ServerError` naming ``request`` (``"POST <url>"``) and the part. Pure."""
    def bad(what: str) -> ServerError:
        return ServerError(f"{request}: unexpected reply: {what}")

    if not isinstance(reply, dict):
        raise bad(_not("the reply", reply, "an object"))
    choices = reply.get("choices")
    if choices is None:
        return ""
    if not isinstance(choices, list):
        raise bad(_not("`choices`", choices, "an array"))
    if not choices:
        return ""
    first = choices[0]
    if not isinstance(first, dict):
        raise bad(_not("`choices[0]`", first, "an object"))
    if chat:
        where, msg = "`choices[0].message.content`", first.get("message")
        if msg is None:
            return ""
        if not isinstance(msg, dict):
            raise bad(_not("`choices[0].message`", msg, "an object"))
        text = msg.get("content")
    else:
        where, text = "`choices[0].text`", first.get("text")
    if text is None:
        return ""
    if not isinstance(text, str):
        raise bad(_not(where, text, "a string"))
    return text


@dataclass
class SmokeResult:
    """``text``: the completion; ``kv_before``/``kv_after``: :func:`kv_received` of
    decode's metrics; ``seconds``: request latency; ``counters_seen``: decode's counters
    were on the page (False only on a vllm-omni page without decode's stage)."""

    text: str
    kv_before: float
    kv_after: float
    seconds: float
    counters_seen: bool = True
    #: the ids the smoke request is known by (sent ``X-Request-Id``, the router's answer)
    request_ids: tuple[str, ...] = ()
    #: :data:`KV_LOG_PROBLEMS` lines about the smoke request / about other requests
    log_findings: tuple[KVLogFinding, ...] = ()
    other_log_findings: tuple[KVLogFinding, ...] = ()

    @property
    def kv_moved(self) -> bool:
        return self.kv_after > self.kv_before


def _request(target: SmokeTarget, max_tokens: int) -> tuple[str, dict]:
    """``(url, body)`` of the smoke request: a text-only chat request on a vllm-omni
    server (Qwen3-Omni refuses ``/v1/completions``), a completion otherwise. Pure."""
    base = target.entrypoint.rstrip("/")
    if target.chat:
        return base + "/v1/chat/completions", {
            "model": target.model, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens, "temperature": 0, "modalities": ["text"]}
    return base + "/v1/completions", {"model": target.model, "prompt": PROMPT, "max_tokens": max_tokens,
                                      "temperature": 0}


#: seconds the check waits, when the engines' logs show nothing about the smoke request,
#: for the supervisor to copy lines still in the pipes into ``<name>.log``
LOG_SETTLE_S = 1.0


def smoke(target: SmokeTarget, *, max_tokens: int = 8, timeout_s: float = 300.0,
          log_settle_s: float | None = None) -> SmokeResult:
    """One greedy request through ``target.entrypoint``, decode's KV counters around it,
    and the :data:`KV_LOG_PROBLEMS` lines the engines' logs (``target.kv_logs``) got
    about it meanwhile (read once more after ``log_settle_s`` seconds, default
    :data:`LOG_SETTLE_S`, when none were).

    Raises :class:`ServerError` when a server does not answer or answers out of the API."""
    marks = _log_marks(target.kv_logs)
    page = _get(target.metrics_url, 30) if target.metrics_url else ""
    before = kv_received(page, target.decode_stage)
    sent = f"omni-pd-smoke-{uuid.uuid4().hex}"
    t0 = time.monotonic()
    url, body = _request(target, max_tokens)
    reply, headers = _post_reply(url, body, timeout_s, {"X-Request-Id": sent})
    text = answer_text(reply, target.chat, "POST " + url)
    dt = time.monotonic() - t0
    page = _get(target.metrics_url, 30) if target.metrics_url else ""
    seen = target.decode_stage is None or has_stage_counters(page, target.decode_stage)
    echoed = headers.get("X-Request-Id") if headers is not None else None
    ids = (sent,) + ((echoed,) if echoed and echoed != sent else ())
    mine, other = _read_logs(marks, ids)
    settle = LOG_SETTLE_S if log_settle_s is None else log_settle_s
    if target.kv_logs and not mine and settle > 0:
        time.sleep(settle)
        mine, other = _read_logs(marks, ids)
    return SmokeResult(text=text, kv_before=before, kv_after=kv_received(page, target.decode_stage), seconds=dt,
                       counters_seen=seen, request_ids=ids, log_findings=tuple(mine),
                       other_log_findings=tuple(other))


#: characters of the prompt and of the answer kept in ``smoke.json``
EXCERPT_CHARS = 200


def _excerpt(text: str) -> str:
    return text if len(text) <= EXCERPT_CHARS else text[:EXCERPT_CHARS] + "..."


def _counter_names() -> list[str]:
    """:data:`KV_RECEIVED` as PromQL-style selectors, e.g.
    ``vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}``."""
    return [name + ("{" + ",".join(f'{k}="{v}"' for k, v in need.items()) + "}" if need else "")
            for name, need in KV_RECEIVED]


def smoke_report(target: SmokeTarget, runtime: str | None = None, max_tokens: int = 8) -> dict[str, Any]:
    """The skeleton of ``smoke.json`` before the request: ``ok`` False, the request (URL,
    model, max_tokens, prompt length in characters and its first :data:`EXCERPT_CHARS`
    characters) and what will be measured (decode's metrics URL and stage, the counter
    selectors; ``measured`` None when the runtime exposes no decode metrics, and
    ``not_checked`` then says why: ``{"kv_transfer": <why>}``).
    ``runtime``: the plan's runtime (default: ``vllm-omni`` for a chat target, else
    ``vllm``). Pure."""
    url, body = _request(target, max_tokens)
    return {
        "ok": False,
        "runtime": runtime or ("vllm-omni" if target.chat else "vllm"),
        "request": {"url": url, "model": target.model, "max_tokens": max_tokens,
                    "prompt_chars": len(PROMPT), "prompt_excerpt": _excerpt(PROMPT)},
        "answer_excerpt": None,
        "seconds": None,
        "measured": None if target.metrics_url is None else {
            "metrics_url": target.metrics_url, "decode_stage": target.decode_stage,
            "counters": _counter_names(), "counters_seen": None, "before": None, "after": None},
        "kv_log": None if not target.kv_logs else {
            "logs": list(target.kv_logs), "request_ids": None, "findings": None, "other_requests": None},
        "not_checked": ({} if target.metrics_url is not None else {
            "kv_transfer": target.not_checked or "no decode metrics URL"}) | ({} if target.kv_logs else {
                "kv_log": "the engines' logs are not known (no run directory), so expired or invalid KV of "
                          "the request is not looked for"}),
        "error": None,
        "error_kind": None,
        "message": None,
    }


def smoke_check(target: SmokeTarget, out: TextIO, *, report: str | os.PathLike[str] | None = None,
                runtime: str | None = None) -> int:
    """:func:`smoke` as a readiness callback: 0 when the KV moved (or cannot be measured:
    no decode metrics URL on the plain-vLLM runtime, said as "KV transfer not checked:
    <why>"), 1 when a server failed or decode recomputed, :data:`EXIT_BUG` when omni-pd's
    own code raised; prints one line either way (and one for the encoder leg of an
    E -> P -> D or E -> PD split, checked whether or not the KV transfer could be; E -> PD
    moves no KV, so its first line says the transfer was not checked and why).

    ``report``: also write the outcome as JSON there (``<run-dir>/smoke.json``, atomically;
    the fields of :func:`smoke_report` filled in: ``ok``, ``answer_excerpt``, ``seconds``
    (request latency), counter values ``before``/``after``, ``error`` (why it failed, None
    when ok), ``error_kind`` (``server``, ``check`` or ``omni-pd bug``), ``message`` (the
    printed line) and, for an encoder split, ``encoder``).
    A report that cannot be written is said on ``out`` and does not change the verdict."""
    rep = smoke_report(target, runtime)
    rc = _smoke_check(target, out, rep)
    if report is not None:
        from omni_pd.diagnostics import OmniPdError
        from omni_pd.io_write import atomic_write

        try:
            atomic_write(report, json.dumps(rep, indent=2) + "\n")
        except OmniPdError as e:
            out.write(f"smoke: could not write {report}: {e}\n")
    return rc


def _say(out: TextIO, rep: dict[str, Any], msg: str, error: str | None = None, kind: str | None = None) -> None:
    out.write(msg + "\n")
    rep["message"], rep["error"], rep["error_kind"] = msg, error, kind


def _bug(out: TextIO, rep: dict[str, Any], e: Exception) -> int:
    """An exception of omni-pd's own smoke code: said as omni-pd's bug with where it was
    raised (re-raised with ``OMNI_PD_DEBUG`` set), :data:`EXIT_BUG`."""
    if os.environ.get("OMNI_PD_DEBUG"):
        raise e
    frame = traceback.extract_tb(e.__traceback__)[-1]
    err = f"{type(e).__name__}: {e}"
    _say(out, rep, f"smoke: omni-pd bug: {err} (in {os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}; "
                   "a bug in omni-pd's smoke check, not a server failure: please report it, OMNI_PD_DEBUG=1 shows "
                   "the traceback)", err, "omni-pd bug")
    return EXIT_BUG


def _smoke_check(target: SmokeTarget, out: TextIO, rep: dict[str, Any]) -> int:
    try:
        return _kv_check(target, out, rep)
    except Exception as e:
        return _bug(out, rep, e)


def _kv_check(target: SmokeTarget, out: TextIO, rep: dict[str, Any]) -> int:
    try:
        res = smoke(target)
    except ServerError as e:
        _say(out, rep, f"smoke: request failed: {e}", str(e), "server")
        return 1
    rep["answer_excerpt"], rep["seconds"] = _excerpt(res.text), round(res.seconds, 3)
    if rep.get("kv_log") is not None:
        rep["kv_log"].update(request_ids=list(res.request_ids), findings=[f.to_json() for f in res.log_findings],
                             other_requests=[f.to_json() for f in res.other_log_findings])
    if res.log_findings:
        first = res.log_findings[0]
        kinds = sorted({f.problem.kind for f in res.log_findings})
        grew = (f" and decode's KV-received counters grew ({res.kv_before:g} -> {res.kv_after:g})"
                if target.metrics_url is not None and res.kv_moved else "")
        _say(out, rep, f"smoke: FAILED: the request answered {res.text!r} in {res.seconds:.2f} s{grew}, but "
                       f"{os.path.basename(first.log)} line {first.line_no} says of it: {first.line!r} "
                       f"({first.problem.meaning}; {len(res.log_findings)} such line"
                       f"{'s' if len(res.log_findings) != 1 else ''}). Give prefill's KV lease more time than "
                       "the platform takes to deliver a request to decode (NIXL: kv_connector_extra_config."
                       "kv_lease_duration, seconds; `omni-pd launch --platform cpu` sets one)",
             "vLLM flagged the smoke request's KV: " + ", ".join(kinds), "check")
        return 1
    if target.metrics_url is None:
        _say(out, rep, f"smoke: completion in {res.seconds:.2f} s: {res.text!r}; KV transfer not checked: "
                       f"{rep['not_checked']['kv_transfer']}")
        rep["ok"] = True
        return _ec_check(target, out, rep)
    rep["measured"].update(counters_seen=res.counters_seen, before=res.kv_before, after=res.kv_after)
    where = f"decode stage {target.decode_stage} on {target.metrics_url}" if target.decode_stage else target.metrics_url
    if not res.counters_seen:
        _say(out, rep, f"smoke: FAILED: decode answered {res.text!r} but {where} has no vllm:prompt_tokens_by_source "
                       "series, so whether it recomputed the prompt cannot be told (is --disable-log-stats set?)",
             "decode's counters are not on the metrics page", "check")
        return 1
    if not res.kv_moved:
        _say(out, rep, f"smoke: FAILED: decode answered {res.text!r} but its KV-received counters did not grow "
                       f"({res.kv_before:g} -> {res.kv_after:g}, {where}): it recomputed the prompt instead of "
                       "using prefill's KV",
             "decode's KV-received counters did not grow: it recomputed the prompt", "check")
        return 1
    _say(out, rep, f"smoke: ok in {res.seconds:.2f} s: {res.text!r}; decode received KV from prefill "
                   f"(counters {res.kv_before:g} -> {res.kv_after:g}, {where})")
    rep["ok"] = True
    return _ec_check(target, out, rep)


def _ec_check(target: SmokeTarget, out: TextIO, rep: dict[str, Any]) -> int:
    """After the KV check passed: the encoder leg's check when the target has one."""
    if not target.ec_storage:
        return 0
    rep["encoder"] = {}
    rc = ec_smoke_check(target, out, rep["encoder"])
    rep["ok"] = rc == 0
    if rc:
        rep["error"] = "encoder leg: " + str(rep["encoder"].get("error"))
        rep["error_kind"] = rep["encoder"].get("error_kind")
    return rc
