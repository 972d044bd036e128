"""Spoken answers stream under PD (issue 34): the tiny Qwen3-Omni on CPU, non-PD streaming vs PD streaming.

Runs where the e2e venv exists (``OMNI_PD_E2E_PYTHON``, ``.ci/e2e_venv.sh``). vllm-omni's own
Qwen3-Omni deploy streams (``async_chunk: true``): the Talker starts from the Thinker's first
tokens and Code2Wav sends audio chunks while the Thinker is still writing. Here, one pipeline
at a time (never two in memory):

1. **Without PD, streaming** (the reference): the CPU deploy of the preset's shape
   (tests/fixtures/qwen3_omni_moe_cpu.yaml) with ``async_chunk: true``, served by
   ``vllm serve MODEL --omni --deploy-config F``. Six streamed greedy chat requests (text,
   audio input, image input; short and longer than one KV block), 64-token answers, one at a
   time, then the six at once. The controls: every answer streams in several audio chunks, the
   six answers' audio differ (a random Code2Wav would hide a conditioning bug otherwise), and
   batching changes no byte.
2. **PD, streaming**: ``omni-pd expand --stream`` of the fixture (MooncakeConnector over tcp,
   expand's default; the README's rehearsal), which writes ``async_chunk: true`` and no prefill -> decode stage edge,
   started by ``omni-pd launch --platform cpu --smoke``. vllm-omni 0.30 refuses such a file by
   itself ("Native AR-to-DiT KV transfer requires async_chunk=False"); omni-pd's compatibility
   layer (the ``stream_*`` rows of presets/targets/vllm_omni_compat.yaml,
   omni_pd/upstream/stream_pd.py) accepts the pair and hands decode's first Talker chunk
   prefill's prompt rows. For each prompt, one at a time: the same text and prompt size, the same
   number of audio chunks and the same audio chunks byte for byte as the non-PD stream, and
   decode's counters (the server's ``/metrics``, series of decode's ``stage``) show every prompt
   token came from prefill (``external_kv_transfer`` = the prompt, ``local_compute`` 0). Then the
   six at once, each equal to its own reference.

Without the chunk-0 repair (``stream_chunk0``) the PD run streams the same text and chunk
count but other audio (the Talker's first chunk then holds decode's answer rows as prompt
rows): the first prototype run, whose repair did not fire, gave a different audio digest for
every prompt. Times (first text token, first audio chunk, whole answer) are printed with
``pytest -s`` and written to ``<tmp>/measurements.json``; the ratios are bench/omni_audio_pd.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e.harness import (Launcher, PlainInstance, alive, engine_env, get, port_free, post_json,
                         prompt_tokens_by_source, stream_chat)

from e2e.baselines import BLOCK, cases

ROOT = Path(__file__).resolve().parents[1]
E2E = os.environ.get("OMNI_PD_E2E_PYTHON")
pytestmark = pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)")

PLAIN, OMNI, BOOTSTRAP = 19830, 19840, 19580  # non-PD server, PD server, prefill's Mooncake bootstrap port
DEPLOY = ROOT / "tests" / "fixtures" / "qwen3_omni_moe_cpu.yaml"
DECODE_STAGE = "1"  # the decode stage's id in expand's output (the `stage` label of its series)
MAX_TOKENS = 64     # long enough for several audio chunks per answer (the deploy's codec chunk sizes)


def streaming_deploy(tmp: Path) -> Path:
    """The CPU fixture with ``async_chunk: true`` (vllm-omni's default, which the fixture turns
    off for the one-piece tests), written with ruamel.yaml's round trip."""
    from omni_pd.io import dump, load_file

    doc = load_file(DEPLOY)
    doc.tree["async_chunk"] = True
    out = tmp / "qwen3_omni_moe_cpu_stream.yaml"
    out.write_text(dump(doc.tree), encoding="utf-8")
    return out


def omni_env(tmp: Path) -> dict[str, str]:
    """:func:`engine_env` without ``VLLM_PLUGINS`` (vllm-omni needs its plugin groups)."""
    return {k: v for k, v in engine_env(tmp).items() if k != "VLLM_PLUGINS"}


def digest(chunks: list[str]) -> str:
    return hashlib.sha256("".join(chunks).encode()).hexdigest()[:16]


def summary(a: dict) -> dict:
    """An answer without its audio payload (printable)."""
    return {k: (round(v, 2) if isinstance(v, float) else v) for k, v in a.items() if k != "audio"} | (
        {"chunks": len(a["audio"]), "audio_sha": digest(a["audio"])} if "audio" in a else {})


def at_once(base: str, prompts: dict) -> dict[str, dict]:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = {n: pool.submit(stream_chat, base, c, max_tokens=MAX_TOKENS) for n, c in prompts.items()}
        return {n: f.result() for n, f in futures.items()}


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def health(base: str) -> int | str:
    """The HTTP status of ``GET base/health`` (or why there was none)."""
    import urllib.error

    try:
        get(base + "/health", timeout=5)
        return 200
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return type(e).__name__


def break_prefill_stage(launcher: Launcher, base: str, pages: Path, prompts: dict) -> dict:
    """SIGKILL stage 0's engine core (its process title, vllm-omni 0.30
    engine/stage_engine_core_proc.py: ``VLLM::StageEngineCoreProc_stage0_replica0_DP0``), then
    what an operator sees: ``/health``, one request, ``/metrics`` (kept as omni_cpu_broken.prom)
    and ``omni-pd status RUN_DIR``. Seconds: the server notices at once."""
    import urllib.error

    out: dict = {}
    (pid,) = [p for p in launcher.descendants() if "StageEngineCoreProc_stage0_" in cmdline(p)]
    out["killed"] = cmdline(pid).strip()
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    while health(base) == 200 and time.monotonic() - t0 < 30:
        time.sleep(0.2)
    out["health"], out["noticed_s"] = health(base), round(time.monotonic() - t0, 2)
    out["alive_after"] = [cmdline(p).strip() for p in launcher.descendants() if "StageEngineCoreProc" in cmdline(p)]
    body = {"model": "tiny", "messages": [{"role": "user", "content": next(iter(prompts.values()))}],
            "max_tokens": 8, "temperature": 0}
    t0 = time.monotonic()
    try:
        out["request"] = (200, post_json(base + "/v1/chat/completions", body, timeout=60))
    except urllib.error.HTTPError as e:
        out["request"] = (e.code, json.loads(e.read() or b"{}"))
    out["request_s"] = round(time.monotonic() - t0, 2)
    page = get(base + "/metrics")
    (pages / "omni_cpu_broken.prom").write_text(page)
    out["page"] = page
    for fmt, window in (("json", "0"), ("text", "1")):
        proc = subprocess.run([sys.executable, "-m", "omni_pd.cli", "status", str(launcher.run_dir), "--window", window,
                               "--format", fmt], capture_output=True, text=True, timeout=120)
        out[f"status_{fmt}"] = (proc.returncode, proc.stdout, proc.stderr)
    # the launcher's health monitor (every 2 s after readiness) reports the 503 and leaves the server running
    out["launcher_line"] = launcher.wait_for("omni unhealthy after readiness", 10)
    print(out["status_text"][1], "status page of the broken run:", pages / "omni_cpu_broken.prom")
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("e2e-omni-stream")
    model = tiny_model("qwen3_omni_full")
    vllm = str(Path(E2E).parent / "vllm")
    deploy = streaming_deploy(tmp)
    pd = tmp / "pd-stream.yaml"
    # the README's streaming rehearsal: --stream turns vllm-omni's default back on for the fixture
    subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q", str(DEPLOY), "--stream",
                    "--mooncake-protocol", "tcp", "--port-base", str(BOOTSTRAP), "-o", str(pd)], check=True)
    prompts = cases()
    m: dict = {"pd_file": pd.read_text()}

    # 1. non-PD streaming: the reference, then stopped before PD starts
    with PlainInstance(vllm, model, PLAIN, omni_env(tmp), tmp / "plain.log",
                       flags=("--omni", "--deploy-config", str(deploy)), ready_timeout=900) as plain:
        m["plain_ready_s"] = plain.healthy_s
        m["plain"] = {n: stream_chat(plain.url, c, max_tokens=MAX_TOKENS) for n, c in prompts.items()}
        m["plain_at_once"] = at_once(plain.url, prompts)

    # 2. PD streaming through omni-pd launch (validate, plan, start, smoke, serve)
    launcher = Launcher(pd, model, vllm, tmp / "run", router_port=OMNI, engine_port_base=19960,
                        env={**omni_env(tmp), "VLLM_HOST_IP": "127.0.0.1"}, extra=("--smoke",))
    t0 = time.monotonic()
    try:
        m["smoke"] = launcher.wait_for("smoke:", 900)
        m["pd_ready_s"] = round(time.monotonic() - t0, 1)
        base = f"http://127.0.0.1:{OMNI}"
        m["pd"], m["by_source"] = {}, {}
        for name, content in prompts.items():
            before = prompt_tokens_by_source(get(base + "/metrics"), DECODE_STAGE)
            m["pd"][name] = stream_chat(base, content, max_tokens=MAX_TOKENS)
            after = prompt_tokens_by_source(get(base + "/metrics"), DECODE_STAGE)
            m["by_source"][name] = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        m["pd_at_once"] = at_once(base, prompts)
        # issue 37: `omni-pd status RUN_DIR` on the running four-stage pipeline, as a user runs it; one
        # scrape (--window 0: totals since start), so its numbers are those of the page kept beside it
        # (tests/fixtures/status/omni_cpu_run.prom.gz, the README's block, is such a page)
        pages = Path(os.environ.get("OMNI_PD_STATUS_PAGES") or tmp / "status-pages")  # pytest's tmp rotates away
        pages.mkdir(parents=True, exist_ok=True)
        page = get(base + "/metrics")
        (pages / "omni_cpu_run.prom").write_text(page)
        m["status_tokens"] = prompt_tokens_by_source(page, DECODE_STAGE)
        for fmt in ("json", "text"):
            proc = subprocess.run([sys.executable, "-m", "omni_pd.cli", "status", str(tmp / "run"), "--window", "0",
                                   "--format", fmt], capture_output=True, text=True, timeout=120)
            m[f"status_{fmt}"] = (proc.returncode, proc.stdout, proc.stderr)
        print(m["status_text"][1], "status page of this run:", pages / "omni_cpu_run.prom")
        # the break, last: the prefill stage's engine core (vllm-omni's StageEngineCoreProc of stage 0, a
        # child of the server) is killed as the OOM killer would; the server stays up, so status runs again
        m["broken"] = break_prefill_stage(launcher, base, pages, prompts)
    finally:
        launcher.proc.send_signal(signal.SIGINT)
        try:
            m["rc"] = launcher.proc.wait(120)
        except subprocess.TimeoutExpired:
            launcher.proc.kill()
            m["rc"] = launcher.proc.wait()
        log = tmp / "run" / "omni.log"
        m["log"] = log.read_text(errors="replace") if log.is_file() else "\n".join(launcher.lines)
    time.sleep(1)
    m["left"] = [p for p in launcher.descendants() if alive(p)] if (tmp / "run" / "pids").is_file() else []
    m["ports_free"] = all(port_free(p) for p in (OMNI, BOOTSTRAP))
    m["launcher"] = launcher
    rep = {k: ({n: summary(a) for n, a in v.items()} if k in ("plain", "pd", "plain_at_once", "pd_at_once") else v)
           for k, v in m.items() if k not in ("log", "launcher", "pd_file", "status_json", "status_text", "broken")}
    if "broken" in m:
        rep["broken"] = {k: v for k, v in m["broken"].items() if k not in ("page", "status_text")}
    rep["first_audio_ratio_median"] = statistics.median(
        m["pd"][n]["first_audio_s"] / m["plain"][n]["first_audio_s"] for n in prompts
        if m["pd"][n].get("first_audio_s") and m["plain"][n].get("first_audio_s")) if all(
        "error" not in m["pd"][n] for n in prompts) else None
    (tmp / "measurements.json").write_text(json.dumps(rep, indent=1, default=str))
    print(f"\nmeasurements ({tmp / 'measurements.json'}):\n{json.dumps(rep, indent=1, default=str)}")
    return m


def test_expand_keeps_streaming_and_writes_no_stage_edge_into_decode(runs):
    text = runs["pd_file"]
    assert "\nasync_chunk: true\n" in text
    assert "  - {from: 0, to: 1}\n" not in text and "  - {from: 1, to: 2}\n" in text


def test_without_pd_every_answer_streams_in_several_chunks_and_its_own_audio(runs):
    plain = runs["plain"]
    assert all("error" not in a for a in plain.values()), {n: a.get("error") for n, a in plain.items()}
    for name, a in plain.items():
        assert a["text"] and len(a["audio"]) >= 2, (name, summary(a))
        assert (a["prompt_tokens"] > BLOCK) == name.endswith("-long"), (name, a["prompt_tokens"])
    assert len({digest(a["audio"]) for a in plain.values()}) == len(plain)  # the control
    for name, a in runs["plain_at_once"].items():  # batching changes no byte
        assert (a["text"], a["audio"]) == (plain[name]["text"], plain[name]["audio"]), name


def test_pd_streams_each_prompt_the_non_pd_stream_byte_for_byte(runs):
    assert "smoke: ok" in runs["smoke"], runs["launcher"].report()
    log = runs["log"]
    assert "PD disaggregation detected" in log
    assert "async_chunk kept on for the prefill/decode pair" in log
    assert "decode's first Talker chunk holds prefill's prompt rows" in log
    for name, got in runs["pd"].items():
        ref = runs["plain"][name]
        assert "error" not in got, (name, got["error"])
        assert (got["text"], got["prompt_tokens"]) == (ref["text"], ref["prompt_tokens"]), name
        assert len(got["audio"]) == len(ref["audio"]), (name, summary(got), summary(ref))
        assert got["audio"] == ref["audio"], (name, summary(got), summary(ref))
        # decode computed no prompt token: all of them came over the KV connector
        delta = runs["by_source"][name]
        assert delta.get("external_kv_transfer", 0) == got["prompt_tokens"], (name, delta)
        assert delta.get("local_compute", 0) == 0, (name, delta)


def test_pd_concurrent_streams_each_equal_their_own_reference(runs):
    for name, got in runs["pd_at_once"].items():
        ref = runs["plain"][name]
        assert "error" not in got, (name, got["error"])
        assert (got["text"], got["audio"]) == (ref["text"], ref["audio"]), (name, summary(got), summary(ref))


def test_status_on_the_running_pipeline_says_pd_working_with_decodes_own_share(runs):
    """``omni-pd status RUN_DIR`` (the launch's plan.json: the vllm-omni runtime, its PD stages 0 and
    1 read from the compiled config) on the live server: PD working since start, with the share
    decode's own counters give (the stage-1 series of the page scraped just before), and the table
    says the same; every instance answers."""
    rc, out, err = runs["status_json"]
    assert out.startswith("{"), out[-2000:] + err[-2000:]
    rep = json.loads(out)
    tokens = runs["status_tokens"]
    ext, loc = tokens["external_kv_transfer"], tokens.get("local_compute", 0.0)
    (pair,) = rep["pairs"]
    assert (rc, rep["runtime"], pair["verdict"], pair["basis"]) == (0, "vllm-omni", "PD working", "since start"), rep
    assert pair["share"] == ext / (ext + loc) and ext > 0, (pair, tokens)
    assert all(i["up"] for i in rep["instances"]), rep["instances"]
    rc, out, err = runs["status_text"]
    assert rc == 0 and f"PD working ({100 * pair['share']:.1f}% of decode's prompt tokens from prefill)" in out, out


def test_killing_the_prefill_stage_is_instance_down_and_status_says_which_stage(runs):
    """The break (after everything above): stage 0's engine core SIGKILLed. vllm-omni 0.30 keeps
    the server: it evicts the replica (log: "[Orchestrator] Stage-0 replica-0 is dead; evicting
    it"), ``/health`` answers 503, a request fails at once with "Stage-0 has no live replica"
    (HTTP 500), and ``/metrics`` still answers with stage 0's last values. ``omni-pd status``
    says instance down for prefill (stage 0), from the server's log, keeps decode (stage 1) up,
    and exits 1: the server answered (not 2, "nothing reachable")."""
    b = runs["broken"]
    assert "StageEngineCoreProc_stage0_replica0" in b["killed"], b["killed"]
    assert b["health"] == 503 and b["noticed_s"] < 10, b
    assert not any("_stage0_" in p for p in b["alive_after"]) and any("_stage1_" in p for p in b["alive_after"]), b
    code, answer = b["request"]
    assert (code, answer["error"]["message"]) == (500, "Stage-0 has no live replica"), b["request"]
    assert b["request_s"] < 10, b
    assert 'vllm:prompt_tokens_by_source_total{' in b["page"] and 'stage="0"' in b["page"]
    assert "Stage-0 replica-0 is dead; evicting it" in runs["log"]
    rc, out, err = b["status_json"]
    assert out.startswith("{"), out[-2000:] + err[-2000:]
    rep = json.loads(out)
    (pair,) = rep["pairs"]
    assert (rc, rep["exit"], pair["verdict"]) == (1, 1, "instance down"), rep
    up = {i["name"]: (i["up"], i["health"]) for i in rep["instances"]}
    assert up == {"prefill (stage 0)": (False, 503), "decode (stage 1)": (True, 503)}, rep["instances"]
    assert pair["evidence"] == [
        "prefill (stage 0) (http://127.0.0.1:19840) down: stage 0's engine died: its log says '[Orchestrator] "
        "Stage-0 replica-0 is dead; evicting it and failing its in-flight requests'; the server's /health answers "
        "HTTP 503 and every request through stage 0 fails"], pair
    rc, out, err = b["status_text"]
    assert rc == 1 and "instance down" in out and "no instance answered" not in err, out + err
    assert b["launcher_line"].endswith(f"omni unhealthy after readiness (GET http://127.0.0.1:{OMNI}/health: HTTP 503); "
                                       "left running, nothing routes around it (`omni-pd status RUN_DIR` says why; "
                                       "--fail-fast stops all)"), b["launcher_line"]


def test_teardown_leaves_no_process_or_port(runs):
    assert runs["rc"] == 130, runs["launcher"].report()
    assert runs["left"] == []
    assert runs["ports_free"]
