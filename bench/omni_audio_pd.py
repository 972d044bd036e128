"""Spoken answers under PD against vllm-omni's streaming default (issues 21, 34): first text token, first audio chunk.

    python bench/omni_audio_pd.py [--rounds 3] [--connector nixl|mooncake] [--max-tokens 64] [--e2e-python PATH]
                                  [--no-write] [--quick]

Runs, in one invocation on one machine and one pipeline at a time (never two in memory), the tiny
full Qwen3-Omni of tests/e2e/make_tiny_qwen3_omni_full.py through

* **non-PD streaming** (the reference: vllm-omni's own default, ``async_chunk: true``):
  ``vllm serve MODEL --omni --deploy-config`` tests/fixtures/qwen3_omni_moe_cpu.yaml with
  ``async_chunk`` turned on;
* **PD streaming**: ``omni-pd expand --stream`` of the fixture, started by ``omni-pd launch --platform cpu``
  (omni-pd's compatibility layer makes the pair stream, omni_pd/upstream/stream_pd.py);
* **PD one piece**: ``omni-pd expand`` of the fixture as it is (``async_chunk: false``): the answer's audio
  after the whole text, what PD gave before issue 34;

and sends every prompt of the e2e test (text, audio input, image input; short and longer than one
KV block) ``--rounds`` times as a streamed chat request with ``modalities: ["text", "audio"]`` and
``--max-tokens`` tokens (long enough for several audio chunks), one request at a time. Per request,
from the client: **TTFT** (first text delta), **first audio chunk**, the whole answer, the audio
chunks. The figures are ratios to non-PD streaming of the medians, per prompt and their median
(CPU absolute times say nothing about a GPU; the ratio says what the split costs on the same
hardware and model). The result replaces the "Spoken answers under PD" section of
bench/RESULTS.md. Needs the e2e venv (``bash .ci/e2e_venv.sh``), about 20 min.
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


def measure(base: str, prompts: dict, rounds: int, max_tokens: int) -> dict[str, list[dict]]:
    """Every prompt once as a warm-up (not kept), then ``rounds`` passes over all prompts; each
    answer as tests/e2e/harness.py ``stream_chat`` gives it, its audio replaced by the chunk count."""
    from e2e.harness import stream_chat

    def one(content: list[dict]) -> dict:
        r = stream_chat(base, content, max_tokens=max_tokens)
        if "error" in r:
            raise RuntimeError(r["error"])
        r["audio_chunks"] = len(r.pop("audio"))
        return r

    for content in prompts.values():
        one(content)
    out: dict[str, list[dict]] = {name: [] for name in prompts}
    for _ in range(rounds):
        for name, content in prompts.items():
            out[name].append(one(content))
    return out


def ratios(plain: dict, pd: dict, key: str) -> dict[str, float]:
    """PD / non-PD ratio of the medians of ``key``, per prompt."""
    return {name: statistics.median(r[key] for r in pd[name]) / statistics.median(r[key] for r in plain[name])
            for name in plain}


def extra_bytes(prompt_tokens: int, hidden: int) -> int:
    """Bytes prefill's rows add to one Talker request (omni_pd/upstream/talker_pd.py)."""
    return LAYERS * prompt_tokens * hidden * ITEMSIZE


def render(res: dict, mach: dict, load_end, argv: list[str]) -> str:
    plain = res["plain"]
    med = lambda xs: statistics.median(xs)  # noqa: E731
    modes = (("pd_stream", "PD streaming"), ("pd_piece", "PD one piece"))
    rows = ["| prompt | prompt tokens | mode | TTFT | first audio chunk | whole answer | audio chunks | "
            "first audio / non-PD streaming |", "|---|---|---|---|---|---|---|---|"]
    summary = []
    for name in plain:
        p = plain[name][0]["prompt_tokens"] or 0
        for key, label in (("plain", "non-PD streaming"), *modes):
            r = res[key][name]
            rows.append(f"| {name} | {p} | {label} | {med(x['ttft_s'] for x in r):.2f} s | "
                        f"{med(x['first_audio_s'] for x in r):.2f} s | {med(x['total_s'] for x in r):.2f} s | "
                        f"{med(x['audio_chunks'] for x in r):.0f} | "
                        f"{med(x['first_audio_s'] for x in r) / med(x['first_audio_s'] for x in plain[name]):.2f}x |")
    for key, label in modes:
        ttft, audio, total = (ratios(plain, res[key], k) for k in ("ttft_s", "first_audio_s", "total_s"))
        summary.append(f"{label}: TTFT {med(ttft.values()):.2f}x, first audio chunk {med(audio.values()):.2f}x, "
                       f"whole answer {med(total.values()):.2f}x")
    return "\n".join([
        BEGIN, "## Spoken answers under PD: first audio chunk against vllm-omni's streaming default", "",
        f"* Command: `python bench/{Path(__file__).name} {' '.join(argv)}`".rstrip(),
        f"* Machine: {mach['cpu']}, {mach['cores']} cores, {mach['memory_gib']} GiB; {mach['date']}; "
        f"commit {mach['commit']}; load at start {mach['loadavg']}, at end {load_end}",
        f"* Setup: tiny random Qwen3-Omni (Thinker, Talker, Code2Wav), {res['max_tokens']}-token answers; non-PD = "
        f"tests/fixtures/qwen3_omni_moe_cpu.yaml with `async_chunk: true`; PD streaming = its `omni-pd expand --stream`, "
        f"PD one piece = its `omni-pd expand`, both over {res['connector']} through `omni-pd launch --platform cpu`; "
        f"{res['rounds']} rounds per prompt after one warm-up, one request at a time, streamed; ready in "
        + ", ".join(f"{res[k + '_ready_s']} s {k}" for k in ("plain", "pd_stream", "pd_piece")) + ".", "",
        *rows, "",
        "**Median ratios to non-PD streaming: " + "; ".join(summary) + ".** On CPU the stages share two cores, "
        "so absolute times are this machine's; the ratio compares the three on the same hardware and model. "
        "Bytes the streaming fix adds per request: prefill's two hidden-state layers on decode's request, "
        f"2 x P x H x 2 B (bf16): {extra_bytes(1000, HIDDEN['tiny']) / 1024:.0f} KiB per 1k prompt tokens on the tiny "
        f"model, {extra_bytes(1000, HIDDEN['Qwen3-Omni-30B-A3B']) / 2**20:.1f} MiB on Qwen3-Omni-30B-A3B.", END])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connector", choices=("nixl", "mooncake"), default="nixl")
    ap.add_argument("--max-tokens", type=int, default=64, help="answer length (ignore_eos): several audio chunks")
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
    if a.connector == "mooncake":
        env["VLLM_HOST_IP"] = "127.0.0.1"
    prompts = cases()
    flags = (["--connector", "NixlConnector", "--kv-buffer-device", "cpu"] if a.connector == "nixl"
             else ["--mooncake-protocol", "tcp"])
    stream_deploy = work / "qwen3_omni_moe_cpu_stream.yaml"
    stream_deploy.write_text(DEPLOY.read_text().replace("\nasync_chunk: false\n", "\nasync_chunk: true\n"))
    res: dict = {"connector": "NixlConnector" if a.connector == "nixl" else "MooncakeConnector (tcp)",
                 "rounds": a.rounds, "max_tokens": a.max_tokens}
    with PlainInstance(vllm, model, PLAIN, env, work / "plain.log",
                       flags=("--omni", "--deploy-config", str(stream_deploy)), ready_timeout=900) as plain:
        res["plain_ready_s"] = plain.healthy_s
        res["plain"] = measure(plain.url, prompts, a.rounds, a.max_tokens)
    print("non-PD streaming done", flush=True)
    for key, extra in (("pd_stream", ["--stream"]), ("pd_piece", [])):
        pd_yaml = work / f"{key}.yaml"
        subprocess.run(omni_pd_command() + ["expand", "-q", str(DEPLOY), *extra, *flags, "--port-base", str(SIDE),
                                            "-o", str(pd_yaml)], check=True)
        launcher = Launcher(pd_yaml, model, vllm, work / key, router_port=OMNI, engine_port_base=18800, env=env)
        t0 = time.monotonic()
        try:
            launcher.wait_for("healthy", 900)
            res[f"{key}_ready_s"] = round(time.monotonic() - t0, 1)
            res[key] = measure(f"http://127.0.0.1:{OMNI}", prompts, a.rounds, a.max_tokens)
        finally:
            launcher.proc.send_signal(signal.SIGINT)
            try:
                launcher.proc.wait(120)
            except subprocess.TimeoutExpired:
                launcher.proc.kill()
        print(f"{key} done", flush=True)
    (work / "raw.json").write_text(json.dumps(res, indent=1))
    section = render(res, mach, loadavg(), argv if argv is not None else sys.argv[1:])
    print(section)
    print(f"raw measurements: {work / 'raw.json'}")
    if not a.no_write:
        replace_section(RESULTS, BEGIN, END, section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
