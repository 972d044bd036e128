"""Sizing result as one JSON-safe dict and as rich tables (the two ``--format`` choices)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Mapping

from omni_pd.sizing.plan import ThinkerChoice, slo_margins
from omni_pd.sizing.rate import RateFit


def summary(recorded: Mapping[str, Any], chosen: list[ThinkerChoice], mapping: Mapping[str, Any],
            traffic: Mapping[str, Any], downstream: list[list[str]], devices: Mapping[str, list[int]],
            fit: RateFit | None = None) -> dict:
    """The ``--format json`` document: inputs, AIConfigurator version and perf database, the chosen
    Thinker split with SLO margins, the runners-up, agg vs disagg, and the downstream placement;
    with ``fit`` (``--request-rate``) also ``request_rate``: the target, the per-instance req/s
    it was scaled from and what the scaled split serves (:mod:`omni_pd.sizing.rate`)."""
    req = recorded["request"]
    top = chosen[0]
    out = {
        "aiconfigurator": recorded.get("aiconfigurator"),
        "perf_database": top.prefill.version,
        "request": dict(req),
        "model_map": dict(mapping),
        "traffic": dict(traffic),
        "thinker": {"prefill": asdict(top.prefill), "decode": asdict(top.decode),
                    "ttft_ms": top.ttft_ms, "tpot_ms": top.tpot_ms, "tokens_per_s_gpu": top.tokens_per_s_gpu,
                    "tokens_per_s_user": top.tokens_per_s_user, "concurrency": top.concurrency,
                    "slo": slo_margins(top, req["ttft_ms"], req["tpot_ms"])},
        "runners_up": [{"prefill": f"{c.prefill.replicas}x tp{c.prefill.tp} dp{c.prefill.dp}",
                        "decode": f"{c.decode.replicas}x tp{c.decode.tp} dp{c.decode.dp}",
                        "devices": c.devices, "ttft_ms": c.ttft_ms, "tpot_ms": c.tpot_ms,
                        "tokens_per_s_gpu": c.tokens_per_s_gpu} for c in chosen[1:]],
        "agg_vs_disagg": {k: float(v) for k, v in recorded["best_throughputs"].items()},
        "downstream": downstream,
        "devices": {k: list(v) for k, v in devices.items()},
    }
    if fit is not None:
        out["request_rate"] = {"target": fit.target, "served": fit.served,
                               "prefill_per_instance": fit.prefill_per_instance,
                               "decode_per_instance": fit.decode_per_instance,
                               "formula": "instances = ceil(R / (0.9 x (p)seq/s/worker)) prefill, "
                                          "ceil(R / (0.92 x (d)seq/s/worker)) decode (AIConfigurator's rate matching)"}
    out["total_devices"] = sum(len(v) for v in devices.values())
    return out


def render(s: Mapping[str, Any], console) -> None:
    """Print :func:`summary` as rich tables on ``console``."""
    from rich.table import Table

    req, th = s["request"], s["thinker"]
    rr = s.get("request_rate")
    budget = (f"{req['system']} (AIConfigurator ran with {req['total_gpus']} GPUs)" if rr else
              f"{req['system']} x{req['total_gpus']} for the Thinker")
    console.print(f"Thinker LLM = {s['model_map']['model']} ({s['model_map']['note']}); {budget}, {req['backend']}, "
                  f"ISL {req['isl']} ({s['traffic']['breakdown']}) / OSL {req['osl']}")
    t = Table(title=f"Thinker PD split (AIConfigurator {s['aiconfigurator']}, perf database {s['perf_database']})")
    for col in ("side", "instances", "TP", "DP", "devices", "SLO", "target ms", "predicted ms", "headroom", "bound"):
        t.add_column(col, justify="left" if col in ("side", "SLO") else "right")
    for side in ("prefill", "decode"):
        p, m = th[side], th["slo"][side]
        t.add_row(side, str(p["replicas"]), str(p["tp"]), str(p["dp"]), ",".join(map(str, s["devices"][side])),
                  m["slo"], f"{m['target_ms']:g}", f"{m['predicted_ms']:.1f}",
                  f"{m['headroom_ms']:.1f} ms ({m['headroom']:.0%})", "yes" if m["binding"] else "")
    console.print(t)
    if rr:
        console.print(f"request rate {rr['target']:g} req/s: prefill {rr['prefill_per_instance']:g} and decode "
                      f"{rr['decode_per_instance']:g} req/s per instance (x0.9 / x0.92, AIConfigurator's rate "
                      f"matching) -> {th['prefill']['replicas']} prefill + {th['decode']['replicas']} decode "
                      f"instances, serving {rr['served']:g} req/s on {s['total_devices']} devices")
    agg = s["agg_vs_disagg"]
    ratio = (f", {agg['disagg'] / agg['agg']:.2f}x the best aggregated ({agg['agg']:.0f})"
             if agg.get("agg") and agg.get("disagg") else "")
    console.print(f"predicted {th['tokens_per_s_gpu']:.0f} tokens/s/GPU, {th['tokens_per_s_user']:.1f} tokens/s/user "
                  f"at concurrency {th['concurrency']:.0f}{ratio}")
    if s["runners_up"]:
        r = Table(title="runners-up (AIConfigurator's order)")
        for col in ("prefill", "decode", "devices", "TTFT ms", "TPOT ms", "tokens/s/GPU"):
            r.add_column(col, justify="right")
        for c in s["runners_up"]:
            r.add_row(c["prefill"], c["decode"], str(c["devices"]), f"{c['ttft_ms']:.1f}", f"{c['tpot_ms']:.1f}",
                      f"{c['tokens_per_s_gpu']:.0f}")
        console.print(r)
    if s["downstream"]:
        console.print("downstream: " + "; ".join(f"device {d}: {' + '.join(n)}"
                                                 for d, n in zip(s["devices"]["downstream"], s["downstream"])))
