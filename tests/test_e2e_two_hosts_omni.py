"""The whole Qwen3-Omni PD pipeline on two (simulated) hosts: the head on A, headless stages on B (issue 25).

Two Linux network namespaces stand for hosts A and B, joined by a veth pair whose two
addresses form a private /30 that exists only between them (the netns harness of
tests/test_e2e_two_hosts.py: no route to anything else, no loopback shared). The tiny
random-weight Qwen3-Omni model (tests/e2e/make_tiny_qwen3_omni_full.py: Thinker, Talker,
Code2Wav) and its CPU deploy file (tests/fixtures/qwen3_omni_moe_cpu.yaml) are compiled once,
``expand --inventory``, into the four-stage PD pipeline over MooncakeConnector (TCP) with
prefill on A and decode, Talker and Code2Wav on B (``kv_ip`` per host; the stage edges after
decode stay on B, so SharedMemoryConnector carries them).

``omni-pd launch --inventory hosts.yaml --host A`` starts vllm-omni's head in A (API
server, orchestrator, the prefill stage; ``--stage-id 0 --omni-master-address A``);
``--host B`` starts one headless process per stage in B (``--stage-id N --headless
--omni-master-address A --omni-replica-address B``) and waits for the head's /health.
One greedy chat request with text and audio, sent inside A: its text, prompt size and WAV
equal byte for byte the answer of the same request to the one-host pipeline without PD
(``vllm serve --omni`` of the fixture, started and stopped first: never two pipelines in
memory), the head logs ``PD disaggregation detected``, and decode's counters (the head's
/metrics, series of ``stage`` 1) show the prompt's tokens came from prefill on the other
host (``external_kv_transfer``). Why the waveform can be compared byte for byte:
tests/test_e2e_omni_audio_pd.py. Time to ready of both hosts is printed (``pytest -s``).

Needs the e2e venv (``OMNI_PD_E2E_PYTHON``) and network namespaces (root, ``ip netns``);
the namespaces are removed in a fixture finalizer, also after a failure.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e.baselines import cases
from e2e.harness import Launcher, PlainInstance, engine_env, post_json, prompt_tokens_by_source
from e2e.netns import netns_works, two_hosts, veth

ROOT = Path(__file__).resolve().parents[1]
E2E = os.environ.get("OMNI_PD_E2E_PYTHON")
DEPLOY = ROOT / "tests" / "fixtures" / "qwen3_omni_moe_cpu.yaml"


pytestmark = [
    pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)"),
    pytest.mark.skipif(not netns_works(), reason="needs root and `ip netns` (iproute2)"),
]

#: the /30 between the namespaces (RFC 1918; it exists only on the veth pair)
NET = "10.203.0"
ADDR = {"A": f"{NET}.1", "B": f"{NET}.2"}
#: the one-host reference (main namespace, loopback), the head's API port, launch's
#: --engine-port-base (the head's registration port is + 300), expand's --port-base (Mooncake bootstrap)
PLAIN, HTTP, ENGINES, BOOTSTRAP = 19480, 19490, 19100, 19460
HOSTS_YAML = f"hosts:\n  A: {{address: {ADDR['A']}, count: 2}}\n  B: {{address: {ADDR['B']}, count: 2}}\n"
#: the one request: longer than one CPU KV block (whole blocks cross the hosts)
PROMPT = "text-long"
DECODE_STAGE = "1"


@pytest.fixture(scope="module")
def hosts():
    """``{"A": netns name, "B": netns name}``: two namespaces joined by a veth pair, each
    with loopback up and its address of :data:`NET`/30; removed afterwards whatever happened."""
    with two_hosts(f"opdo{os.getpid() % 10000}", ADDR) as ns:
        yield ns


def _body() -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": cases()[PROMPT]}], "max_tokens": 16,
            "temperature": 0, "ignore_eos": True, "modalities": ["text", "audio"]}


def _answer(reply: dict) -> dict:
    """``{"text", "prompt_tokens", "wav_sha256", "wav_bytes"}`` of a chat reply."""
    text = next((c["message"].get("content") for c in reply["choices"] if c["message"].get("content")), None)
    data = next((c["message"]["audio"]["data"] for c in reply["choices"] if c["message"].get("audio")), None)
    wav = base64.b64decode(data) if data else b""
    return {"text": text, "prompt_tokens": reply["usage"]["prompt_tokens"],
            "wav_sha256": hashlib.sha256(wav).hexdigest(), "wav_bytes": len(wav)}


#: runs inside namespace A (stdlib only): metrics, the request, metrics again
_CLIENT = r'''
import json, sys, time, urllib.request as u
op = u.build_opener(u.ProxyHandler({}))
base, body = sys.argv[1], sys.argv[2]
def get(url):
    with op.open(url, timeout=30) as r: return r.read().decode()
before = get(base + "/metrics")
t0 = time.monotonic()
req = u.Request(base + "/v1/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"})
with op.open(req, timeout=600) as r: reply = json.loads(r.read())
print(json.dumps({"reply": reply, "seconds": round(time.monotonic() - t0, 2), "before": before,
                  "after": get(base + "/metrics")}))
'''


def _two_host_run(setup: dict, hosts: dict[str, str], name: str, placement: str, nixl_edges: bool = False) -> dict:
    """Expand the fixture for ``placement`` (the inventory's ``placement:`` flow map), start
    ``launch --host A`` in namespace A and ``--host B`` in B, send the one request inside
    A, stop both; the answer, decode's counter deltas, exit codes, logs and pids.
    ``nixl_edges``: the placement puts a stage edge across the hosts (UCX restricted to TCP
    on each host's own end of the veth pair, as tests/test_e2e_two_hosts.py runs NIXL)."""
    model, vllm, omni_env = setup["model"], setup["vllm"], setup["omni_env"]
    run = setup["tmp"] / name
    run.mkdir()
    inv, pd = run / "hosts.yaml", run / "pd.yaml"
    inv.write_text(f"{HOSTS_YAML}placement: {placement}\n")
    subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q", str(DEPLOY), "--mooncake-protocol", "tcp",
                    "--port-base", str(BOOTSTRAP), "--inventory", str(inv), "-o", str(pd)], check=True)
    # VLLM_HOST_IP: the address vLLM's Mooncake worker gives its Transfer Engine (get_ip()), its host's own
    env = {h: {**omni_env, "VLLM_HOST_IP": ADDR[h]} for h in ("A", "B")}
    if nixl_edges:
        env = {h: {**e, "UCX_TLS": "tcp", "UCX_NET_DEVICES": veth(hosts[h])} for h, e in env.items()}
    launchers = {h: Launcher(pd, model, vllm, run / f"run{h}", router_port=HTTP, engine_port_base=ENGINES, env=env[h],
                             extra=("--inventory", str(inv), "--host", h, "--ready-timeout", "1200"),
                             prefix=("ip", "netns", "exec", hosts[h]))
                 for h in ("A", "B")}
    out: dict = {"pd": pd.read_text()}
    t0 = time.monotonic()
    try:
        launchers["A"].wait_for("process healthy after", 1200)
        launchers["B"].wait_for("processes healthy after", 600)
        out["ready_s"] = round(time.monotonic() - t0, 1)
        r = subprocess.run(["ip", "netns", "exec", hosts["A"], sys.executable, "-c", _CLIENT,
                            f"http://{ADDR['A']}:{HTTP}", json.dumps(_body())], capture_output=True, text=True,
                           timeout=900)
        assert r.returncode == 0, r.stderr[-3000:] + launchers["A"].report()
        got = json.loads(r.stdout)
        before, after = (prompt_tokens_by_source(got[k], DECODE_STAGE) for k in ("before", "after"))
        out["answer"] = {**_answer(got["reply"]), "seconds": got["seconds"],
                         "by_source_delta": {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}}
    finally:
        out["rc"] = {h: launchers[h].stop() for h in ("B", "A")}
        out["logs"] = {p.name: p.read_text(errors="replace")
                       for h in ("A", "B") for p in (run / f"run{h}").glob("*.log")}
        out["lines"] = {h: launchers[h].lines for h in ("A", "B")}
        out["pids"] = {h: [ln.split()[1] for ln in (run / f"run{h}" / "pids").read_text().splitlines()]
                       if (run / f"run{h}" / "pids").is_file() else [] for h in ("A", "B")}
    shown = {k: v for k, v in out.items() if k not in ("logs", "lines", "pd")}
    print(f"\ntwo-host omni pipeline, {name} ({run}): {json.dumps(shown, indent=1)}")
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model, hosts):
    """The one-host reference answer (started and stopped first) and what a two-host run needs."""
    tmp = tmp_path_factory.mktemp("e2e-omni-two-hosts")
    model = tiny_model("qwen3_omni_full")
    vllm = str(Path(E2E).parent / "vllm")
    omni_env = {k: v for k, v in engine_env(tmp).items() if k != "VLLM_PLUGINS"}  # vllm-omni needs its plugins
    flags = ("--omni", "--deploy-config", str(DEPLOY))
    with PlainInstance(vllm, model, PLAIN, omni_env, tmp / "plain.log", flags=flags, ready_timeout=900) as plain:
        answer = _answer(post_json(plain.url + "/v1/chat/completions", _body(), timeout=300))
        ready_s = plain.healthy_s
    print(f"\none-host reference: ready after {ready_s} s, {json.dumps(answer)}")
    return {"tmp": tmp, "model": model, "vllm": vllm, "omni_env": omni_env, "plain": answer}


@pytest.fixture(scope="module")
def runs(setup, hosts):
    """Prefill (the head) on A; decode, Talker and Code2Wav headless on B."""
    return _two_host_run(setup, hosts, "decode-talker-code2wav-on-b", "{0: A, 1: B, 2: B, 3: B}")


def test_head_on_a_and_the_headless_stages_on_b_started_and_stopped_cleanly(runs):
    assert runs["pids"] == {"A": ["omni"], "B": ["stage-1", "stage-2", "stage-3"]}
    # B started its stages and waited for the head on A; A started the head alone
    assert any(f"waiting for omni on A (GET http://{ADDR['A']}:{HTTP}/health)" in ln for ln in runs["lines"]["B"])
    assert "PD disaggregation detected" in runs["logs"]["omni.log"]
    assert f"Stage 1 replica 0 registered from host {ADDR['B']}" in runs["logs"]["omni.log"]
    assert "SharedMemoryConnector" in runs["pd"] and "NixlConnector" not in runs["pd"]  # B's edges stay on B
    assert runs["rc"] == {"A": 130, "B": 130}, "\n".join(runs["lines"]["A"][-20:] + runs["lines"]["B"][-20:])


def test_the_answer_across_hosts_equals_the_one_host_answer(setup, runs):
    plain, got = setup["plain"], runs["answer"]
    assert plain["text"] and plain["wav_bytes"] > 44, plain  # a WAV with samples
    assert (got["text"], got["prompt_tokens"], got["wav_sha256"]) == (
        plain["text"], plain["prompt_tokens"], plain["wav_sha256"])


def test_decode_on_b_continued_from_prefills_kv_on_a(runs):
    delta = runs["answer"]["by_source_delta"]
    assert delta.get("external_kv_transfer", 0) > 0, delta
    assert delta.get("local_compute", 0) == 0, delta


@pytest.mark.skipif(os.environ.get("OMNI_PD_E2E_LONG") != "1",
                    reason="the NIXL stage-edge run is one more pipeline start (OMNI_PD_E2E_LONG=1)")
def test_decode_on_b_feeding_the_talker_on_a_over_nixl_stage_edges_gives_the_same_answer(setup, hosts):
    """Decode alone on B, the Talker and Code2Wav headless on A: the decode -> Talker edge
    crosses B -> A, so expand writes NixlConnector on every stage edge (OPD907), and the
    payload moves over NIXL (UCX over TCP) from decode's listener on B to the Talker on A."""
    got = _two_host_run(setup, hosts, "talker-on-a-nixl-edges", "{0: A, 1: B, 2: A, 3: A}", nixl_edges=True)
    assert got["rc"] == {"A": 130, "B": 130}, "\n".join(got["lines"]["A"][-20:] + got["lines"]["B"][-20:])
    assert got["pids"] == {"A": ["omni", "stage-2", "stage-3"], "B": ["stage-1"]}
    assert "connector_of_nixl_1_2" in got["pd"] and "SharedMemoryConnector" not in got["pd"]
    # decode's NIXL listener on B, at zmq_port + its stage id (expand's --port-base + 64 + 1)
    assert f"NixlConnector handshake listener bound on {ADDR['B']}:{BOOTSTRAP + 65}" in got["logs"]["stage-1.log"]
    plain, answer = setup["plain"], got["answer"]
    assert (answer["text"], answer["prompt_tokens"], answer["wav_sha256"]) == (
        plain["text"], plain["prompt_tokens"], plain["wav_sha256"])
    assert answer["by_source_delta"].get("external_kv_transfer", 0) > 0, answer["by_source_delta"]
