"""The edge: one call into AIConfigurator's Python API, recorded as plain JSON.

Everything else in :mod:`omni_pd.sizing` reads the *recorded* form this module returns, so the
tables, the placement and ``--write`` are tested from a fixture without AIConfigurator installed.

Upstream: ``aiconfigurator.cli.api.cli_default`` (aiconfigurator 0.12.0), the Python form of
``aiconfigurator cli default``: it builds an ``agg`` and a ``disagg`` ``Task``
(``aiconfigurator.sdk.task_v2.Task``), sweeps both against the perf database of
``aiconfigurator_core/systems/data/<system>/`` and returns a ``CLIResult`` whose
``best_configs[exp]`` is a pandas frame of the top-N rows meeting TTFT (and, at pick time, TPOT),
ranked by ``tokens/s/gpu_cluster``. Support is ``aiconfigurator.cli.api.cli_support`` (majority
vote in AIConfigurator's support matrix), the models it ships are the
``aiconfigurator_core/model_configs/<org>--<name>_config.json`` files.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from importlib import metadata


class AicMissing(RuntimeError):
    """AIConfigurator is not importable (the ``sizing`` extra is not installed)."""


class AicUnsupported(RuntimeError):
    """AIConfigurator does not model this model/system/backend, or no configuration meets the SLO."""


@dataclass(frozen=True)
class AicRequest:
    """One ``cli_default`` call.

    ``model`` is an AIConfigurator model path (a HuggingFace id it ships a config for, e.g.
    ``Qwen/Qwen3-30B-A3B``); ``system`` an AIConfigurator system (``h200_sxm``); ``isl``/``osl``
    tokens per request; ``ttft_ms``/``tpot_ms`` the targets in milliseconds.
    """

    model: str
    system: str
    backend: str
    total_gpus: int
    isl: int
    osl: int
    ttft_ms: float
    tpot_ms: float
    top_n: int = 5


def version() -> str | None:
    """Installed ``aiconfigurator`` distribution version, or None when it is not installed."""
    try:
        return metadata.version("aiconfigurator")
    except metadata.PackageNotFoundError:
        return None


def shipped_models() -> list[str]:
    """Model ids AIConfigurator ships a config for (``aiconfigurator_core/model_configs``), sorted.

    Raises :class:`AicMissing` when aiconfigurator-core is not importable.
    """
    try:
        import aiconfigurator_core
    except ImportError as e:  # pragma: no cover - depends on the venv
        raise AicMissing(str(e)) from e
    from pathlib import Path

    d = Path(aiconfigurator_core.__file__).parent / "model_configs"
    return sorted(f.name[: -len("_config.json")].replace("--", "/", 1)
                  for f in d.glob("*_config.json") if not f.name.endswith("_hf_quant_config.json"))


def shipped_configs() -> dict[str, dict]:
    """``{model id: config.json mapping}`` of every model AIConfigurator ships. Raises :class:`AicMissing`."""
    try:
        import aiconfigurator_core
    except ImportError as e:
        raise AicMissing(str(e)) from e
    from pathlib import Path

    d = Path(aiconfigurator_core.__file__).parent / "model_configs"
    return {m: json.loads((d / (m.replace("/", "--", 1) + "_config.json")).read_text(encoding="utf-8"))
            for m in shipped_models()}


def gpu_memory_bytes(system: str) -> int:
    """``gpu.mem_capacity`` of AIConfigurator's ``systems/<system>.yaml`` (bytes). Raises
    :class:`AicUnsupported` for a system it does not ship, :class:`AicMissing` when not installed."""
    try:
        import aiconfigurator_core
    except ImportError as e:  # pragma: no cover
        raise AicMissing(str(e)) from e
    from pathlib import Path

    from ruamel.yaml import YAML

    systems = Path(aiconfigurator_core.__file__).parent / "systems"
    f = systems / f"{system}.yaml"
    if not f.is_file():
        known = sorted(x.stem for x in systems.glob("*.yaml") if (systems / "data" / x.stem).is_dir())
        raise AicUnsupported(f"aiconfigurator has no system {system!r}; it models: {', '.join(known)}")
    return int(YAML(typ="safe").load(f.read_text(encoding="utf-8"))["gpu"]["mem_capacity"])


def gpus_per_node(system: str) -> int:
    """``node.num_gpus_per_node`` of AIConfigurator's ``systems/<system>.yaml``: the GPU budget
    ``cli_recommend`` (aiconfigurator 0.12.0 ``cli/api.py``) sweeps per-instance configurations
    with, and the one ``omni-pd size --request-rate`` gives ``cli_default``. Raises as
    :func:`gpu_memory_bytes`."""
    gpu_memory_bytes(system)  # the same refusal for an unknown system
    import aiconfigurator_core
    from pathlib import Path

    from ruamel.yaml import YAML

    f = Path(aiconfigurator_core.__file__).parent / "systems" / f"{system}.yaml"
    return int(YAML(typ="safe").load(f.read_text(encoding="utf-8"))["node"]["num_gpus_per_node"])


def run(req: AicRequest) -> dict:
    """Run ``cli_default`` for ``req`` and return its recorded form (see :func:`record`).

    Raises :class:`AicMissing` (not importable) or :class:`AicUnsupported` (not in the support
    matrix for disagg, unknown model, or ``NoFeasibleConfigError``: no configuration meets the SLO).
    Takes minutes on a CPU: AIConfigurator sweeps every agg and disagg candidate.
    """
    try:
        from aiconfigurator.cli import cli_default, cli_support
        from aiconfigurator.sdk.errors import NoFeasibleConfigError
    except ImportError as e:
        raise AicMissing(str(e)) from e
    try:
        _agg_ok, disagg_ok = cli_support(req.model, req.system, backend=req.backend)
    except Exception as e:  # noqa: BLE001 - upstream raises bare ValueError/KeyError for unknown inputs
        raise AicUnsupported(f"aiconfigurator support check failed: {e}") from e
    if not disagg_ok:
        raise AicUnsupported(f"aiconfigurator's support matrix does not mark disaggregated {req.model} on "
                             f"{req.system} with {req.backend} as passing")
    try:
        res = cli_default(model_path=req.model, total_gpus=req.total_gpus, system=req.system, backend=req.backend,
                          isl=req.isl, osl=req.osl, ttft=req.ttft_ms, tpot=req.tpot_ms, top_n=req.top_n)
    except NoFeasibleConfigError as e:
        raise AicUnsupported(f"no configuration meets TTFT {req.ttft_ms:g} ms / TPOT {req.tpot_ms:g} ms: {e}") from e
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise AicUnsupported(f"aiconfigurator cannot size this: {e}") from e
    return record(req, res)


def record(req: AicRequest, res) -> dict:
    """The JSON-safe form of a ``CLIResult``: inputs, versions, per-experiment best rows.

    Shape: ``{"aiconfigurator": str, "request": {AicRequest fields}, "chosen_exp": "agg"|"disagg",
    "best_throughputs": {exp: tokens/s/gpu}, "best_latencies": {exp: {ttft, tpot, request_latency}},
    "best_configs": {exp: [row, ...]}}``; rows keep AIConfigurator's column names
    (``(p)workers``, ``(d)tp``, ``ttft`` in ms, ``tokens/s/gpu`` ...).
    """
    configs = {k: json.loads(df.to_json(orient="records")) for k, df in res.best_configs.items() if df is not None}
    return {
        "aiconfigurator": version(),
        "gpu_memory_bytes": gpu_memory_bytes(req.system),
        "request": asdict(req),
        "chosen_exp": res.chosen_exp,
        "best_throughputs": {k: float(v) for k, v in res.best_throughputs.items()},
        "best_latencies": {k: {m: float(x) for m, x in v.items()} for k, v in res.best_latencies.items()},
        "best_configs": configs,
    }
