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
#: status ``omni-pd`` gives every internal error, see omni_pd/cli.py ``main``)
EXIT_BUG = 3
#: long enough that whole KV blocks move (CPU block size is 128 tokens)
PROMPT = " ".join(f"def f{i}(x): return x * {i}" for i in range(60))

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
    not_checked: str | None = None


def smoke_target(plan: Any, model: str, decode_stage_id: int | None, run_dir: str | None = None) -> SmokeTarget:
    """The :class:`SmokeTarget` of a :class:`~omni_pd.launch.spec.LaunchPlan`.

    ``decode_stage_id``: the decode stage of the compiled config (used on the vllm-omni
    runtime). ``run_dir``: where the supervisor writes ``<name>.log`` (the ec_consumer's
    log is read for the encoder split). Pure."""
    if plan.runtime == "vllm-omni":
        return SmokeTarget(plan.entrypoint, model, plan.entrypoint.rstrip("/") + "/metrics",
                           None if decode_stage_id is None else str(decode_stage_id), chat=True)
    decode = next((p for p in plan.processes if p.role == "decode"), None)
    metrics = decode.health.url.rsplit("/", 1)[0] + "/metrics" if decode and decode.health else None
    why = None
    if decode is None:
        why = "the plan has no decode process"
    elif metrics is None:
        why = f"{decode.name} has no health URL, so its /metrics is not known"
    ec_log = None
    if getattr(plan, "ec_storage", None) and run_dir is not None:
        consumer = next((p for p in plan.processes if p.role == "prefill"), None)
        ec_log = os.path.join(run_dir, consumer.name + ".log") if consumer else None
    return SmokeTarget(plan.entrypoint, model, metrics, ec_connector=getattr(plan, "ec_connector", None),
                       ec_storage=getattr(plan, "ec_storage", None), ec_log=ec_log, not_checked=why)


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
    if res.loaded is None:
        return say(f"smoke: encoder ok in {res.seconds:.2f} s: E stored {hashes} in {target.ec_storage}; whether "
                   "prefill loaded it is not visible without DEBUG logs (--env VLLM_LOGGING_LEVEL=DEBUG)")
    if res.loaded != res.new:
        return say(f"smoke: FAILED: E stored {hashes} but prefill's log ({target.ec_log}) shows no load of "
                   f"{', '.join(sorted(res.new - res.loaded))}: it encoded the image itself",
                   "prefill did not load the encoder's output")
    return say(f"smoke: encoder ok in {res.seconds:.2f} s: E stored {hashes} and prefill loaded it "
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
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with opener.open(req, timeout=timeout) as r:
            data = r.read()
    except urllib.error.HTTPError as e:  # the server's own words: vLLM's error message, or the router's
        raise ServerError(f"POST {url}: {type(e).__name__}: {e}{_error_body(e)}") from e
    except _TRANSPORT_ERRORS as e:
        raise ServerError(f"POST {url}: {type(e).__name__}: {e}") from e
    try:
        return json.loads(data)
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


def smoke(target: SmokeTarget, *, max_tokens: int = 8, timeout_s: float = 300.0) -> SmokeResult:
    """One greedy request through ``target.entrypoint`` and decode's KV counters around it.

    Raises :class:`ServerError` when a server does not answer or answers out of the API."""
    page = _get(target.metrics_url, 30) if target.metrics_url else ""
    before = kv_received(page, target.decode_stage)
    t0 = time.monotonic()
    url, body = _request(target, max_tokens)
    text = answer_text(_post(url, body, timeout_s), target.chat, "POST " + url)
    dt = time.monotonic() - t0
    page = _get(target.metrics_url, 30) if target.metrics_url else ""
    seen = target.decode_stage is None or has_stage_counters(page, target.decode_stage)
    return SmokeResult(text=text, kv_before=before, kv_after=kv_received(page, target.decode_stage), seconds=dt,
                       counters_seen=seen)


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
        "not_checked": {} if target.metrics_url is not None else {
            "kv_transfer": target.not_checked or "no decode metrics URL"},
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
    E -> P -> D split, checked whether or not the KV transfer could be).

    ``report``: also write the outcome as JSON there (``<run-dir>/smoke.json``, atomically;
    the fields of :func:`smoke_report` filled in: ``ok``, ``answer_excerpt``, ``seconds``
    (request latency), counter values ``before``/``after``, ``error`` (why it failed, None
    when ok), ``error_kind`` (``server``, ``check`` or ``omni-pd bug``), ``message`` (the
    printed line) and, for an encoder split, ``encoder``).
    A report that cannot be written is said on ``out`` and does not change the verdict."""
    rep = smoke_report(target, runtime)
    rc = _smoke_check(target, out, rep)
    if report is not None:
        from omni_pd.io import OmniPdError, atomic_write

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
