"""Every legacy ``stage_args`` file vllm-omni shipped in its last release with them (0.24.0)
migrates, and loads in vllm-omni 0.30.0 with the stage settings 0.24.0's loader gave (issue 23).

The 0.24.0 wheel is fetched with pip at test time (``pip download --no-deps``, cached as
``tests/test_wheel_configs.py`` does for 0.30.0; skipped with ``OMNI_PD_OFFLINE=1``). The
legacy side is 0.24.0's own ``load_stage_configs_from_yaml`` (``vllm_omni/entrypoints/utils.py``
unpacked from the wheel and imported as a loose module in the oracle venv, where its imports
resolve to 0.30.0's helpers: the OmegaConf merge it calls is unchanged); the new side is
0.30.0's ``resolve_omni_config`` on the migrated file (what ``vllm serve --omni
--deploy-config`` resolves). One oracle process checks every file. Each field that differs
is listed in :data:`EXPECTED` with the reason; any other difference fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from omni_pd.compile.migrate import UNCATALOGUED, migrate_text
from omni_pd.compile.pipelines import load_catalogue
from omni_pd.compile.targets import target
from omni_pd.io import parse_text

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[1]
SPEC = "vllm-omni==0.24.0"
GLOB = "vllm_omni-0.24.0-*.whl"
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")
T030 = target("0.30")

#: every legacy (``stage_args:``) YAML in the 0.24.0 wheel -> the vllm-omni 0.30 pipeline
#: (registry key = the model's model_type) it belongs to
SHIPPED = {
    "model_executor/stage_configs/hunyuan_video_15_dit_fp8.yaml": "hunyuan_video_15",
    "model_executor/stage_configs/mammoth_moda2.yaml": "mammoth_moda2",
    "model_executor/stage_configs/mammoth_moda2_ar.yaml": "mammoth_moda2_ar",
    "model_executor/stage_configs/step_audio_2.yaml": "step_audio_2",
    "model_executor/stage_configs/step_audio_2_asr.yaml": "step_audio_2_asr",
    "model_executor/stage_configs/step_audio_2_async_chunk.yaml": "step_audio_2",
    "model_executor/stage_configs/wan2_2_ti2v_dit_fp8.yaml": "wan2_2_ti2v",
    "platforms/xpu/stage_configs/voxtral_tts.yaml": "voxtral_tts",
}
#: YAMLs under */stage_configs/ of the 0.24.0 wheel already in the `stages:` schema
NOT_LEGACY = {"model_executor/stage_configs/mimo_audio.yaml"}


def _cached(dirs: list[Path]) -> Path | None:
    for d in dirs:
        found = sorted(d.glob(GLOB)) if d.is_dir() else []
        if found:
            return found[-1]
    return None


@pytest.fixture(scope="module")
def wheel() -> Path:
    """The vllm-omni 0.24.0 wheel: from ``$OMNI_PD_CACHE`` / ``.cache/wheels`` /
    ``.cache/legacy_wheels``, else ``pip download`` into the first. Skipped offline."""
    env = os.environ.get("OMNI_PD_CACHE")
    cache = Path(env) if env else ROOT / ".cache" / "wheels"
    found = _cached([cache, ROOT / ".cache" / "legacy_wheels"])
    if found:
        return found
    if os.environ.get("OMNI_PD_OFFLINE", "") == "1":
        pytest.skip("OMNI_PD_OFFLINE=1 and no vllm-omni 0.24.0 wheel cached")
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", SPEC, "--no-deps", "--only-binary", ":all:", "-d", str(cache)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    found = _cached([cache])
    assert proc.returncode == 0 and found, f"`{' '.join(cmd)}` failed:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}"
    return found


@pytest.fixture(scope="module")
def unpacked(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel's stage config YAMLs and ``entrypoints/utils.py`` (0.24.0's legacy loader)."""
    out = tmp_path_factory.mktemp("vllm_omni_024")
    with zipfile.ZipFile(wheel) as z:
        for n in z.namelist():
            if ("/stage_configs/" in n and n.endswith(".yaml")) or n == "vllm_omni/entrypoints/utils.py":
                z.extract(n, out)
    return out / "vllm_omni"


def _shipped(root: Path) -> tuple[dict[str, Path], set[str]]:
    legacy, other = {}, set()
    for p in sorted(root.rglob("stage_configs/*.yaml")):
        data = YAML(typ="safe", pure=True).load(p.read_text(encoding="utf-8"))
        rel = p.relative_to(root).as_posix()
        if isinstance(data, dict) and "stage_args" in data:
            legacy[rel] = p
        else:
            other.add(rel)
    return legacy, other


def test_every_legacy_file_of_0_24_migrates(unpacked: Path) -> None:
    legacy, other = _shipped(unpacked)
    assert set(legacy) == set(SHIPPED) and other == NOT_LEGACY
    for rel, p in legacy.items():
        doc = parse_text(p.read_text(encoding="utf-8"), rel)
        text, m = migrate_text(doc, T030, load_catalogue())
        assert m is not None and m.pipeline.name == UNCATALOGUED, rel
        tree = YAML(typ="safe", pure=True).load(text)
        assert "stage_args" not in tree and "pipeline" not in tree  # 0.30 takes the model's pipeline
        assert [s["stage_id"] for s in tree["stages"]] == [s["stage_id"] for s in doc.tree["stage_args"]]
        assert migrate_text(parse_text(text, rel), T030, load_catalogue()) == (text, None)  # idempotent



#: run by the oracle interpreter: ``python - UTILS_PY JOBS_JSON`` (JOBS: [legacy, migrated,
#: model dir]); prints one JSON line per job: each stage as 0.24.0's loader gave it
#: (``legacy``) and the same fields read from 0.30.0's typed stage config (``new``)
PROBE = r'''
import importlib.util, json, logging, os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from omni_pd.upstream.vllm_oracle import _install_standins, _first_line
_install_standins()
logging.disable(logging.WARNING)
import vllm_omni.config.pipeline_registry  # noqa: F401
from vllm.plugins import load_general_plugins
load_general_plugins()
from omegaconf import OmegaConf
from vllm_omni.config.resolver import resolve_omni_config

SUBS = ("diffusion_config", "model_config", "cache_config", "scheduler_config", "parallel_config", "load_config", "runtime_config",
        "connector_config", "pooling_config", "stage_pipeline_config")


def plain(x):
    return json.loads(json.dumps(x, default=lambda o: o.value if hasattr(o, "value") else str(o)))


def lookup(stage, key):
    """``key``'s value in the typed stage config: the first of its sub-configs (then any
    other attribute: dicts by key, objects by attribute) that has it."""
    subs = [getattr(stage, n, None) for n in SUBS]
    subs += [v for n, v in sorted(vars(stage).items()) if n not in SUBS] if hasattr(stage, "__dict__") else []
    for obj in subs:
        if isinstance(obj, dict) and key in obj:
            return plain(obj[key])
        if obj is not None and not isinstance(obj, (dict, str, int, float, bool, list, tuple)) and hasattr(obj, key):
            return plain(getattr(obj, key))
    return "<absent>"


def main(utils_path, jobs):
    spec = importlib.util.spec_from_file_location("vllm_omni_024_entrypoints_utils", utils_path)
    legacy_utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(legacy_utils)
    for legacy_file, migrated_file, model_dir in jobs:
        out = {"file": legacy_file}
        try:
            old = [OmegaConf.to_container(s, resolve=True) for s in legacy_utils.load_stage_configs_from_yaml(legacy_file)]
            out["legacy"] = [{"stage_id": s["stage_id"], "devices": (s.get("runtime") or {}).get("devices"),
                              "engine_args": s.get("engine_args") or {},
                              "default_sampling_params": s.get("default_sampling_params"),
                              "engine_input_source": s.get("engine_input_source") or [],
                              "final_output": s.get("final_output", False),
                              "final_output_type": s.get("final_output_type"),
                              "input_connectors": s.get("input_connectors"),
                              "output_connectors": s.get("output_connectors"),
                              "custom_process_input_func": s.get("custom_process_input_func")} for s in plain(old)]
            res = resolve_omni_config(model_dir, trust_remote_code=False, cli_overrides={},
                                      deploy_config_path=migrated_file, stage_overrides=None, strategy_config_path=None)
            out["pipeline"] = getattr(res.pipeline_config, "model_type", None)
            new = []
            by_id = {int(s.stage_pipeline_config.stage_id): s for s in res.stage_configs}
            for ls in out["legacy"]:
                s = by_id.get(int(ls["stage_id"]))
                if s is None:
                    new.append(None)
                    continue
                spc = s.stage_pipeline_config
                new.append({"stage_id": int(spc.stage_id), "devices": lookup(s, "devices"),
                            "engine_args": {k: lookup(s, k) for k in ls["engine_args"]},
                            "default_sampling_params": lookup(s, "default_sampling_params"),
                            "engine_input_source": list(spc.input_sources),
                            "final_output": spc.final_output, "final_output_type": spc.final_output_type,
                            "input_connectors": lookup(s, "input_connectors"),
                            "output_connectors": lookup(s, "output_connectors"),
                            "custom_process_input_func": spc.custom_process_input_func or spc.sync_process_input_func,
                            "execution_type": plain(spc.execution_type)})
            out["new"] = new
            out["verdict"] = "loaded"
        except Exception as e:
            out["verdict"] = _first_line(e)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]))
'''

FIELDS = ("devices", "default_sampling_params", "engine_input_source", "final_output", "final_output_type",
          "input_connectors", "output_connectors", "custom_process_input_func")


def differences(res: dict) -> dict[str, list]:
    """``stage N.field`` -> [0.24.0 legacy value, 0.30.0 value] for every compared field that differs."""
    out: dict[str, list] = {}
    for old, new in zip(res["legacy"], res["new"]):
        sid = old["stage_id"]
        if new is None:
            out[f"stage {sid}"] = ["present", "missing"]
            continue
        for f in FIELDS:
            if old[f] != new[f]:
                out[f"stage {sid}.{f}"] = [old[f], new[f]]
        for k, v in old["engine_args"].items():
            if new["engine_args"][k] != v:
                out[f"stage {sid}.engine_args.{k}"] = [v, new["engine_args"][k]]
    return out


@pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")
def test_migrated_0_24_files_load_in_0_30_with_the_legacy_settings(unpacked: Path, tmp_path: Path) -> None:
    legacy, _ = _shipped(unpacked)
    jobs = []
    for rel, p in legacy.items():
        text, _m = migrate_text(parse_text(p.read_text(encoding="utf-8"), rel), T030, load_catalogue())
        out = tmp_path / rel.replace("/", "__")
        out.write_text(text, encoding="utf-8")
        model = tmp_path / ("model_" + SHIPPED[rel])
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text(json.dumps({"model_type": SHIPPED[rel]}))
        jobs.append([str(p), str(out), str(model)])
    proc = subprocess.run([ORACLE, "-", str(unpacked / "entrypoints" / "utils.py"), json.dumps(jobs)], input=PROBE,
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert len(results) == len(SHIPPED)
    got = {}
    for res in results:
        rel = Path(res["file"]).relative_to(unpacked).as_posix()
        assert res["verdict"] == "loaded", (rel, res["verdict"])
        assert res["pipeline"] == SHIPPED[rel]
        got[rel] = differences(res)
    if os.environ.get("OMNI_PD_SHOW") == "1":
        print(json.dumps(got, indent=1))
    want = {rel: {k: v[:2] for k, v in d.items()} for rel, d in EXPECTED.items()}
    assert got == want
    assert all(len(v) == 3 and v[2] for d in EXPECTED.values() for v in d.values())  # each with its reason


#: file -> field -> [0.24.0 legacy loader, 0.30.0 resolved, why]
EXPECTED: dict[str, dict[str, list]] = {
    "model_executor/stage_configs/hunyuan_video_15_dit_fp8.yaml": {
        "stage 0.engine_args.trust_remote_code": [True, False, "0.30 takes trust_remote_code from the serve command (resolve_omni_config(trust_remote_code=...), False without --trust-remote-code), not from the stage"],
        "stage 0.engine_args.parallel_config": [{"tensor_parallel_size": 1}, "<absent>", "a nested dict: 0.30 reads it into the typed diffusion parallel_config (tensor_parallel_size 1, the default); the probe compares flat keys only"],
    },
    "model_executor/stage_configs/mammoth_moda2.yaml": {
        "stage 0.engine_args.worker_cls": ["vllm_omni.worker.gpu_ar_worker.GPUARWorker", None, "0.30 picks the worker class from the pipeline stage's execution_type and the platform (merge_pipeline_deploy)"],
        "stage 0.engine_args.scheduler_cls": ["vllm_omni.core.sched.omni_ar_scheduler.OmniARScheduler", None, "0.30 picks the scheduler from execution_type (+ async_scheduling) in merge_pipeline_deploy; the typed scheduler_cls stays None"],
        "stage 0.engine_args.trust_remote_code": [True, False, "0.30 takes trust_remote_code from the serve command (resolve_omni_config(trust_remote_code=...), False without --trust-remote-code), not from the stage"],
        "stage 1.custom_process_input_func": ["vllm_omni.model_executor.stage_input_processors.mammoth_moda2.ar2dit", "vllm_omni.model_executor.stage_input_processors.mammoth_moda2.ar2diffusion", "0.30's mammoth_moda2 pipeline runs stage 1 as a diffusion stage fed by ar2diffusion (0.24: an LLM generation stage fed by ar2dit)"],
        "stage 1.engine_args.model_arch": ["MammothModa2ForConditionalGeneration", "MammothModa2DiTPipeline", "0.30's mammoth_moda2 stage 1 is the diffusion pipeline class MammothModa2DiTPipeline"],
        "stage 1.engine_args.worker_cls": ["vllm_omni.worker.gpu_generation_worker.GPUGenerationWorker", None, "0.30 picks the worker class from the pipeline stage's execution_type and the platform (merge_pipeline_deploy)"],
        "stage 1.engine_args.scheduler_cls": ["vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler", None, "0.30 picks the scheduler from execution_type (+ async_scheduling) in merge_pipeline_deploy; the typed scheduler_cls stays None"],
        "stage 1.engine_args.trust_remote_code": [True, False, "0.30 takes trust_remote_code from the serve command (resolve_omni_config(trust_remote_code=...), False without --trust-remote-code), not from the stage"],
        "stage 1.engine_args.engine_output_type": ["image", None, "0.30's stage 1 is a diffusion stage: no engine_output_type"],
    },
    "model_executor/stage_configs/mammoth_moda2_ar.yaml": {
        "stage 0.engine_args.worker_cls": ["vllm_omni.worker.gpu_ar_worker.GPUARWorker", None, "0.30 picks the worker class from the pipeline stage's execution_type and the platform (merge_pipeline_deploy)"],
        "stage 0.engine_args.scheduler_cls": ["vllm_omni.core.sched.omni_ar_scheduler.OmniARScheduler", None, "0.30 picks the scheduler from execution_type (+ async_scheduling) in merge_pipeline_deploy; the typed scheduler_cls stays None"],
        "stage 0.engine_args.trust_remote_code": [True, False, "0.30 takes trust_remote_code from the serve command (resolve_omni_config(trust_remote_code=...), False without --trust-remote-code), not from the stage"],
    },
    "model_executor/stage_configs/step_audio_2.yaml": {
        "stage 0.engine_args.worker_cls": ["vllm_omni.worker.gpu_ar_worker.GPUARWorker", None, "0.30 picks the worker class from the pipeline stage's execution_type and the platform (merge_pipeline_deploy)"],
        "stage 0.engine_args.scheduler_cls": ["vllm_omni.core.sched.omni_ar_scheduler.OmniARScheduler", None, "0.30 picks the scheduler from execution_type (+ async_scheduling) in merge_pipeline_deploy; the typed scheduler_cls stays None"],
        "stage 0.engine_args.trust_remote_code": [True, False, "0.30 takes trust_remote_code from the serve command (resolve_omni_config(trust_remote_code=...), False without --trust-remote-code), not from the stage"],
        "stage 0.engine_args.engine_output_type": ["text", "latent", "0.30 registers one step_audio_2 pipeline whose thinker emits latent (text + audio tokens) for the token2wav stage; 0.24's file said text"],
        "stage 1.engine_args.worker_cls": ["vllm_omni.worker.gpu_generation_worker.GPUGenerationWorker", None, "0.30 picks the worker class from the pipeline stage's execution_type and the platform (merge_pipeline_deploy)"],
        "stage 1.engine_args.scheduler_cls": ["vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler", None, "0.30 picks the scheduler from execution_type (+ async_scheduling) in merge_pipeline_deploy; the typed scheduler_cls stays None"],
        "stage 1.engine_args.trust_remote_code": [True, False, "0.30 takes trust_remote_code from the serve command (resolve_omni_config(trust_remote_code=...), False without --trust-remote-code), not from the stage"],
    },
    "model_executor/stage_configs/step_audio_2_asr.yaml": {
        "stage 0.engine_args.worker_type": ["ar", "<absent>", "0.30 has no worker_type engine arg: the pipeline stage's execution_type (llm_ar / llm_generation) replaces it"],
        "stage 0.engine_args.scheduler_cls": ["vllm_omni.core.sched.omni_ar_scheduler.OmniARScheduler", None, "0.30 picks the scheduler from execution_type (+ async_scheduling) in merge_pipeline_deploy; the typed scheduler_cls stays None"],
        "stage 0.engine_args.trust_remote_code": [True, False, "0.30 takes trust_remote_code from the serve command (resolve_omni_config(trust_remote_code=...), False without --trust-remote-code), not from the stage"],
    },
    "model_executor/stage_configs/step_audio_2_async_chunk.yaml": {
        "stage 0.engine_args.worker_type": ["ar", "<absent>", "0.30 has no worker_type engine arg: the pipeline stage's execution_type (llm_ar / llm_generation) replaces it"],
        "stage 0.engine_args.scheduler_cls": ["vllm_omni.core.sched.omni_ar_scheduler.OmniARScheduler", None, "0.30 picks the scheduler from execution_type (+ async_scheduling) in merge_pipeline_deploy; the typed scheduler_cls stays None"],
        "stage 0.engine_args.trust_remote_code": [True, False, "0.30 takes trust_remote_code from the serve command (resolve_omni_config(trust_remote_code=...), False without --trust-remote-code), not from the stage"],
        "stage 0.engine_args.custom_process_next_stage_input_func": ["vllm_omni.model_executor.stage_input_processors.step_audio2.thinker2token2wav_async_chunk", None, "0.30's pipeline carries it as async_chunk_process_next_stage_input_func (same function); the deploy schema cannot set it"],
        "stage 1.custom_process_input_func": [None, "vllm_omni.model_executor.stage_input_processors.step_audio2.thinker2token2wav", "0.30's step_audio_2 pipeline sets sync_process_input_func thinker2token2wav on token2wav for both modes; 0.24's async-chunk file set none"],
        "stage 1.engine_args.worker_type": ["generation", "<absent>", "0.30 has no worker_type engine arg: the pipeline stage's execution_type (llm_ar / llm_generation) replaces it"],
        "stage 1.engine_args.scheduler_cls": ["vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler", None, "0.30 picks the scheduler from execution_type (+ async_scheduling) in merge_pipeline_deploy; the typed scheduler_cls stays None"],
        "stage 1.engine_args.trust_remote_code": [True, False, "0.30 takes trust_remote_code from the serve command (resolve_omni_config(trust_remote_code=...), False without --trust-remote-code), not from the stage"],
    },
    "model_executor/stage_configs/wan2_2_ti2v_dit_fp8.yaml": {
        "stage 0.engine_args.trust_remote_code": [True, False, "0.30 takes trust_remote_code from the serve command (resolve_omni_config(trust_remote_code=...), False without --trust-remote-code), not from the stage"],
        "stage 0.engine_args.parallel_config": [{"tensor_parallel_size": 1}, "<absent>", "a nested dict: 0.30 reads it into the typed diffusion parallel_config (tensor_parallel_size 1, the default); the probe compares flat keys only"],
    },
    "platforms/xpu/stage_configs/voxtral_tts.yaml": {
        "stage 0.engine_args.worker_type": ["ar", "<absent>", "0.30 has no worker_type engine arg: the pipeline stage's execution_type (llm_ar / llm_generation) replaces it"],
        "stage 0.engine_args.worker_cls": ["vllm_omni.platforms.xpu.worker.xpu_ar_worker.XPUARWorker", None, "0.30 picks the worker class from the pipeline stage's execution_type and the platform (merge_pipeline_deploy)"],
        "stage 0.engine_args.scheduler_cls": ["vllm_omni.core.sched.omni_ar_scheduler.OmniARScheduler", None, "0.30 picks the scheduler from execution_type (+ async_scheduling) in merge_pipeline_deploy; the typed scheduler_cls stays None"],
        "stage 0.engine_args.trust_remote_code": [True, False, "0.30 takes trust_remote_code from the serve command (resolve_omni_config(trust_remote_code=...), False without --trust-remote-code), not from the stage"],
        "stage 0.engine_args.distributed_executor_backend": ["mp", None, "0.30 leaves the LLM stage's executor backend unset (runtime_config None; the stage launcher decides); not traced further"],
        "stage 0.engine_args.custom_process_next_stage_input_func": ["vllm_omni.model_executor.stage_input_processors.voxtral_tts.generator2tokenizer_async_chunk", None, "0.30's pipeline carries it as async_chunk_process_next_stage_input_func (same function); the deploy schema cannot set it"],
        "stage 1.engine_args.worker_type": ["generation", "<absent>", "0.30 has no worker_type engine arg: the pipeline stage's execution_type (llm_ar / llm_generation) replaces it"],
        "stage 1.engine_args.worker_cls": ["vllm_omni.platforms.xpu.worker.xpu_generation_worker.XPUGenerationWorker", None, "0.30 picks the worker class from the pipeline stage's execution_type and the platform (merge_pipeline_deploy)"],
        "stage 1.engine_args.scheduler_cls": ["vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler", None, "0.30 picks the scheduler from execution_type (+ async_scheduling) in merge_pipeline_deploy; the typed scheduler_cls stays None"],
        "stage 1.engine_args.trust_remote_code": [True, False, "0.30 takes trust_remote_code from the serve command (resolve_omni_config(trust_remote_code=...), False without --trust-remote-code), not from the stage"],
        "stage 1.engine_args.distributed_executor_backend": ["mp", None, "0.30 leaves the LLM stage's executor backend unset (runtime_config None; the stage launcher decides); not traced further"],
    },
}
