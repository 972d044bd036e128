"""Every legacy ``stage_args`` file vllm-omni shipped migrates, and loads in vllm-omni
0.30.0 with the stage settings that release's own legacy loader gave (issue 23).

Releases: every vllm-omni on PyPI before the schema went (0.28.0 refuses it): 0.14.0,
0.16.0, 0.18.0, 0.20.0, 0.22.0 and 0.24.0 ship legacy files (``*/stage_configs/*.yaml``,
and from 0.22.0 two under ``deploy/``); 0.26.0 still reads the schema and ships none
(:data:`SHIPPED` lists each release's files; the listing test fails on any other). Each
wheel is fetched with pip at test time (``pip download --no-deps``, cached in
``$OMNI_PD_CACHE`` or ``.cache/wheels`` as ``tests/conftest.py`` does for 0.30.0;
skipped with ``OMNI_PD_OFFLINE=1``).

The legacy side is each release's own ``load_stage_configs_from_yaml``
(``vllm_omni/entrypoints/utils.py`` unpacked from its wheel and imported as a loose
module in the oracle venv, where its imports resolve to 0.30.0's helpers: the OmegaConf
load/merge it calls is unchanged, ``config/yaml_util.py`` is the same file in 0.18.0 to
0.30.0). 0.20.0's and 0.22.0's ``utils.py`` cannot be imported there: they import
``StageConfigFactory`` from ``vllm_omni.config.stage_config``, which 0.24.0 moved to
``config/config_factory.py``; their ``load_stage_configs_from_yaml`` is the same source
text as 0.24.0's (:func:`test_loader_source_per_release` checks it), so 0.24.0's loader
stands in for them (:data:`LOADER`). 0.14.0's and 0.16.0's loader is their own, and
differs: it sets ``max_num_seqs`` from ``runtime.max_batch_size`` (1 when absent) on every
non-diffusion stage with a runtime, where 0.18.0 on (and migrate, and 0.30.0) keep the
stage's own ``max_num_seqs``; no file those releases shipped is affected (the
``max_num_seqs`` their loader gave equals 0.30.0's for every stage).

The new side is 0.30.0's ``resolve_omni_config`` on the migrated file (what ``vllm serve
--omni --deploy-config`` resolves) with the 0.30 pipeline registered for the model's
``model_type`` (:data:`MODEL_TYPE`). For models 0.30.0 no longer has (Dynin-Omni,
VoxCPM 1: :data:`GONE`) the migrated file is read by 0.30.0's ``load_deploy_config`` alone (the schema
check), its per-stage deploy settings compared, and ``resolve_omni_config``'s refusal
recorded. ONE oracle process checks every file of every release. Each field that
differs is listed in :data:`EXPECTED` (by file) or :data:`EVERYWHERE` (a difference with
one reason wherever it occurs) with the reason; any other difference fails, and so does
an entry no file needs.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from omni_pd.compile.migrate import UNCATALOGUED, key_map, migrate_text
from omni_pd.compile.pipelines import load_catalogue
from omni_pd.compile.targets import target
from omni_pd.io import parse_text

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[1]
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")
T030 = target("0.30")

_MX = "model_executor/stage_configs/"
_NPU = "platforms/npu/stage_configs/"
_ROCM = "platforms/rocm/stage_configs/"
_XPU = "platforms/xpu/stage_configs/"

#: release -> every YAML of its wheel in the legacy schema (top-level ``stage_args``)
SHIPPED: dict[str, tuple[str, ...]] = {
    "0.14.0": tuple(_MX + f for f in (
        "bagel.yaml", "bagel_multiconnector.yaml", "qwen2_5_omni.yaml", "qwen2_5_omni_multiconnector.yaml",
        "qwen3_omni_moe.yaml", "qwen3_omni_moe_async_chunk.yaml", "qwen3_omni_moe_multiconnector.yaml",
        "qwen3_tts.yaml")),
    "0.16.0": tuple(_MX + f for f in (
        "bagel.yaml", "bagel_multiconnector.yaml", "glm_image.yaml", "glm_image_muilticonnector.yaml",
        "mimo_audio.yaml", "mimo_audio_async_chunk.yaml", "qwen2_5_omni.yaml", "qwen2_5_omni_multiconnector.yaml",
        "qwen3_omni_moe.yaml", "qwen3_omni_moe_async_chunk.yaml", "qwen3_omni_moe_multiconnector.yaml",
        "qwen3_tts.yaml", "qwen3_tts_batch.yaml")) + (
        _NPU + "qwen2_5_omni.yaml", _NPU + "qwen3_omni_moe.yaml", _NPU + "qwen3_tts.yaml",
        _ROCM + "qwen2_5_omni.yaml", _ROCM + "qwen3_omni_moe.yaml",
        _XPU + "qwen2_5_omni.yaml", _XPU + "qwen3_omni_moe.yaml"),
    "0.18.0": tuple(_MX + f for f in (
        "bagel.yaml", "bagel_multiconnector.yaml", "bagel_usp2.yaml", "cosyvoice3.yaml", "fish_speech_s2_pro.yaml",
        "glm_image.yaml", "glm_image_muilticonnector.yaml", "hunyuan_image3_moe_dit.yaml",
        "hunyuan_image3_moe_dit_2gpu_fp8.yaml", "hunyuan_image_3_moe.yaml", "hunyuan_image_3_moe_2gpu.yaml",
        "mammoth_moda2.yaml", "mammoth_moda2_ar.yaml", "mimo_audio.yaml", "mimo_audio_async_chunk.yaml",
        "qwen2_5_omni.yaml", "qwen2_5_omni_multiconnector.yaml", "qwen3_omni_moe.yaml",
        "qwen3_omni_moe_async_chunk.yaml", "qwen3_omni_moe_multiconnector.yaml", "qwen3_tts.yaml",
        "qwen3_tts_batch.yaml", "qwen3_tts_no_async_chunk.yaml", "voxtral_tts.yaml")) + (
        _NPU + "hunyuan_image3_moe_dit.yaml", _NPU + "qwen2_5_omni.yaml", _NPU + "qwen3_omni_moe.yaml",
        _NPU + "qwen3_omni_moe_async_chunk.yaml", _NPU + "qwen3_tts.yaml",
        _ROCM + "qwen2_5_omni.yaml", _ROCM + "qwen3_omni_moe.yaml",
        _XPU + "bagel.yaml", _XPU + "hunyuan_image_3_moe.yaml", _XPU + "qwen2_5_omni.yaml", _XPU + "qwen3_omni_moe.yaml"),
    "0.20.0": tuple(_MX + f for f in (
        "dynin_omni.yaml", "dynin_omni_multiconnector.yaml", "hunyuan_image3_i2t.yaml", "hunyuan_image3_it2i.yaml",
        "hunyuan_image3_moe.yaml", "hunyuan_image3_moe_dit_2gpu_fp8.yaml", "hunyuan_image3_t2i.yaml",
        "hunyuan_image3_t2i_2gpu.yaml", "hunyuan_image3_t2t.yaml", "mammoth_moda2.yaml", "mammoth_moda2_ar.yaml",
        "omnivoice.yaml", "qwen3_tts_uniproc.yaml", "voxcpm.yaml", "voxcpm_async_chunk.yaml")) + (
        _NPU + "hunyuan_image3_t2i.yaml", _NPU + "voxcpm.yaml", _NPU + "voxcpm_async_chunk.yaml",
        _XPU + "hunyuan_image3_t2i.yaml", _XPU + "voxtral_tts.yaml"),
    "0.22.0": ("deploy/mammoth_moda2.yaml", "deploy/omnivoice.yaml", _MX + "mammoth_moda2.yaml",
               _MX + "mammoth_moda2_ar.yaml", _XPU + "voxtral_tts.yaml"),
    "0.24.0": ("deploy/mammoth_moda2.yaml", "deploy/omnivoice.yaml") + tuple(_MX + f for f in (
        "hunyuan_video_15_dit_fp8.yaml", "mammoth_moda2.yaml",
        "mammoth_moda2_ar.yaml", "step_audio_2.yaml", "step_audio_2_asr.yaml", "step_audio_2_async_chunk.yaml",
        "wan2_2_ti2v_dit_fp8.yaml")) + (_XPU + "voxtral_tts.yaml",),
    "0.26.0": (),
}
RELEASES = tuple(SHIPPED)
#: YAMLs under */stage_configs/ already in the `stages:` schema (the listing sees both kinds)
NOT_LEGACY = {"0.22.0": {_MX + "mimo_audio.yaml"}, "0.24.0": {_MX + "mimo_audio.yaml"}}

#: release -> the release whose ``load_stage_configs_from_yaml`` the oracle imports (see the
#: module docstring: 0.20.0's and 0.22.0's utils.py does not import on 0.30.0)
LOADER = {"0.14.0": "0.14.0", "0.16.0": "0.16.0", "0.18.0": "0.18.0", "0.20.0": "0.24.0", "0.22.0": "0.24.0",
          "0.24.0": "0.24.0"}

#: legacy file -> the model_type of its model: the vllm-omni 0.30 pipeline (registry key) it
#: belongs to, or one of :data:`GONE`
MODEL_TYPE: dict[str, str] = {
    "deploy/mammoth_moda2.yaml": "mammoth_moda2",
    "deploy/omnivoice.yaml": "omnivoice",
    _MX + "bagel.yaml": "bagel",
    _MX + "bagel_multiconnector.yaml": "bagel",
    _MX + "bagel_usp2.yaml": "bagel",
    _MX + "cosyvoice3.yaml": "cosyvoice3",
    _MX + "dynin_omni.yaml": "dynin_omni",
    _MX + "dynin_omni_multiconnector.yaml": "dynin_omni",
    _MX + "fish_speech_s2_pro.yaml": "fish_qwen3_omni",
    _MX + "glm_image.yaml": "glm_image",
    _MX + "glm_image_muilticonnector.yaml": "glm_image",
    _MX + "hunyuan_image3_i2t.yaml": "hunyuan_image3_ar",
    _MX + "hunyuan_image3_it2i.yaml": "hunyuan_image_3_moe",
    _MX + "hunyuan_image3_moe.yaml": "hunyuan_image_3_moe",
    _MX + "hunyuan_image3_moe_dit.yaml": "hunyuan_image3_dit",
    _MX + "hunyuan_image3_moe_dit_2gpu_fp8.yaml": "hunyuan_image3_dit",
    _MX + "hunyuan_image3_t2i.yaml": "hunyuan_image3_dit",
    _MX + "hunyuan_image3_t2i_2gpu.yaml": "hunyuan_image3_ar",
    _MX + "hunyuan_image3_t2t.yaml": "hunyuan_image3_ar",
    _MX + "hunyuan_image_3_moe.yaml": "hunyuan_image_3_moe",
    _MX + "hunyuan_image_3_moe_2gpu.yaml": "hunyuan_image3_ar",
    _MX + "hunyuan_video_15_dit_fp8.yaml": "hunyuan_video_15",
    _MX + "mammoth_moda2.yaml": "mammoth_moda2",
    _MX + "mammoth_moda2_ar.yaml": "mammoth_moda2_ar",
    _MX + "mimo_audio.yaml": "mimo_audio",
    _MX + "mimo_audio_async_chunk.yaml": "mimo_audio",
    _MX + "omnivoice.yaml": "omnivoice",
    _MX + "qwen2_5_omni.yaml": "qwen2_5_omni",
    _MX + "qwen2_5_omni_multiconnector.yaml": "qwen2_5_omni",
    _MX + "qwen3_omni_moe.yaml": "qwen3_omni_moe",
    _MX + "qwen3_omni_moe_async_chunk.yaml": "qwen3_omni_moe",
    _MX + "qwen3_omni_moe_multiconnector.yaml": "qwen3_omni_moe",
    _MX + "qwen3_tts.yaml": "qwen3_tts",
    _MX + "qwen3_tts_batch.yaml": "qwen3_tts",
    _MX + "qwen3_tts_no_async_chunk.yaml": "qwen3_tts",
    _MX + "qwen3_tts_uniproc.yaml": "qwen3_tts",
    _MX + "step_audio_2.yaml": "step_audio_2",
    _MX + "step_audio_2_asr.yaml": "step_audio_2_asr",
    _MX + "step_audio_2_async_chunk.yaml": "step_audio_2",
    _MX + "voxcpm.yaml": "voxcpm",
    _MX + "voxcpm_async_chunk.yaml": "voxcpm",
    _MX + "voxtral_tts.yaml": "voxtral_tts",
    _MX + "wan2_2_ti2v_dit_fp8.yaml": "wan2_2_ti2v",
    _NPU + "hunyuan_image3_moe_dit.yaml": "hunyuan_image3_dit",
    _NPU + "hunyuan_image3_t2i.yaml": "hunyuan_image3_dit",
    _NPU + "qwen2_5_omni.yaml": "qwen2_5_omni",
    _NPU + "qwen3_omni_moe.yaml": "qwen3_omni_moe",
    _NPU + "qwen3_omni_moe_async_chunk.yaml": "qwen3_omni_moe",
    _NPU + "qwen3_tts.yaml": "qwen3_tts",
    _NPU + "voxcpm.yaml": "voxcpm",
    _NPU + "voxcpm_async_chunk.yaml": "voxcpm",
    _ROCM + "qwen2_5_omni.yaml": "qwen2_5_omni",
    _ROCM + "qwen3_omni_moe.yaml": "qwen3_omni_moe",
    _XPU + "bagel.yaml": "bagel",
    _XPU + "hunyuan_image3_t2i.yaml": "hunyuan_image_3_moe",
    _XPU + "hunyuan_image_3_moe.yaml": "hunyuan_image_3_moe",
    _XPU + "qwen2_5_omni.yaml": "qwen2_5_omni",
    _XPU + "qwen3_omni_moe.yaml": "qwen3_omni_moe",
    _XPU + "voxtral_tts.yaml": "voxtral_tts",
}
#: model_type -> (resolve_omni_config's refusal of the migrated file, why): models 0.30.0
#: registers no pipeline for; their migrated files are checked against 0.30.0's
#: load_deploy_config alone
GONE: dict[str, tuple[str, str]] = {
    "dynin_omni": ("ValueError: Model 'MODEL' did not resolve to a registered Omni pipeline or a supported diffusion model.",
                   "vllm-omni 0.30.0 removed Dynin-Omni (0.28.0's config/pipeline_registry.py still registers dynin_omni)"),
    "voxcpm": ("ValueError: Model 'MODEL' did not resolve to a registered Omni pipeline or a supported diffusion model.",
               "VoxCPM 1 (VoxCPMForConditionalGeneration, 0.20.0's model registry) left vllm-omni by 0.24.0; 0.30.0 registers only VoxCPM 2 (voxcpm2)"),
}


# --- the wheels ---------------------------------------------------------------------

def _glob(release: str) -> str:
    return f"vllm_omni-{release}-*.whl"


def _cached(dirs: list[Path], release: str) -> Path | None:
    for d in dirs:
        found = sorted(d.glob(_glob(release))) if d.is_dir() else []
        if found:
            return found[-1]
    return None


def _cache_dir() -> Path:
    env = os.environ.get("OMNI_PD_CACHE")
    return Path(env) if env else ROOT / ".cache" / "wheels"


def wheel_path(release: str) -> Path:
    """The vllm-omni ``release`` wheel: from ``$OMNI_PD_CACHE`` / ``.cache/wheels`` /
    ``.cache/legacy_wheels``, else ``pip download --no-deps`` into the first, under the
    cache's ``.download.lock`` (as ``tests/conftest.py``: two xdist workers never read a
    wheel pip is still writing). Skips the test offline; fails it with pip's output."""
    import fcntl

    cache = _cache_dir()
    dirs = [cache, ROOT / ".cache" / "legacy_wheels"]
    if os.environ.get("OMNI_PD_OFFLINE", "") == "1":
        found = _cached(dirs, release)
        if found is None:
            pytest.skip(f"OMNI_PD_OFFLINE=1 and no vllm-omni {release} wheel cached")
        return found
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".download.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _cached(dirs, release)
        if found:
            return found
        cmd = [sys.executable, "-m", "pip", "download", f"vllm-omni=={release}", "--no-deps", "--only-binary", ":all:",
               "-d", str(cache)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        found = _cached([cache], release)
    assert proc.returncode == 0 and found, f"`{' '.join(cmd)}` failed:\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}"
    return found


_UNPACKED: dict[str, Path] = {}


def unpacked(release: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``vllm_omni`` folder of the ``release`` wheel: its YAMLs and
    ``entrypoints/utils.py`` (the legacy loader), unpacked once per session."""
    if release not in _UNPACKED:
        out = tmp_path_factory.mktemp("vllm_omni_" + release.replace(".", ""))
        with zipfile.ZipFile(wheel_path(release)) as z:
            for n in z.namelist():
                if n.startswith("vllm_omni/") and (n.endswith(".yaml") or n == "vllm_omni/entrypoints/utils.py"):
                    z.extract(n, out)
        _UNPACKED[release] = out / "vllm_omni"
    return _UNPACKED[release]


def shipped(root: Path) -> tuple[dict[str, Path], set[str]]:
    """(every legacy YAML of the unpacked wheel ``root`` by its path there, the YAMLs under
    ``*/stage_configs/`` that are not legacy)."""
    legacy, other = {}, set()
    for p in sorted(root.rglob("*.yaml")):
        data = YAML(typ="safe", pure=True).load(p.read_text(encoding="utf-8"))
        rel = p.relative_to(root).as_posix()
        if isinstance(data, dict) and "stage_args" in data:
            legacy[rel] = p
        elif "/stage_configs/" in "/" + rel:
            other.add(rel)
    return legacy, other


def _loader_source(utils_py: Path) -> str:
    text = utils_py.read_text(encoding="utf-8")
    fn = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == "load_stage_configs_from_yaml")
    return ast.get_source_segment(text, fn)


# --- migrating: no oracle -------------------------------------------------------------

@pytest.mark.parametrize("release", RELEASES)
def test_every_legacy_file_of_the_release_migrates(release: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    root = unpacked(release, tmp_path_factory)
    legacy, other = shipped(root)
    assert sorted(legacy) == sorted(SHIPPED[release]) and other == NOT_LEGACY.get(release, set())
    for rel, p in legacy.items():
        doc = parse_text(p.read_text(encoding="utf-8"), rel)
        text, m = migrate_text(doc, T030, load_catalogue())  # a key it cannot map raises (OPD971)
        assert m is not None, rel
        tree = YAML(typ="safe", pure=True).load(text)
        assert "stage_args" not in tree and "modes" not in tree
        # a catalogued pipeline is named (omni-pd's catalogue: the Qwen omni models); for any other,
        # 0.30 takes the model's pipeline
        assert tree.get("pipeline") == (None if m.pipeline.name == UNCATALOGUED else m.pipeline.name), rel
        assert m.pipeline.name in (UNCATALOGUED, MODEL_TYPE[rel]), rel
        assert [s["stage_id"] for s in tree["stages"]] == [s["stage_id"] for s in doc.tree["stage_args"]]
        assert migrate_text(parse_text(text, rel), T030, load_catalogue()) == (text, None)  # idempotent


@pytest.mark.parametrize("release", [r for r in LOADER if LOADER[r] != r])
def test_loader_source_per_release(release: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The stand-in loader is the release's own, word for word (so comparing against it
    is comparing against the release)."""
    own = _loader_source(unpacked(release, tmp_path_factory) / "entrypoints" / "utils.py")
    stand_in = _loader_source(unpacked(LOADER[release], tmp_path_factory) / "entrypoints" / "utils.py")
    assert own == stand_in


def test_the_loaders_differ_where_the_docstring_says(tmp_path_factory: pytest.TempPathFactory) -> None:
    """0.14.0 and 0.16.0 set max_num_seqs from runtime.max_batch_size; 0.18.0 on do not."""
    src = {r: _loader_source(unpacked(r, tmp_path_factory) / "entrypoints" / "utils.py") for r in set(LOADER.values())}
    assert {r for r, s in src.items() if 'base_engine_args_tmp["max_num_seqs"] = max_batch_size' in s} == {"0.14.0", "0.16.0"}


# --- loading in 0.30.0: one oracle process for every release ---------------------------

#: run by the oracle interpreter: ``python - JOBS_JSON`` (JOBS: [release, loader utils.py,
#: legacy, migrated, model dir, whether 0.30.0 registers its model_type]); prints one JSON line per job: each
#: stage as the release's loader gave it (``legacy``) and the same fields read from 0.30.0's
#: typed stage config (``new``), or for a model 0.30.0 registers no pipeline for, from its
#: deploy config (``verdict`` "deploy only", ``refused``: resolve_omni_config's error)
PROBE = r'''
import dataclasses, importlib.util, json, logging, os, sys
os.environ.setdefault("HF_HUB_OFFLINE", "1")
from omni_pd.upstream.vllm_oracle import _install_standins, _first_line
_install_standins()
logging.disable(logging.WARNING)
import vllm_omni.config.pipeline_registry  # noqa: F401
from vllm.plugins import load_general_plugins
load_general_plugins()
from omegaconf import OmegaConf
from vllm_omni.config.resolver import resolve_omni_config
from vllm_omni.config.stage_config import load_deploy_config

SUBS = ("diffusion_config", "model_config", "cache_config", "scheduler_config", "parallel_config", "load_config", "runtime_config",
        "connector_config", "pooling_config", "stage_pipeline_config")
LOADERS = {}


def plain(x):
    return json.loads(json.dumps(x, default=lambda o: o.value if hasattr(o, "value") else str(o)))


#: engine args 0.30.0's typed stage config keeps under another name: the quantization method
#: (quantization_config: the name, or a vLLM QuantizationConfig), and the processor functions
#: merge_pipeline_deploy picked for the file's async_chunk (_select_processor_funcs)
ALIASES = {"quantization": "quantization_config",
           "custom_process_input_func": "_resolved_custom_process_input_func",
           "custom_process_next_stage_input_func": "_resolved_custom_process_next_stage_input_func"}


def lookup(stage, key):
    """``key``'s value in the typed stage config: its :data:`ALIASES` attribute, else the
    first of its sub-configs (then any other attribute: dicts by key, objects by attribute)
    that has it."""
    if key in ALIASES and hasattr(stage, ALIASES[key]):
        v = getattr(stage, ALIASES[key])
        return plain(v.get_name() if hasattr(v, "get_name") else v)
    subs = [getattr(stage, n, None) for n in SUBS]
    subs += [v for n, v in sorted(vars(stage).items()) if n not in SUBS] if hasattr(stage, "__dict__") else []
    for obj in subs:
        if isinstance(obj, dict) and key in obj:
            return plain(obj[key])
        if obj is not None and not isinstance(obj, (dict, str, int, float, bool, list, tuple)) and hasattr(obj, key):
            return plain(getattr(obj, key))
    return "<absent>"


def lookup_deploy(dc, ds, key):
    """``key`` in a StageDeployConfig ``ds``: its field, else its engine_extras; a stage
    async_chunk left None is the DeployConfig ``dc``'s."""
    if key == "async_chunk" and ds.async_chunk is None:
        return plain(dc.async_chunk)
    if key in {f.name for f in dataclasses.fields(ds)}:
        return plain(getattr(ds, key))
    return plain(ds.engine_extras.get(key, "<absent>"))


def loader(path):
    if path not in LOADERS:
        spec = importlib.util.spec_from_file_location("legacy_utils_%d" % len(LOADERS), path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        LOADERS[path] = mod.load_stage_configs_from_yaml
    return LOADERS[path]


def legacy_stages(load, legacy_file):
    old = plain([OmegaConf.to_container(s, resolve=True) for s in load(legacy_file)])
    return [{"stage_id": s["stage_id"], "devices": (s.get("runtime") or {}).get("devices"),
             "engine_args": s.get("engine_args") or {},
             "default_sampling_params": s.get("default_sampling_params"),
             "engine_input_source": s.get("engine_input_source") or [],
             "final_output": s.get("final_output", False),
             "final_output_type": s.get("final_output_type"),
             "requires_multimodal_data": (s.get("runtime") or {}).get("requires_multimodal_data", False),
             "input_connectors": s.get("input_connectors"),
             "output_connectors": s.get("output_connectors"),
             "custom_process_input_func": s.get("custom_process_input_func")} for s in old]


def resolved(legacy, migrated_file, model_dir):
    res = resolve_omni_config(model_dir, trust_remote_code=False, cli_overrides={},
                              deploy_config_path=migrated_file, stage_overrides=None, strategy_config_path=None)
    by_id = {int(s.stage_pipeline_config.stage_id): s for s in res.stage_configs}
    new = []
    for ls in legacy:
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
                    "requires_multimodal_data": spc.requires_multimodal_data,
                    "input_connectors": lookup(s, "input_connectors"),
                    "output_connectors": lookup(s, "output_connectors"),
                    "custom_process_input_func": lookup(s, "custom_process_input_func")})
    return getattr(res.pipeline_config, "model_type", None), new


def deploy_only(legacy, migrated_file):
    dc = load_deploy_config(migrated_file)
    by_id = {int(s.stage_id): s for s in dc.stages}
    new = []
    for ls in legacy:
        ds = by_id.get(int(ls["stage_id"]))
        new.append(None if ds is None else {
            "stage_id": int(ds.stage_id), "devices": plain(ds.devices),
            "engine_args": {k: lookup_deploy(dc, ds, k) for k in ls["engine_args"]},
            **{f: lookup_deploy(dc, ds, f) for f in ("default_sampling_params", "input_connectors", "output_connectors")}})
    return new


def main(jobs):
    for release, utils_path, legacy_file, migrated_file, model_dir, registered in jobs:
        out = {"release": release, "file": legacy_file}
        try:
            out["legacy"] = legacy_stages(loader(utils_path), legacy_file)
            if not registered:
                out["new"] = deploy_only(out["legacy"], migrated_file)
                try:
                    resolved(out["legacy"], migrated_file, model_dir)
                    out["refused"] = None
                except Exception as e:
                    out["refused"] = _first_line(e).replace(model_dir, "MODEL")
                out["verdict"] = "deploy only"
            else:
                out["pipeline"], out["new"] = resolved(out["legacy"], migrated_file, model_dir)
                out["verdict"] = "loaded"
        except Exception as e:
            out["verdict"] = _first_line(e)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
'''

FIELDS = ("devices", "default_sampling_params", "engine_input_source", "final_output", "final_output_type",
          "requires_multimodal_data", "input_connectors", "output_connectors", "custom_process_input_func")


#: engine args the pipeline owns in the `stages:` schema (key map rows check / pipeline /
#: scheduler: migrate drops them): a deploy-only result has nothing to compare them with
PIPELINE_OWNED = frozenset(str(r["key"]).split(".", 1)[1] for r in key_map()["stage"]
                           if r["action"] in ("check", "pipeline", "scheduler") and str(r["key"]).startswith("engine_args."))


def differences(res: dict) -> dict[str, list]:
    """``stage N.field`` -> [legacy value, 0.30.0 value] for every compared field that differs
    (a deploy-only result has no pipeline: only what its deploy config carries)."""
    out: dict[str, list] = {}
    owned = PIPELINE_OWNED if res["verdict"] == "deploy only" else frozenset()
    for old, new in zip(res["legacy"], res["new"]):
        sid = old["stage_id"]
        if new is None:
            out[f"stage {sid}"] = ["present", "missing"]
            continue
        for f in FIELDS:
            if f in new and old[f] != new[f]:
                out[f"stage {sid}.{f}"] = [old[f], new[f]]
        for k, v in old["engine_args"].items():
            if k not in owned and new["engine_args"][k] != v:
                out[f"stage {sid}.engine_args.{k}"] = [v, new["engine_args"][k]]
    return out


@pytest.fixture(scope="module")
def oracle_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict]]:
    """release -> legacy file -> the oracle's answer for it: every file of every release
    in one oracle process (importing vLLM and vllm-omni is most of its time)."""
    tmp = tmp_path_factory.mktemp("migrated")
    jobs = []
    for release in LOADER:
        root = unpacked(release, tmp_path_factory)
        utils_py = unpacked(LOADER[release], tmp_path_factory) / "entrypoints" / "utils.py"
        for rel in SHIPPED[release]:
            p = root / rel
            text, _m = migrate_text(parse_text(p.read_text(encoding="utf-8"), rel), T030, load_catalogue())
            out = tmp / (release + "__" + rel.replace("/", "__"))
            out.write_text(text, encoding="utf-8")
            mt = MODEL_TYPE[rel]
            model = tmp / ("model_" + mt)
            model.mkdir(exist_ok=True)
            (model / "config.json").write_text(json.dumps({"model_type": mt}))
            jobs.append([release, str(utils_py), str(p), str(out), str(model), mt not in GONE])
    proc = subprocess.run([ORACLE, "-", json.dumps(jobs)], input=PROBE, capture_output=True, text=True, timeout=1800,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert len(results) == len(jobs), proc.stderr[-3000:]
    got: dict[str, dict[str, dict]] = {r: {} for r in LOADER}
    for res in results:
        rel = Path(res["file"]).relative_to(unpacked(res["release"], tmp_path_factory)).as_posix()
        got[res["release"]][rel] = res
    if os.environ.get("OMNI_PD_DUMP"):
        Path(os.environ["OMNI_PD_DUMP"]).write_text(json.dumps(got))
    return got


def explained(rel: str, diffs: dict[str, list]) -> tuple[dict[str, list], set[str]]:
    """(the differences of ``rel`` :data:`EVERYWHERE` does not explain, the rules used)."""
    left, used = {}, set()
    for k, v in diffs.items():
        field = k.split(".", 1)[1] if "." in k else k
        rule = next((n for n, (f, old, new, _why) in EVERYWHERE.items()
                     if f == field and (new is ANY or new == v[1]) and (old is ANY or old == v[0])), None)
        if rule is not None:
            used.add(rule)
        else:
            left[k] = v
    return left, used


@pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")
@pytest.mark.parametrize("release", list(LOADER))
def test_migrated_files_load_in_0_30_with_the_legacy_settings(release: str, oracle_results: dict) -> None:
    got = {}
    for rel, res in oracle_results[release].items():
        mt = MODEL_TYPE[rel]
        if mt in GONE:
            assert (res["verdict"], res["refused"]) == ("deploy only", GONE[mt][0]), rel
        else:
            assert (res["verdict"], res["pipeline"]) == ("loaded", mt), rel
        left, _used = explained(rel, differences(res))
        if left:
            got[rel] = left
    if os.environ.get("OMNI_PD_SHOW") == "1":
        print(json.dumps(got, indent=1))
    want = {rel: {k: v[:2] for k, v in d.items()} for rel, d in EXPECTED.get(release, {}).items()}
    assert got == want
    assert all(len(v) == 3 and v[2] for d in EXPECTED.get(release, {}).values() for v in d.values())  # each with its reason


@pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")
def test_every_everywhere_rule_is_needed(oracle_results: dict) -> None:
    """An :data:`EVERYWHERE` rule no file of any release needs is dead: it fails."""
    used = set()
    for by_file in oracle_results.values():
        for rel, res in by_file.items():
            used |= explained(rel, differences(res))[1]
    assert used == set(EVERYWHERE)
    assert all(why for *_x, why in EVERYWHERE.values()) and all(why for _m, why in GONE.values())


#: stands for "any value" in an :data:`EVERYWHERE` rule
ANY = object()
_P = "vllm_omni.model_executor.stage_input_processors."
_TRUST = ("0.30 takes trust_remote_code from the serve command (resolve_omni_config(trust_remote_code=...), False "
          "without --trust-remote-code, which migrate's serve line adds), not from the stage")
_SCHED = ("0.30 picks the scheduler from the pipeline stage's execution_type (+ async_scheduling) in "
          "merge_pipeline_deploy; the typed scheduler_cls stays None")
_PROC = ("0.30's pipeline owns the processor functions (StagePipelineConfig; the deploy schema cannot set them): "
         "its sync input function is the `_token_only` variant, the upstream stage pushing its full payload through "
         "custom_process_next_stage_input_func `*_full_payload`; a stage fed that way has none")

#: rule -> (field, legacy value or ANY, 0.30.0 value or ANY, why): differences with one reason wherever they occur
EVERYWHERE: dict[str, tuple[str, object, object, str]] = {
    "trust_remote_code": ("engine_args.trust_remote_code", True, False, _TRUST),
    "AR scheduler": ("engine_args.scheduler_cls", "vllm_omni.core.sched.omni_ar_scheduler.OmniARScheduler", None, _SCHED),
    "generation scheduler": ("engine_args.scheduler_cls",
                             "vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler", None, _SCHED),
    "worker_cls": ("engine_args.worker_cls", ANY, None, "0.30 picks the worker class from the pipeline stage's "
                   "execution_type and the platform (merge_pipeline_deploy); the typed worker_cls stays None"),
    "worker_type": ("engine_args.worker_type", ANY, "<absent>", "0.30 has no worker_type engine arg: the pipeline "
                    "stage's execution_type (llm_ar / llm_generation) replaces it"),
    "distributed_executor_backend": (
        "engine_args.distributed_executor_backend", "mp", None,
        "0.30 makes distributed_executor_backend pipeline-wide (stage_config.py _PIPELINE_WIDE_ENGINE_FIELDS, a "
        "top-level DeployConfig key): the typed runtime_config of a stage that sets it itself stays None (seen "
        "here; whether a launcher still reads the stage's engine_extras value was not traced)"),
    "diffusion engine_output_type": ("engine_args.engine_output_type", "image", None,
                                     "a 0.30 diffusion stage has no engine_output_type (the pipeline's stage sets none)"),
    "nested parallel_config": ("engine_args.parallel_config", ANY, "<absent>",
                               "a nested dict: 0.30 reads it into the typed diffusion parallel_config; the probe "
                               "compares flat keys only"),
    "requires_multimodal_data": ("requires_multimodal_data", False, True,
                                 "0.30's pipeline marks the stage requires_multimodal_data "
                                 "(StagePipelineConfig, pipeline-owned); the legacy file did not set "
                                 "runtime.requires_multimodal_data (default false)"),
    "devices as a string": ("devices", 0, "0", "migrate writes the number as a string (0.30's "
                            "OmniStageRuntimeConfig.devices is a str); the legacy set_stage_devices read 0 as device "
                            "0: the same device"),
    "diffusion dtype": ("engine_args.dtype", "float32", "torch.float32",
                        "the same dtype: a 0.30 diffusion stage's typed config holds the torch.dtype"),
    "diffusion cache_backend": ("engine_args.cache_backend", None, "none",
                                "0.30's diffusion config spells the legacy null (no cache backend) as the string none"),
    "diffusion cache_config": ("engine_args.cache_config", None, ANY,
                               "with no cache backend 0.30 fills the typed DiffusionCacheConfig with its defaults "
                               "(unused: cache_backend none)"),
    "hunyuan diffusion stage name": ("engine_args.model_stage", "diffusion", "dit",
                                     "0.30's hunyuan_image_3_moe pipeline names its diffusion stage dit "
                                     "(model_stage is pipeline-owned)"),
    "bagel class": ("engine_args.model_arch", "BagelForConditionalGeneration", "OmniBagelForConditionalGeneration",
                    "0.18.0 renamed the Bagel thinker class; 0.30's bagel pipeline names the new one"),
    "mimo_audio class": ("engine_args.model_arch", "MiMoAudioForConditionalGeneration", "MiMoAudioModel",
                         "0.30's mimo_audio pipeline names MiMoAudioModel (model_arch is pipeline-owned)"),
    "mammoth_moda2 DiT class": ("engine_args.model_arch", "MammothModa2ForConditionalGeneration",
                                "MammothModa2DiTPipeline", "0.30's mammoth_moda2 stage 1 is the diffusion pipeline "
                                "class MammothModa2DiTPipeline"),
    "mammoth_moda2 DiT input": ("custom_process_input_func", _P + "mammoth_moda2.ar2dit", _P + "mammoth_moda2.ar2diffusion",
                                "0.30's mammoth_moda2 pipeline runs stage 1 as a diffusion stage fed by ar2diffusion "
                                "(legacy: an LLM generation stage fed by ar2dit)"),
    "hunyuan DiT input": ("custom_process_input_func", None, _P + "hunyuan_image3.ar2diffusion",
                          "0.30's hunyuan_image_3_moe pipeline feeds its DiT from the AR stage through ar2diffusion "
                          "(the legacy file gave the DiT no input function)"),
    "qwen2_5_omni talker input": ("custom_process_input_func", _P + "qwen2_5_omni.thinker2talker",
                                  _P + "qwen2_5_omni.thinker2talker_token_only", _PROC),
    "qwen2_5_omni code2wav input": ("custom_process_input_func", None, _P + "qwen2_5_omni.talker2code2wav_token_only", _PROC),
    "qwen3_omni talker input": ("custom_process_input_func", _P + "qwen3_omni.thinker2talker",
                                _P + "qwen3_omni.thinker2talker_token_only", _PROC),
    "qwen3_omni code2wav input": ("custom_process_input_func", _P + "qwen3_omni.talker2code2wav", None, _PROC),
    "mimo_audio code2wav input": ("custom_process_input_func", _P + "mimo_audio.llm2code2wav",
                                  _P + "mimo_audio.llm2code2wav_token_only", _PROC),
    "cosyvoice3 code2wav input": ("custom_process_input_func", _P + "cosyvoice3.text2flow",
                                  _P + "cosyvoice3.text2flow_token_only", _PROC),
    "qwen3_tts code2wav input": ("custom_process_input_func", _P + "qwen3_tts.talker2code2wav",
                                 _P + "qwen3_tts.talker2code2wav_token_only", _PROC),
}

_MIMO_SAMPLING = {"temperature": 0.6, "top_p": 0.95, "top_k": 50, "max_tokens": 18192, "seed": 42, "detokenize": True,
                  "repetition_penalty": 1.1}
_MIMO = {"stage 0.default_sampling_params": [
    _MIMO_SAMPLING, {**_MIMO_SAMPLING, "stop_token_ids": [151671, 151645]},
    "0.30's mimo_audio pipeline adds its sampling_constraints (stop_token_ids) to the file's defaults"]}
_GLM_MULTI = {"stage 0.engine_args.hf_config_name": [
    "vision_language_encoder", None, "0.30's glm_image pipeline sets no hf_config_name on the AR stage "
    "(pipeline-owned; the legacy multiconnector file named vision_language_encoder, glm_image.yaml none)"]}
_MODES = {"stage 1.engine_input_source": [
    [], [0], "the legacy file ran its DiT alone (top-level `modes`: text-to-image = stage 1 only, migrate drops it "
    "with a note); 0.30's hunyuan_image_3_moe pipeline feeds the DiT from the AR stage"]}

#: release -> file -> field -> [legacy loader, 0.30.0, why]
EXPECTED: dict[str, dict[str, dict[str, list]]] = {
    "0.14.0": {
        _MX + "qwen3_tts.yaml": {
            "stage 0.default_sampling_params": [None, {"detokenize": False, "stop_token_ids": [2150]},
                                                "0.30's qwen3_tts talker stage carries sampling_constraints"],
            "stage 0.final_output": [True, False, "0.14.0's Qwen3-TTS was one stage giving audio; 0.30's qwen3_tts "
                                     "pipeline adds a code2wav stage 1 (the final audio output), which the file lacks"],
            "stage 0.final_output_type": ["audio", None, "the same: stage 0 is no final output in 0.30"],
            "stage 0.engine_args.engine_output_type": ["audio", "latent", "the same: 0.30's talker emits latent "
                                                       "codes for code2wav"],
            "stage 0.engine_args.model_arch": ["Qwen3TTSForConditionalGeneration", "Qwen3TTSTalkerForConditionalGeneration",
                                               "the same: 0.30's talker class"],
        },
    },
    "0.16.0": {_MX + "glm_image_muilticonnector.yaml": _GLM_MULTI, _MX + "mimo_audio.yaml": _MIMO,
               _MX + "mimo_audio_async_chunk.yaml": _MIMO},
    "0.18.0": {
        _MX + "cosyvoice3.yaml": {
            "stage 0.default_sampling_params": [None, {"stop_token_ids": [6562]},
                                                "0.30's cosyvoice3 pipeline adds its sampling_constraints"],
            "stage 0.engine_args.model_stage": ["talker", "cosyvoice3_talker", "0.30's cosyvoice3 pipeline renamed "
                                                "the stages (model_stage is pipeline-owned)"],
            "stage 1.engine_args.model_stage": ["code2wav", "cosyvoice3_code2wav", "the same rename"],
        },
        _MX + "glm_image_muilticonnector.yaml": _GLM_MULTI,
        _MX + "hunyuan_image_3_moe.yaml": _MODES,
        _MX + "mimo_audio.yaml": _MIMO,
        _MX + "mimo_audio_async_chunk.yaml": _MIMO,
        _XPU + "hunyuan_image_3_moe.yaml": _MODES,
    },
    "0.20.0": {
        _MX + "hunyuan_image3_it2i.yaml": {
            "stage 0.final_output": [False, True, "0.30's hunyuan_image_3_moe pipeline makes the AR stage a final text "
                                     "output too (it serves i2t and t2t); the it2i file had only the image"],
            "stage 0.final_output_type": [None, "text", "the same"],
        },
        _XPU + "hunyuan_image3_t2i.yaml": _MODES,
    },
    "0.24.0": {
        _MX + "step_audio_2.yaml": {
            "stage 0.engine_args.engine_output_type": [
                "text", "latent", "0.30 registers one step_audio_2 pipeline whose thinker emits latent (text + audio "
                "tokens) for the token2wav stage; 0.24's file said text"],
        },
    },
}
