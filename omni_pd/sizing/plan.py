"""Read AIConfigurator's recorded result and place the whole omni pipeline.

Pure functions over the recorded form of :func:`omni_pd.sizing.aic.record` (no AIConfigurator
import). AIConfigurator's disagg row columns (``aiconfigurator/sdk/pareto_analysis.py`` /
``cli/report_and_save.py`` in 0.12.0): ``(p)workers``/``(d)workers`` instances per side,
``(p)tp``/``(p)dp``/``(p)pp`` parallelism of one instance (GPUs per instance = tp*pp*dp),
``ttft``/``tpot`` in ms, ``tokens/s/gpu`` output tokens per second per GPU, ``(p)version`` the
perf-database (backend) version, ``(p)memory`` GiB per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence


class NoFit(ValueError):
    """The downstream stages do not fit on the devices AIConfigurator leaves."""


@dataclass(frozen=True)
class Side:
    """One side of the Thinker's PD split: ``replicas`` instances of ``tp * pp * dp`` devices each."""

    replicas: int
    tp: int
    pp: int
    dp: int
    memory_gib: float | None
    version: str

    @property
    def devices(self) -> int:
        return self.replicas * self.tp * self.pp * self.dp


@dataclass(frozen=True)
class ThinkerChoice:
    """One AIConfigurator disagg row: both sides, predictions (ms, tokens/s/GPU) and its rank (0 = top)."""

    rank: int
    prefill: Side
    decode: Side
    ttft_ms: float
    tpot_ms: float
    tokens_per_s_gpu: float
    tokens_per_s_user: float
    concurrency: float

    @property
    def devices(self) -> int:
        return self.prefill.devices + self.decode.devices


def _side(row: Mapping[str, Any], p: str) -> Side:
    return Side(int(row[f"({p})workers"]), int(row[f"({p})tp"]), int(row.get(f"({p})pp") or 1),
                int(row.get(f"({p})dp") or 1), row.get(f"({p})memory"),
                f"{row.get(f'({p})backend')} {row.get(f'({p})version')} on {row.get(f'({p})system')}")


def choices(recorded: Mapping[str, Any]) -> list[ThinkerChoice]:
    """AIConfigurator's disagg rows in its own order (best first). Raises KeyError without disagg rows."""
    rows = recorded["best_configs"]["disagg"]
    return [ThinkerChoice(i, _side(r, "p"), _side(r, "d"), float(r["ttft"]), float(r["tpot"]),
                          float(r["tokens/s/gpu"]), float(r["tokens/s/user"]), float(r["concurrency"]))
            for i, r in enumerate(rows)]


def slo_margins(c: ThinkerChoice, ttft_ms: float, tpot_ms: float) -> dict[str, dict[str, float | str]]:
    """Per side, its SLO, the prediction, the headroom (ms and fraction of the target) and whether it binds.

    Prefill is held to TTFT, decode to TPOT (a disagg TTFT is the prefill time plus the KV transfer;
    TPOT is decode alone). The side with the smaller headroom fraction is the one that bound the choice.
    """
    out = {"prefill": {"slo": "TTFT", "target_ms": ttft_ms, "predicted_ms": c.ttft_ms},
           "decode": {"slo": "TPOT", "target_ms": tpot_ms, "predicted_ms": c.tpot_ms}}
    for v in out.values():
        v["headroom_ms"] = round(v["target_ms"] - v["predicted_ms"], 3)
        v["headroom"] = round(v["headroom_ms"] / v["target_ms"], 4)
    bound = min(out, key=lambda k: out[k]["headroom"])
    for k, v in out.items():
        v["binding"] = k == bound
    return out


def weight_bytes(text: Mapping[str, Any], bytes_per_param: int = 2) -> int:
    """Rough weight bytes of one transformer text config: embeddings (x2 unless tied), per layer the
    q/k/v/o projections and the MLP (dense, or routed experts + router + shared expert).

    An estimate for placement only (it ignores norms, biases and convolutions)."""
    h = int(text.get("hidden_size") or 0)
    layers = int(text.get("num_hidden_layers") or 0)
    heads = int(text.get("num_attention_heads") or 0)
    kv = int(text.get("num_key_value_heads") or heads)
    hd = int(text.get("head_dim") or (h // heads if heads else 0))
    vocab = int(text.get("vocab_size") or 0)
    experts = int(text.get("num_experts") or text.get("num_local_experts") or 0)
    if experts:
        mlp = experts * 3 * h * int(text["moe_intermediate_size"]) + h * experts
        mlp += 3 * h * int(text.get("shared_expert_intermediate_size") or 0)
    else:
        mlp = 3 * h * int(text.get("intermediate_size") or 0)
    attn = h * hd * (2 * heads + 2 * kv)
    emb = vocab * h * (1 if text.get("tie_word_embeddings") else 2)
    return (emb + layers * (attn + mlp)) * bytes_per_param


@dataclass(frozen=True)
class Downstream:
    """A stage after the Thinker: its name, ``gpu_memory_utilization`` (share of one device vLLM
    reserves) and estimated weight bytes."""

    name: str
    gpu_memory_utilization: float
    weight_bytes: int


def place_downstream(stages: Sequence[Downstream], free: int, device_bytes: int) -> list[list[str]]:
    """First-fit the downstream stages onto ``free`` devices: stages share a device while their
    ``gpu_memory_utilization`` sums to <= 1.0 (vLLM reserves that share of the device per engine,
    ``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``), as the preset puts Talker
    (0.6) and Code2Wav (0.1) on one device.

    Returns the stage names per device used. Raises :class:`NoFit` when a stage's weights exceed
    its reservation or the stages need more than ``free`` devices.
    """
    bins: list[tuple[float, list[str]]] = []
    for s in stages:
        if s.weight_bytes > s.gpu_memory_utilization * device_bytes:
            raise NoFit(f"{s.name}: ~{s.weight_bytes / 2**30:.1f} GiB of weights exceed its reservation "
                        f"gpu_memory_utilization {s.gpu_memory_utilization} x {device_bytes / 2**30:.0f} GiB")
        for i, (used, names) in enumerate(bins):
            if used + s.gpu_memory_utilization <= 1.0 + 1e-9:
                bins[i] = (used + s.gpu_memory_utilization, names + [s.name])
                break
        else:
            bins.append((s.gpu_memory_utilization, [s.name]))
    if len(bins) > free:
        raise NoFit(f"the stages after the Thinker need {len(bins)} device(s); {free} left")
    return [names for _, names in bins]


def downstream_stages(config_json: Mapping[str, Any], utilizations: Mapping[str, float]) -> list[Downstream]:
    """Talker (its text model plus code predictor) and Code2Wav (its transformer) from a Qwen3-Omni
    config.json's ``talker_config``/``code2wav_config``; ``utilizations`` by stage name from the deploy
    config (stages it lacks are skipped). A config without those sub-configs gives []."""
    out = []
    tk = config_json.get("talker_config")
    if isinstance(tk, dict) and "talker" in utilizations:
        b = weight_bytes(tk.get("text_config") or tk)
        if isinstance(tk.get("code_predictor_config"), dict):
            b += weight_bytes(tk["code_predictor_config"])
        out.append(Downstream("talker", utilizations["talker"], b))
    cw = config_json.get("code2wav_config")
    if isinstance(cw, dict) and "code2wav" in utilizations:
        out.append(Downstream("code2wav", utilizations["code2wav"], weight_bytes(cw)))
    return out


def device_lists(c: ThinkerChoice, downstream: int, budget: int | None = None) -> dict[str, list[int]]:
    """Consecutive device indices: prefill first, then decode, then ``downstream`` devices.
    Raises :class:`NoFit` when they need more than ``budget`` devices (never a device
    index at or past the budget)."""
    p, d = c.prefill.devices, c.decode.devices
    if budget is not None and p + d + downstream > budget:
        raise NoFit(f"the plan needs {p + d + downstream} devices (prefill {p}, decode {d}, downstream {downstream}) "
                    f"but the budget is {budget}")
    return {"prefill": list(range(p)), "decode": list(range(p, p + d)),
            "downstream": list(range(p + d, p + d + downstream))}
