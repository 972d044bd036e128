"""``omni-pd size``: the AIConfigurator adapter (omni_pd/sizing/); ``--write`` runs expand's work
(:func:`omni_pd.cli.expand_run.run_expand`) with the sized options.
"""

import sys
from pathlib import Path
from typing import Literal, Optional

import typer

from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity


def _size_error(msg: str, help: str | None = None) -> OmniPdError:
    return OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=f"size: {msg}", help=help))


def size(
    input: Optional[Path] = typer.Argument(None, help="three-stage deploy YAML (default: the bundled Qwen3-Omni preset)",
                                           show_default=False),
    model_info: Path = typer.Option(..., "--model-info", help="the model's config.json (Qwen3-Omni: the Thinker's "
                                    "text_config is what PD splits; talker/code2wav sub-configs size the rest)"),
    system: str = typer.Option(..., "--system", help="AIConfigurator GPU system, e.g. h200_sxm, h100_sxm, b200_sxm"),
    total_devices: Optional[int] = typer.Option(None, "--total-devices", min=1,
                                                help="devices for the whole pipeline (or --request-rate)"),
    request_rate: Optional[float] = typer.Option(
        None, "--request-rate", help="target requests/s instead of --total-devices: instances per side from "
        "AIConfigurator's per-instance throughput (docs/sizing.md)"),
    backend: str = typer.Option("vllm", "--backend", help="AIConfigurator backend database (vllm, sglang, trtllm)"),
    text_tokens: int = typer.Option(..., "--text-tokens", min=0, help="prompt text tokens per request"),
    audio_seconds: Optional[list[float]] = typer.Option(None, "--audio-seconds", help="one audio clip (seconds), repeatable"),
    image: Optional[list[str]] = typer.Option(None, "--image", help="one image WIDTHxHEIGHT (pixels), repeatable"),
    output_tokens: int = typer.Option(..., "--output-tokens", min=1, help="Thinker output tokens per request"),
    ttft: float = typer.Option(..., "--ttft", help="TTFT target (ms)"),
    tpot: float = typer.Option(..., "--tpot", help="TPOT target (ms)"),
    fmt: Literal["text", "json"] = typer.Option("text", "--format"),
    write: Optional[Path] = typer.Option(None, "--write", help="write the sized deploy config (through expand) here"),
    pick: int = typer.Option(0, "--pick", min=0, help="use AIConfigurator's disagg row N (0 = its top) instead"),
    from_result: Optional[Path] = typer.Option(None, "--from-result", help="a result recorded with --record: no AIConfigurator run"),
    record: Optional[Path] = typer.Option(None, "--record", help="also save AIConfigurator's result (JSON) here"),
) -> None:
    """Size the Thinker's prefill/decode split with NVIDIA AIConfigurator for a traffic shape and
    TTFT/TPOT targets, place the Talker and Code2Wav on the devices left, print why (extra: omni-pd[sizing])."""
    import json

    from omni_pd.compile.parse import parse_config
    from omni_pd.io import load_file
    from omni_pd.io_write import atomic_write
    from omni_pd.resources import preset_path
    from omni_pd.sizing import aic, model_map, plan, rate, report, traffic

    if (total_devices is None) == (request_rate is None):
        raise _size_error("give --total-devices N or --request-rate R" if total_devices is None else
                          "give --total-devices or --request-rate, not both",
                          help="--request-rate derives the device count; --total-devices sizes for a fixed count")
    if request_rate is not None and not (request_rate > 0 and request_rate != float("inf")):
        raise _size_error(f"--request-rate must be a positive number of requests per second, not {request_rate:g}")
    try:
        cfg = json.loads(model_info.read_text(encoding="utf-8"))
        imgs = tuple(tuple(int(x) for x in s.lower().split("x", 1)) for s in (image or ()))
        shape = traffic.Traffic(text_tokens, output_tokens, tuple(audio_seconds or ()), imgs)  # type: ignore[arg-type]
        isl = shape.isl()
    except (OSError, json.JSONDecodeError) as e:
        raise _size_error(f"--model-info {model_info}: {e}") from None
    except ValueError as e:
        raise _size_error(str(e), help="--image takes WIDTHxHEIGHT, e.g. 1280x720") from None
    src = input if input is not None else preset_path("qwen3_omni_moe")
    doc = load_file(src)
    stages = parse_config(doc).stages
    names = ("thinker", "talker", "code2wav")

    def say_phase(text: str) -> None:
        """What size is doing, one line on stderr per phase (AIConfigurator's sweep takes one
        to two minutes of silence otherwise)."""
        sys.stderr.write(f"size: {text}\n")
        sys.stderr.flush()

    utils = {names[i]: float(s.gpu_memory_utilization or 0.9) for i, s in enumerate(stages[1:3], start=1)}
    text_cfg, where = model_map.thinker_text_config(cfg)
    thinker_shape = model_map.shape(text_cfg)
    if all(v is None for k, v in thinker_shape.items() if k != "head_dim"):
        raise _size_error(f"--model-info {model_info} has no Thinker text config (none of "
                          f"{', '.join(model_map.SHAPE_KEYS)} at {where})",
                          help="pass the model's config.json (the file next to the weights)")
    if from_result is not None:
        recorded = json.loads(from_result.read_text(encoding="utf-8"))
        device_bytes = int(recorded["gpu_memory_bytes"])
        got = {k: recorded["request"][k] for k in ("system", "backend", "isl", "osl", "ttft_ms", "tpot_ms")}
        want = {"system": system, "backend": backend, "isl": isl, "osl": output_tokens, "ttft_ms": ttft, "tpot_ms": tpot}
        if got != want:
            raise _size_error(f"--from-result {from_result} was recorded for {got}, not {want}")
        match = model_map.Match(recorded["request"]["model"], True, {})
        was = recorded.get("thinker_shape")
        if isinstance(was, dict):
            differs = {k: (thinker_shape.get(k), was.get(k)) for k in model_map.SHAPE_KEYS
                       if thinker_shape.get(k) != was.get(k)}
            if differs:
                raise _size_error(f"--from-result {from_result} was recorded for another Thinker ({match.model}): "
                                  + ", ".join(f"{k} {a} vs {b}" for k, (a, b) in differs.items()),
                                  help="re-run without --from-result for this model")
    else:
        say_phase(f"matching the Thinker ({where}) with AIConfigurator's models")
        try:
            match = model_map.nearest(text_cfg, aic.shipped_configs())
            device_bytes = aic.gpu_memory_bytes(system)
        except aic.AicMissing:
            raise _size_error("AIConfigurator is not installed", help="pip install aiconfigurator==0.12.0 (the sizing extra of omni-pd)") from None
        except aic.AicUnsupported as e:
            raise _size_error(str(e)) from None
        if not match.exact:
            raise _size_error(f"AIConfigurator does not model the Thinker LLM ({where} of {model_info}); the nearest "
                              f"it ships is {match.model}, which differs in "
                              + ", ".join(f"{k} {a} vs {b}" for k, (a, b) in match.differs.items()))
    down = plan.downstream_stages(cfg, utils)
    lacking = [n for n in utils if n not in {d.name for d in down}]
    if lacking:  # else they would be placed on a device past the budget (expand's default)
        raise _size_error(f"--model-info {model_info} has no {', '.join(f'{n}_config' for n in lacking)}: the "
                          f"{' and '.join(lacking)} stage{'s' if len(lacking) > 1 else ''} of {src.name} cannot be "
                          "sized or placed", help="pass the model's full config.json (the file next to the weights)")
    need = len(plan.place_downstream(down, len(down), device_bytes)) if down else 0
    if total_devices is not None and total_devices - need < 2:
        raise _size_error(f"{total_devices} device(s) leave {total_devices - need} for the Thinker; PD needs 2")
    if from_result is not None and total_devices is not None and recorded["request"]["total_gpus"] != total_devices - need:
        raise _size_error(f"--from-result {from_result} was recorded for {recorded['request']['total_gpus']} Thinker "
                          f"GPUs; --total-devices {total_devices} leaves {total_devices - need} (after {need} for the "
                          "stages downstream)", help="re-run without --from-result, or give the recorded count")
    if from_result is None:
        try:
            budget = total_devices - need if total_devices is not None else aic.gpus_per_node(system)
            req = aic.AicRequest(match.model, system, backend, budget, isl, output_tokens, ttft, tpot)
            say_phase(f"AIConfigurator sweeps {match.model} on {budget} {system} GPUs ({backend}; usually 1-2 minutes)")
            import time

            t0 = time.monotonic()
            recorded = aic.run(req)
            say_phase(f"AIConfigurator done in {time.monotonic() - t0:.0f} s")
        except aic.AicMissing:
            raise _size_error("AIConfigurator is not installed", help="pip install aiconfigurator==0.12.0 (the sizing extra of omni-pd)") from None
        except aic.AicUnsupported as e:
            raise _size_error(str(e)) from None
        recorded["thinker_shape"] = thinker_shape  # what --from-result compares the next --model-info with
        if record is not None:
            atomic_write(record, json.dumps(recorded, indent=1, sort_keys=True) + "\n", protect=[str(src)])
    rows = plan.choices(recorded) if recorded["best_configs"].get("disagg") else []
    if not rows:
        raise _size_error(f"no disaggregated configuration meets TTFT {ttft:g} ms / TPOT {tpot:g} ms")
    if pick >= len(rows):
        raise _size_error(f"--pick {pick}: AIConfigurator returned {len(rows)} disagg rows")
    rows = [rows[pick]] + [r for i, r in enumerate(rows) if i != pick]
    top = rows[0]
    fit = None
    if request_rate is not None:  # the picked row's instances scaled to the rate; the devices follow
        raw = recorded["best_configs"]["disagg"][pick]
        try:
            fit = rate.fit(raw, request_rate)
        except ValueError as e:
            raise _size_error(str(e)) from None
        top = rows[0] = rate.scaled(top, raw, fit, output_tokens)
        total_devices = top.devices + need
    try:
        placed = plan.place_downstream(down, total_devices - top.devices, device_bytes) if down else []
    except plan.NoFit as e:
        raise _size_error(str(e)) from None
    try:
        devs = plan.device_lists(top, len(placed), total_devices)
    except plan.NoFit as e:
        raise _size_error(str(e)) from None
    if from_result is None:
        note = f"same shape as {where} of {model_info.name}"
    elif isinstance(recorded.get("thinker_shape"), dict):
        note = f"same shape as the Thinker recorded in {from_result.name} ({where} of {model_info.name})"
    else:
        note = (f"recorded in {from_result.name}; not compared with {where} of {model_info.name} "
                "(the result records no Thinker shape: re-record it with --record)")
    s = report.summary(recorded, rows, {"model": match.model, "note": note},
                       {"isl": isl, "breakdown": shape.breakdown()}, placed, devs, fit)
    if fmt == "json":
        sys.stdout.write(json.dumps(s, indent=1) + "\n")
    else:
        from rich.console import Console

        report.render(s, Console(highlight=False, width=max(120, Console().width)))
    if write is not None:
        if top.prefill.pp > 1 or top.decode.pp > 1:
            raise _size_error(f"row {pick} uses PP >1 (prefill pp{top.prefill.pp}, decode pp{top.decode.pp}); "
                              "expand has no pipeline-parallel option, nothing written",
                              help="choose a PP1 runner-up with --pick N")
        kw: dict = {}
        # a side's DP (attention data parallel, DP ranks of one engine) through --prefill-dp/--decode-dp;
        # DP 1 is written only where the input's Thinker runs another data_parallel_size
        thinker_dp = _thinker_dp(doc)
        kw.update(input=input, output=write, prefill_replicas=top.prefill.replicas, decode_replicas=top.decode.replicas,
                  prefill_tp=top.prefill.tp, decode_tp=top.decode.tp, quiet=True,
                  prefill_dp=top.prefill.dp if top.prefill.dp != thinker_dp else None,
                  decode_dp=top.decode.dp if top.decode.dp != thinker_dp else None,
                  prefill_devices=",".join(map(str, devs["prefill"])), decode_devices=",".join(map(str, devs["decode"])))
        if devs["downstream"]:
            kw["downstream_devices"] = ",".join(map(str, devs["downstream"]))
        from omni_pd.cli.expand_run import run_expand

        found = run_expand(**kw, hide=frozenset({"OPD904"}))
        if "OPD904" in found:
            sys.stderr.write(f"note: the input's platforms.npu overlay is kept as expand writes it (one replica per "
                             f"side on npu, OPD904); this sizing is for {system}\n")
        sys.stderr.write(f"wrote {write} (through expand, validated)\n")


def _thinker_dp(doc) -> int:
    """The ``data_parallel_size`` the Thinker (the split stage) of deploy config ``doc`` runs
    with (its own, else the pipeline-wide top-level key, else 1); 1 when the file has no
    Thinker (expand then refuses it with OPD801)."""
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve, select_pipeline

    cfg = parse_config(doc)
    topo = resolve(cfg, select_pipeline(cfg, load_catalogue(), doc, None), None, doc)
    split = topo.pipeline.split_stage
    node = topo.node(split.stage_id) if split is not None else None
    return node.dp if node is not None else 1
