"""Encoder disaggregation on CPU (issue 12): a real Qwen3-Omni Thinker as E -> P -> D.

Runs where the e2e venv exists (``OMNI_PD_E2E_PYTHON``, ``.ci/e2e_venv.sh``). The tiny
random-weight Qwen3-Omni checkpoint (tests/e2e/make_tiny_qwen3_omni.py, shared fixture)
is served three ways by plain ``vllm serve`` (vLLM maps the architecture to its Thinker):

1. one plain instance answers greedy chat requests with an image (PNG ``image_url``) and
   an audio clip (WAV ``input_audio``), plus a second image kept for the negative
   control; it is stopped (at most three engines ever run at once);
2. ``omni-pd expand --encoder-split 1e1p1d`` (ECExampleConnector on a shared directory,
   NixlConnector with ``kv_buffer_device: cpu`` between P and D) and ``omni-pd launch
   --smoke`` start E, P, D and the router; the smoke check itself must print that E
   stored an item and P loaded it;
3. the image and audio requests through the router give the plain instance's text and
   prompt size; E stored ``<dir>/<mm_hash>/encoder_cache.safetensors`` for each item;
   P's DEBUG log says ``Success load encoder cache for hash <mm_hash>`` for each (vLLM
   0.30 ec_connector/example_connector.py); decode counts the prompt as
   ``external_kv_transfer`` (KV from P);
4. negative control: the second image is encoded by E alone, its stored tensors are
   overwritten with random values, and the full request sent to P directly (no E leg
   that could store it again) gives a different answer than the plain instance's, so P
   reads E's output rather than encoding itself;
5. after SIGINT no process or port is left;
6. E -> PD (``--encoder-split 1e1pd``, its own test): E and one instance ``pd-0``
   (ec_consumer, no KV connector) behind the router's ``--instance`` mode; the image and
   audio answers equal the plain ones, E stored each item and pd-0 logged loading it.

Measurements (time to healthy per engine, per-leg latencies, RSS) are printed (``-s``)
and written to ``<tmp>/measurements.json``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e.baselines import chat, png_data_url, thinker_chats
from e2e.harness import (Launcher, alive, descendants, engine_env, get, port_free, post_json,
                         prompt_tokens_by_source, rss_bytes, wait_for_line)

ROOT = Path(__file__).resolve().parents[1]
E2E = os.environ.get("OMNI_PD_E2E_PYTHON")
pytestmark = pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)")

ROUTER, ENGINES, SIDE = 19600, 19700, 19950  # P 19700, D 19800, E 19900
DEPLOY = ROOT / "tests" / "fixtures" / "qwen3_omni_moe_thinker_only_cpu.yaml"
LOAD_LINE = "Success load encoder cache for hash"

TAMPER = """
import sys, torch
from safetensors.torch import load_file, save_file
path = sys.argv[1]
t = load_file(path)
g = torch.Generator().manual_seed(0)
save_file({k: (torch.randn(v.shape, generator=g) * 3).to(v.dtype) if v.is_floating_point() else v
           for k, v in t.items()}, path)
print(sorted((k, tuple(v.shape)) for k, v in t.items()))
"""


def _content() -> dict[str, list[dict]]:
    """The three chats this module compares (tests/e2e/baselines.py :func:`thinker_chats`)."""
    c = thinker_chats()
    return {"image": c["image-short"], "audio": c["audio-short"], "tamper": c["image-tall"]}


def stored(ec: Path) -> set[str]:
    return {p.parent.name for p in ec.glob("*/encoder_cache.safetensors")}


def expand_split(tmp: Path, layout: str, ec: Path, *flags: str) -> Path:
    """``omni-pd expand DEPLOY --encoder-split LAYOUT`` with E's outputs in ``ec``: the compiled file."""
    out = tmp / f"{layout}.yaml"
    subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q", str(DEPLOY), "--encoder-split", layout,
                    *flags, "--ec-storage-path", str(ec), "-o", str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("e2e-encoder")
    model = tiny_model("qwen3_omni")
    ec = tmp / "ec"
    epd = expand_split(tmp, "1e1p1d", ec, "--connector", "NixlConnector", "--kv-buffer-device", "cpu",
                       "--port-base", str(SIDE))
    return tmp, model, epd, ec, str(Path(E2E).parent / "vllm")


def test_qwen3_omni_thinker_e_p_d_on_cpu_equals_a_plain_instance_and_uses_the_encoder(setup, plain_thinker):
    tmp, model, epd, ec, vllm = setup
    prompts = _content()
    m: dict = {"plain": {"healthy_s": plain_thinker.healthy_s, "rss_gib": plain_thinker.rss_gib}, "epd": {}}

    # 1. the plain instance's answers (the session's one plain run, stopped before E, P and D start)
    want = {name: plain_thinker.chat(c) for name, c in prompts.items()}
    assert len({text for text, _ in want.values()}) == len(want), want  # answers tell the inputs apart

    # 2. E + P + D (+ router) through omni-pd launch, with the smoke check
    launcher = Launcher(epd, model, vllm, tmp / "run", router_port=ROUTER, engine_port_base=ENGINES,
                        env={**engine_env(tmp), "VLLM_LOGGING_LEVEL": "DEBUG"}, extra=("--smoke",))
    p_url, d_metrics, e_url = (f"http://127.0.0.1:{ENGINES}", f"http://127.0.0.1:{ENGINES + 100}/metrics",
                               f"http://127.0.0.1:{ENGINES + 200}")
    p_log = tmp / "run" / "prefill-0.log"
    try:
        m["epd"]["smoke_kv"] = launcher.wait_for("smoke: ok", 900)
        m["epd"]["smoke_ec"] = launcher.wait_for("smoke: encoder ok", 300)
        assert "and prefill loaded it" in m["epd"]["smoke_ec"], m["epd"]["smoke_ec"]
        m["epd"]["healthy"] = [line for line in launcher.lines if "healthy after" in line]
        tree = launcher.descendants()

        # 3. image and audio through the router: the plain answers, E's output loaded by P
        m["epd"]["latency_s"], m["epd"]["loaded"] = {}, {}
        for name in ("image", "audio"):
            before_items = stored(ec)
            before = prompt_tokens_by_source(get(d_metrics))
            got = chat(f"http://127.0.0.1:{ROUTER}", prompts[name])
            after = prompt_tokens_by_source(get(d_metrics))
            new = stored(ec) - before_items
            m["epd"]["latency_s"][name] = round(got[2], 3)
            assert got[:2] == want[name], (name, got, want[name])
            assert len(new) == 1, (name, new)
            [h] = new
            assert wait_for_line(p_log, f"{LOAD_LINE} {h}"), (name, h)
            m["epd"]["loaded"][name] = h
            assert after.get("external_kv_transfer", 0) - before.get("external_kv_transfer", 0) > 0, (name, after)

        # per leg: E alone, P alone (it loads E's stored output), for the encoder split's saving
        item = {"model": "tiny", "max_tokens": 1, "temperature": 0,
                "messages": [{"role": "user", "content": [prompts["tamper"][0]]}]}
        before_items = stored(ec)
        t0 = time.monotonic()
        post_json(e_url + "/v1/chat/completions", item)
        m["epd"]["e_leg_s"] = round(time.monotonic() - t0, 3)
        [h] = stored(ec) - before_items

        # what the split moves off the prefill path (measured, not asserted): P's one-token
        # prefill of a fresh image whose encoder output E stored vs one P must encode itself
        fresh = [{"type": "image_url", "image_url": {"url": png_data_url(128 + 32 * k, 128)}} for k in range(6)]
        one = {"model": "tiny", "max_tokens": 1, "temperature": 0}
        legs: dict[str, list[float]] = {"with_e": [], "itself": []}
        for k in range(0, 6, 2):  # alternating pairs, median of three
            post_json(e_url + "/v1/chat/completions", {**item, "messages": [{"role": "user", "content": [fresh[k]]}]})
            for key, img in (("with_e", fresh[k]), ("itself", fresh[k + 1])):
                t0 = time.monotonic()
                post_json(p_url + "/v1/chat/completions", {**one, "messages": [{"role": "user", "content": [img]}]})
                legs[key].append(time.monotonic() - t0)
        m["epd"]["p_prefill_with_e_s"] = round(sorted(legs["with_e"])[1], 3)
        m["epd"]["p_prefill_encoding_itself_s"] = round(sorted(legs["itself"])[1], 3)

        # 4. negative control: tamper E's output of the second image, then P alone must differ
        shapes = subprocess.run([E2E, "-c", TAMPER, str(ec / h / "encoder_cache.safetensors")], check=True,
                                capture_output=True, text=True).stdout.strip()
        m["epd"]["tampered"] = {h: shapes}
        got = chat(p_url, prompts["tamper"])
        m["epd"]["tamper_answer"] = got[0]
        assert got[1] == want["tamper"][1]  # same prompt (placeholders from the processor) ...
        assert got[0] != want["tamper"][0], (got, want["tamper"])  # ... but P used the tampered encoder output
        assert wait_for_line(p_log, f"{LOAD_LINE} {h}")
        pids = launcher.pids()
        m["epd"]["rss_gib"] = {n: round(rss_bytes(descendants({p})) / 2**30, 2) for n, p in pids.items()}
        m["epd"]["rss_total_gib"] = round(sum(m["epd"]["rss_gib"].values()), 2)
    finally:
        launcher.proc.send_signal(signal.SIGINT)
        rc = launcher.proc.wait(120)
        (tmp / "measurements.json").write_text(json.dumps(m, indent=1, default=str))
        print(f"\nmeasurements ({tmp / 'measurements.json'}):\n{json.dumps(m, indent=1, default=str)}")
    assert rc == 130, launcher.report()
    time.sleep(1)
    assert [p for p in tree if alive(p)] == []
    assert all(port_free(p) for p in (ROUTER, ENGINES, ENGINES + 100, ENGINES + 200, SIDE, SIDE + 1))


# --- E -> PD (1e1pd): the encoder and one instance that runs prefill and decode ------------------

E_PD_ROUTER, E_PD_ENGINES = 19610, 19710  # the instance pd-0 19710, E 19910


def test_qwen3_omni_thinker_1e1pd_on_cpu_equals_a_plain_instance_and_uses_the_encoder(setup, plain_thinker):
    """``expand --encoder-split 1e1pd`` + ``launch --smoke``: E (ec_producer), the instance
    pd-0 (ec_consumer, no KV connector) and the router (``--instance``). The smoke check
    says no KV is checked (none moves) and that E stored an item and pd-0 loaded it; the
    module's image and audio requests through the router give the plain instance's text
    and prompt size, each with an item E stored and pd-0's DEBUG load line for it
    (``Success load encoder cache for hash <mm_hash>``); after SIGINT nothing is left."""
    tmp, model, _, _, vllm = setup
    ec = tmp / "ec-1e1pd"
    cfg = expand_split(tmp, "1e1pd", ec)
    prompts = {k: v for k, v in _content().items() if k in ("image", "audio")}
    want = {name: plain_thinker.chat(c) for name, c in prompts.items()}
    m: dict = {"e_pd": {}}
    t0 = time.monotonic()
    launcher = Launcher(cfg, model, vllm, tmp / "run-1e1pd", router_port=E_PD_ROUTER, engine_port_base=E_PD_ENGINES,
                        env={**engine_env(tmp), "VLLM_LOGGING_LEVEL": "DEBUG"}, extra=("--smoke",))
    pd_log = tmp / "run-1e1pd" / "pd-0.log"
    try:
        m["e_pd"]["smoke"] = launcher.wait_for("smoke: completion", 900)
        assert ("KV transfer not checked: E -> PD: pd-0 runs prefill and decode itself, so no KV moves between "
                "instances") in m["e_pd"]["smoke"], m["e_pd"]["smoke"]
        m["e_pd"]["smoke_ec"] = launcher.wait_for("smoke: encoder ok", 300)
        assert "and pd-0 loaded it" in m["e_pd"]["smoke_ec"], m["e_pd"]["smoke_ec"]
        m["e_pd"]["ready_s"] = round(time.monotonic() - t0, 1)
        m["e_pd"]["healthy"] = [line for line in launcher.lines if "healthy after" in line]
        assert sorted(launcher.pids()) == ["encoder-0", "pd-0", "router"]
        tree = launcher.descendants()
        m["e_pd"]["latency_s"], m["e_pd"]["loaded"] = {}, {}
        for name, content in prompts.items():
            before = stored(ec)
            got = chat(f"http://127.0.0.1:{E_PD_ROUTER}", content)
            new = stored(ec) - before
            m["e_pd"]["latency_s"][name] = round(got[2], 3)
            assert got[:2] == want[name], (name, got, want[name])
            assert len(new) == 1, (name, new)
            [h] = new
            assert wait_for_line(pd_log, f"{LOAD_LINE} {h}"), (name, h)
            m["e_pd"]["loaded"][name] = h
        pids = launcher.pids()
        m["e_pd"]["rss_gib"] = {n: round(rss_bytes(descendants({p})) / 2**30, 2) for n, p in pids.items()}
    finally:
        launcher.proc.send_signal(signal.SIGINT)
        rc = launcher.proc.wait(120)
        m["e_pd"]["wall_s"] = round(time.monotonic() - t0, 1)
        print(f"\nmeasurements (E -> PD):\n{json.dumps(m, indent=1, default=str)}")
    assert rc == 130, launcher.report()
    time.sleep(1)
    assert [p for p in tree if alive(p)] == []
    assert all(port_free(p) for p in (E_PD_ROUTER, E_PD_ENGINES, E_PD_ENGINES + 200))
