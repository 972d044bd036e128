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
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e.baselines import cases
from e2e.harness import Launcher, PlainInstance, engine_env, post_json

ROOT = Path(__file__).resolve().parents[1]
E2E = os.environ.get("OMNI_PD_E2E_PYTHON")
DEPLOY = ROOT / "tests" / "fixtures" / "qwen3_omni_moe_cpu.yaml"


def _netns_works() -> bool:
    if shutil.which("ip") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0


pytestmark = [
    pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)"),
    pytest.mark.skipif(not _netns_works(), reason="needs root and `ip netns` (iproute2)"),
]

#: the /30 between the namespaces (RFC 1918; it exists only on the veth pair)
NET = "10.203.0"
ADDR = {"A": f"{NET}.1", "B": f"{NET}.2"}
#: the one-host reference (main namespace, loopback), the head's API port, launch's
#: --engine-port-base (the head's registration port is + 300), expand's --port-base (Mooncake bootstrap)
PLAIN, HTTP, ENGINES, BOOTSTRAP = 19480, 19490, 19100, 19460
HOSTS_YAML = (f"hosts:\n  A: {{address: {ADDR['A']}, count: 2}}\n  B: {{address: {ADDR['B']}, count: 2}}\n"
              "placement: {0: A, 1: B, 2: B, 3: B}\n")
#: the one request: longer than one CPU KV block (whole blocks cross the hosts)
PROMPT = "text-long"
DECODE_STAGE = "1"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


@pytest.fixture(scope="module")
def hosts():
    """``{"A": netns name, "B": netns name}``: two namespaces joined by a veth pair, each
    with loopback up and its address of :data:`NET`/30; removed afterwards whatever happened."""
    tag = f"opdo{os.getpid() % 10000}"
    ns = {"A": f"{tag}a", "B": f"{tag}b"}
    probe = _ip("netns", "add", ns["A"], check=False)
    if probe.returncode != 0:  # e.g. a container without CAP_SYS_ADMIN
        pytest.skip(f"cannot create a network namespace here: {probe.stderr.strip()}")
    try:
        _ip("netns", "add", ns["B"])
        _ip("link", "add", f"{tag}va", "type", "veth", "peer", "name", f"{tag}vb")
        for h, dev in (("A", f"{tag}va"), ("B", f"{tag}vb")):
            _ip("link", "set", dev, "netns", ns[h])
            _ip("-n", ns[h], "addr", "add", f"{ADDR[h]}/30", "dev", dev)
            _ip("-n", ns[h], "link", "set", "lo", "up")
            _ip("-n", ns[h], "link", "set", dev, "up")
        yield ns
    finally:
        for n in ns.values():
            _ip("netns", "del", n, check=False)  # takes its end of the veth pair with it


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


def _stage_sources(metrics_text: str, stage: str) -> dict[str, float]:
    from omni_pd.launch.smoke import samples

    out: dict[str, float] = {}
    for name, labels, value in samples(metrics_text):
        if name == "vllm:prompt_tokens_by_source_total" and labels.get("stage") == stage:
            out[labels["source"]] = out.get(labels["source"], 0.0) + value
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model, hosts):
    """The one-host reference answer, then the two-host run; what the tests assert on."""
    tmp = tmp_path_factory.mktemp("e2e-omni-two-hosts")
    model = tiny_model("qwen3_omni_full")
    vllm = str(Path(E2E).parent / "vllm")
    omni_env = {k: v for k, v in engine_env(tmp).items() if k != "VLLM_PLUGINS"}  # vllm-omni needs its plugins
    out: dict = {}

    # 1. the one-host pipeline without PD: the reference answer; stopped before the next run
    flags = ("--omni", "--deploy-config", str(DEPLOY))
    with PlainInstance(vllm, model, PLAIN, omni_env, tmp / "plain.log", flags=flags, ready_timeout=900) as plain:
        out["plain"] = {"ready_s": plain.healthy_s, **_answer(post_json(plain.url + "/v1/chat/completions", _body(),
                                                                          timeout=300))}

    # 2. the PD pipeline across the two namespaces
    inv, pd = tmp / "hosts.yaml", tmp / "pd.yaml"
    inv.write_text(HOSTS_YAML)
    subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q", str(DEPLOY), "--mooncake-protocol", "tcp",
                    "--port-base", str(BOOTSTRAP), "--inventory", str(inv), "-o", str(pd)], check=True)
    # VLLM_HOST_IP: the address vLLM's Mooncake worker gives its Transfer Engine (get_ip()), its host's own
    env = {h: {**omni_env, "VLLM_HOST_IP": ADDR[h]} for h in ("A", "B")}
    launchers = {h: Launcher(pd, model, vllm, tmp / f"run{h}", router_port=HTTP, engine_port_base=ENGINES, env=env[h],
                             extra=("--inventory", str(inv), "--host", h, "--ready-timeout", "1200"),
                             prefix=("ip", "netns", "exec", hosts[h]))
                 for h in ("A", "B")}
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
        before, after = _stage_sources(got["before"], DECODE_STAGE), _stage_sources(got["after"], DECODE_STAGE)
        out["two_hosts"] = {**_answer(got["reply"]), "seconds": got["seconds"],
                            "by_source_delta": {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}}
    finally:
        out["rc"] = {h: launchers[h].stop() for h in ("B", "A")}
        log = tmp / "runA" / "omni.log"
        out["head_log"] = log.read_text(errors="replace") if log.is_file() else ""
        out["lines"] = {h: launchers[h].lines for h in ("A", "B")}
        out["pids"] = {h: [ln.split()[1] for ln in (tmp / f"run{h}" / "pids").read_text().splitlines()]
                       if (tmp / f"run{h}" / "pids").is_file() else [] for h in ("A", "B")}
    shown = {k: v for k, v in out.items() if k not in ("head_log", "lines")}
    print(f"\ntwo-host omni pipeline ({tmp}): {json.dumps(shown, indent=1)}")
    return out


def test_head_on_a_and_the_headless_stages_on_b_started_and_stopped_cleanly(runs):
    assert runs["pids"] == {"A": ["omni"], "B": ["stage-1", "stage-2", "stage-3"]}
    # B started its stages and waited for the head on A; A started the head alone
    assert any(f"waiting for omni on A (GET http://{ADDR['A']}:{HTTP}/health)" in ln for ln in runs["lines"]["B"])
    assert "PD disaggregation detected" in runs["head_log"]
    assert f"Stage 1 replica 0 registered from host {ADDR['B']}" in runs["head_log"]
    assert runs["rc"] == {"A": 130, "B": 130}, "\n".join(runs["lines"]["A"][-20:] + runs["lines"]["B"][-20:])


def test_the_answer_across_hosts_equals_the_one_host_answer(runs):
    plain, got = runs["plain"], runs["two_hosts"]
    assert plain["text"] and plain["wav_bytes"] > 44, plain  # a WAV with samples
    assert (got["text"], got["prompt_tokens"], got["wav_sha256"]) == (
        plain["text"], plain["prompt_tokens"], plain["wav_sha256"])


def test_decode_on_b_continued_from_prefills_kv_on_a(runs):
    delta = runs["two_hosts"]["by_source_delta"]
    assert delta.get("external_kv_transfer", 0) > 0, delta
    assert delta.get("local_compute", 0) == 0, delta
