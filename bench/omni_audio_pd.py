"""Spoken answers under PD against the same pipeline without PD (issue 21): TTFT and first audio chunk.

    python bench/omni_audio_pd.py [--rounds 3] [--connector nixl|mooncake] [--e2e-python PATH] [--no-write]

The seed's open question: no non-regression result exists for PD on an omni pipeline. This
runs, in one invocation on one machine, the tiny full Qwen3-Omni of
tests/e2e/make_tiny_qwen3_omni_full.py through

* **non-PD**: ``vllm serve MODEL --omni --deploy-config tests/fixtures/qwen3_omni_moe_cpu.yaml``
  (Thinker -> Talker -> Code2Wav, omni-pd's CPU OmniPlatform), then
* **PD**: ``omni-pd expand`` of the same file (NixlConnector with CPU buffers, or
  MooncakeConnector over tcp) started by ``omni-pd launch --platform cpu``,

one pipeline at a time (never two in memory), and sends every prompt of the e2e test (text,
audio input, image input; short and longer than one KV block) ``--rounds`` times as a
streamed chat request with ``modalities: ["text", "audio"]``, one request at a time. Per
request, from the client: **TTFT** (first SSE event with text content), **first audio
chunk** (first event of modality ``audio`` with data) and the whole answer. The figures are
PD / non-PD ratios of the medians, per prompt and their median (CPU absolute times say
nothing about a GPU; the ratio says what the split costs on the same hardware and model).
Both sides run ``async_chunk: false`` (PD needs it, OPD901): the non-PD side is the same
pipeline shape, not the preset's streaming default, so the ratio isolates the split.

Bytes the Talker fix adds per request (omni_pd/upstream/talker_pd.py): prefill's layer 0 and
``accept_hidden_layer`` rows, ``2 x P x H x 2`` bytes in bf16 for a P-token prompt, shown for
the tiny model (H = 64) and Qwen3-Omni-30B-A3B's Thinker (H = 2048); decode's own payload is
P - 1 rows per layer smaller than a non-PD Thinker's, so the net is one row per layer more.

The result replaces the "Spoken answers under PD" section of bench/RESULTS.md. Needs the e2e
venv (``bash .ci/e2e_venv.sh``), about 13 min.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from common import ROOT, loadavg, machine, omni_pd_command, quick_mode, replace_section  # noqa: E402
from fig4_launch import e2e_python  # noqa: E402

RESULTS = ROOT / "bench" / "RESULTS.md"
BEGIN, END = "<!-- omni audio pd: begin -->", "<!-- omni audio pd: end -->"
DEPLOY = ROOT / "tests" / "fixtures" / "qwen3_omni_moe_cpu.yaml"
PLAIN, OMNI, SIDE = 18700, 18710, 18760
#: bf16 hidden size of the tiny model's Thinker and of Qwen3-Omni-30B-A3B's (config.json text_config)
HIDDEN = {"tiny": 64, "Qwen3-Omni-30B-A3B": 2048}
LAYERS, ITEMSIZE = 2, 2  # layer 0 + accept_hidden_layer; bf16


def stream_chat(base: str, content: list[dict], timeout: float = 300) -> dict:
    """One streamed greedy text+audio chat request: seconds to the first text delta, to
    the first audio chunk, to the end; the prompt size; the audio chunks seen."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 16,
            "temperature": 0, "ignore_eos": True, "modalities": ["text", "audio"], "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    t0 = time.monotonic()
    first_text = first_audio = None
    chunks, prompt = 0, None
    with opener.open(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            now = time.monotonic() - t0
            if (ev.get("usage") or {}).get("prompt_tokens"):
                prompt = ev["usage"]["prompt_tokens"]
            for ch in ev.get("choices") or ():
                if not (ch.get("delta") or {}).get("content"):
                    continue
                if ev.get("modality") == "audio":
                    chunks += 1
                    first_audio = now if first_audio is None else first_audio
                elif first_text is None:
                    first_text = now
    return {"ttft_s": first_text, "first_audio_s": first_audio, "total_s": time.monotonic() - t0,
            "audio_chunks": chunks, "prompt_tokens": prompt}


def measure(base: str, prompts: dict, rounds: int) -> dict[str, list[dict]]:
    """Every prompt once as a warm-up (not kept), then ``rounds`` passes over all prompts."""
    for content in prompts.values():
        stream_chat(base, content)
    out: dict[str, list[dict]] = {name: [] for name in prompts}
    for _ in range(rounds):
        for name, content in prompts.items():
            out[name].append(stream_chat(base, content))
    return out


def ratios(plain: dict, pd: dict, key: str) -> dict[str, float]:
    """PD / non-PD ratio of the medians of ``key``, per prompt."""
    return {name: statistics.median(r[key] for r in pd[name]) / statistics.median(r[key] for r in plain[name])
            for name in plain}


def extra_bytes(prompt_tokens: int, hidden: int) -> int:
    """Bytes prefill's rows add to one Talker request (omni_pd/upstream/talker_pd.py)."""
    return LAYERS * prompt_tokens * hidden * ITEMSIZE


def render(res: dict, mach: dict, load_end, argv: list[str]) -> str:
    plain, pd = res["plain"], res["pd"]
    ttft, audio, total = (ratios(plain, pd, k) for k in ("ttft_s", "first_audio_s", "total_s"))
    med = lambda xs: statistics.median(xs)  # noqa: E731
    rows = ["| prompt | prompt tokens | TTFT non-PD / PD | ratio | first audio chunk non-PD / PD | ratio | "
            "whole answer ratio | bytes added (tiny / 30B-A3B) |", "|---|---|---|---|---|---|---|---|"]
    for name in plain:
        p = plain[name][0]["prompt_tokens"] or 0
        rows.append(
            f"| {name} | {p} | {med(r['ttft_s'] for r in plain[name]):.2f} s / {med(r['ttft_s'] for r in pd[name]):.2f} s"
            f" | {ttft[name]:.2f}x | {med(r['first_audio_s'] for r in plain[name]):.2f} s / "
            f"{med(r['first_audio_s'] for r in pd[name]):.2f} s | {audio[name]:.2f}x | {total[name]:.2f}x | "
            f"{extra_bytes(p, HIDDEN['tiny']) / 1024:.0f} KiB / {extra_bytes(p, HIDDEN['Qwen3-Omni-30B-A3B']) / 2**20:.1f} MiB |")
    return "\n".join([
        BEGIN, "## Spoken answers under PD: TTFT and first audio chunk, PD against non-PD", "",
        f"* Command: `python bench/{Path(__file__).name} {' '.join(argv)}`".rstrip(),
        f"* Machine: {mach['cpu']}, {mach['cores']} cores, {mach['memory_gib']} GiB; {mach['date']}; "
        f"commit {mach['commit']}; load at start {mach['loadavg']}, at end {load_end}",
        f"* Setup: tiny random Qwen3-Omni (Thinker, Talker, Code2Wav), `async_chunk: false` on both sides, "
        f"non-PD = tests/fixtures/qwen3_omni_moe_cpu.yaml, PD = its `omni-pd expand` over {res['connector']} "
        f"through `omni-pd launch --platform cpu`; {res['rounds']} rounds per prompt after one warm-up, one request "
        f"at a time, streamed; ready in {res['plain_ready_s']} s non-PD, {res['pd_ready_s']} s PD.", "",
        *rows, "",
        f"**Median ratios PD / non-PD: TTFT {med(ttft.values()):.2f}x, first audio chunk {med(audio.values()):.2f}x, "
        f"whole answer {med(total.values()):.2f}x.** On CPU every stage shares two cores, so the split's cost is "
        "the extra hop (prefill's one-token answer, the KV transfer, decode's recompute of the last prompt "
        "token) against compute that a GPU does far faster; the ratio is what this machine shows, not a GPU "
        "forecast. With `async_chunk: false` the audio arrives as one chunk at the end of the answer on both "
        "sides, so first audio chunk and whole answer nearly coincide. Bytes added: prefill's two hidden-state "
        "layers on the Talker request (net one row per layer more than non-PD).", END])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connector", choices=("nixl", "mooncake"), default="nixl")
    ap.add_argument("--e2e-python")
    ap.add_argument("--no-write", action="store_true", help="print, do not update bench/RESULTS.md")
    ap.add_argument("--quick", action="store_true",
                    help="one round, nothing written (also $OMNI_PD_BENCH_QUICK=1); skips without the e2e venv")
    a = ap.parse_args(argv)
    if quick_mode(a.quick):
        a.rounds, a.no_write = 1, True
    py = e2e_python(a.e2e_python, quick_mode(a.quick))
    from e2e.harness import Launcher, PlainInstance, engine_env, tiny_model_dir
    from e2e.baselines import cases

    mach = machine()
    work = Path(tempfile.mkdtemp(prefix="omni-pd-audio-bench-"))
    model = tiny_model_dir("qwen3_omni_full", py)
    vllm = str(Path(py).parent / "vllm")
    env = {k: v for k, v in engine_env(work).items() if k != "VLLM_PLUGINS"}
    prompts = cases()
    pd_yaml = work / "pd.yaml"
    flags = (["--connector", "NixlConnector", "--kv-buffer-device", "cpu"] if a.connector == "nixl"
             else ["--mooncake-protocol", "tcp"])
    subprocess.run(omni_pd_command() + ["expand", "-q", str(DEPLOY), *flags, "--port-base", str(SIDE),
                                        "-o", str(pd_yaml)], check=True)
    res: dict = {"connector": "NixlConnector" if a.connector == "nixl" else "MooncakeConnector (tcp)",
                 "rounds": a.rounds}
    with PlainInstance(vllm, model, PLAIN, env, work / "plain.log", flags=("--omni", "--deploy-config", str(DEPLOY)),
                       ready_timeout=900) as plain:
        res["plain_ready_s"] = plain.healthy_s
        res["plain"] = measure(plain.url, prompts, a.rounds)
    print("non-PD done", flush=True)
    if a.connector == "mooncake":
        env["VLLM_HOST_IP"] = "127.0.0.1"
    launcher = Launcher(pd_yaml, model, vllm, work / "run", router_port=OMNI, engine_port_base=18800, env=env)
    t0 = time.monotonic()
    try:
        launcher.wait_for("healthy", 900)
        res["pd_ready_s"] = round(time.monotonic() - t0, 1)
        res["pd"] = measure(f"http://127.0.0.1:{OMNI}", prompts, a.rounds)
    finally:
        launcher.proc.send_signal(signal.SIGINT)
        try:
            launcher.proc.wait(120)
        except subprocess.TimeoutExpired:
            launcher.proc.kill()
    (work / "raw.json").write_text(json.dumps(res, indent=1))
    section = render(res, mach, loadavg(), argv if argv is not None else sys.argv[1:])
    print(section)
    print(f"raw measurements: {work / 'raw.json'}")
    if not a.no_write:
        replace_section(RESULTS, BEGIN, END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
