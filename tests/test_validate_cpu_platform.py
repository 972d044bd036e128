"""``validate --platform cpu`` gives the OPD623 (nixl-kv-lease) finding ``launch --platform cpu``
gives (issue 24, "also left": validate had no cpu platform, so the CPU's NIXL lease was judged
by launch only). cpu has no ``platforms:`` overlay: the base stages are judged, as launch does.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

from omni_pd.check.validate import ValidateOptions, validate_document
from omni_pd.cli import main
from omni_pd.cli.options import LAUNCH_PLATFORM as _LAUNCH_PLATFORM
from omni_pd.compile.devices import PLATFORMS, RUN_PLATFORMS
from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.diagnostics import OmniPdError
from omni_pd.io import load_file, parse_text
from omni_pd.launch.plan import DEVICE_ENV, LaunchOptions, plan_document

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"
OMNI_CPU = ROOT / "tests" / "fixtures" / "qwen3_omni_moe_cpu.yaml"
SHORTER = ("is shorter than the 480 s NIXL KV lease cpu needs: prefill can free a request's KV blocks before decode "
           "reads them, and decode then uses blocks that may hold another request's KV")
NOTE = "presets/targets/nixl_lease.yaml platform_lease_s: cpu 480 s (and why)"
HELP = "set kv_transfer_config.kv_connector_extra_config.kv_lease_duration: 480 on both stages of the pair"


def _compiled(tmp_path: Path, src: Path, pipeline: str | None = None, lease: int | None = None) -> Path:
    res = expand_document(parse_text(src.read_text(), src.name),
                          ExpandOptions(connector="NixlConnector", kv_buffer_device="cpu"), pipeline=pipeline)
    text = res.text
    if lease is not None:
        text = re.sub(r"( *)kv_buffer_device: cpu\n", lambda m: f"{m.group(0)}{m.group(1)}kv_connector_extra_config:\n"
                      f"{m.group(1)}  kv_lease_duration: {lease}\n", text)
    out = tmp_path / "pd.yaml"
    out.write_text(text)
    return out


def _lease(diags) -> list[tuple]:
    return [(d.code, d.severity.value, d.message, d.location.line, d.location.column, d.help, list(d.notes))
            for d in diags if d.code == "OPD623"]


def _validated(path: Path, **kw) -> list[tuple]:
    return _lease(validate_document(load_file(path), ValidateOptions(**kw)).diagnostics)


def _launched(path: Path) -> list[tuple]:
    return _lease(plan_document(load_file(path), str(path), LaunchOptions(model="m", platform="cpu"))
                  .validation.diagnostics)


def _lines(path: Path, needle: str) -> list[int]:
    return [i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line]


def test_a_short_lease_in_the_file_is_the_same_two_warnings_as_launch_gives(tmp_path) -> None:
    cfg = _compiled(tmp_path, LLM, "llm", lease=60)
    l0, l1 = _lines(cfg, "kv_lease_duration: 60")
    want = [("OPD623", "warning", f"stage {i} ({role}): kv_lease_duration 60 s {SHORTER}", line, 28,
             HELP + "; `launch` writes it where the file sets none", [NOTE])
            for i, role, line in ((0, "prefill", l0), (1, "decode", l1))]
    assert _validated(cfg, platform="cpu") == want
    assert _launched(cfg) == want
    assert _validated(cfg) == []  # no --platform: a GPU run, vLLM's default lease serves


def test_an_unset_lease_on_plain_vllm_is_set_by_launch_so_neither_warns(tmp_path) -> None:
    cfg = _compiled(tmp_path, LLM, "llm")
    assert _validated(cfg, platform="cpu") == [] == _launched(cfg)


def test_an_unset_lease_on_vllm_omni_is_warned_about_by_both(tmp_path) -> None:
    cfg = _compiled(tmp_path, OMNI_CPU)
    got = _validated(cfg, platform="cpu")
    assert [(c, s, m, h) for c, s, m, _, _, h, _ in got] == [
        ("OPD623", "warning", f"stage {i} ({role}): kv_lease_duration unset (the default of vLLM 0.30 (assumed: no --vllm-version given; pass --vllm-version X.Y): 30 s) {SHORTER}",
         HELP + "; vllm-omni passes the file's kv_transfer_config as written, so `launch` cannot add it")
        for i, role in ((0, "prefill"), (1, "decode"))]
    assert got == _launched(cfg)


def test_the_lease_finding_follows_the_rule_selection(tmp_path) -> None:
    cfg = _compiled(tmp_path, LLM, "llm", lease=60)
    assert _validated(cfg, platform="cpu", rules=("OPD101",)) == []
    assert len(_validated(cfg, platform="cpu", rules=("OPD623",))) == 2


def test_validate_platform_cpu_on_the_command_line(tmp_path, capsys) -> None:
    cfg = _compiled(tmp_path, LLM, "llm", lease=60)
    rc = main(["validate", "--platform", "cpu", str(cfg)])
    out = capsys.readouterr().out
    assert rc == 0
    assert [line for line in out.splitlines() if line.startswith("warning[")] == [
        f"warning[OPD623]: stage {i} ({role}): kv_lease_duration 60 s {SHORTER}"
        for i, role in ((0, "prefill"), (1, "decode"))]
    assert out.endswith(f"{cfg}: ok (0 errors, 2 warnings, 0 info)\n")


def test_run_platforms_are_the_overlays_plus_cpu_everywhere() -> None:
    assert RUN_PLATFORMS == PLATFORMS + ("cpu",) == ("cuda", "rocm", "npu", "xpu", "musa", "cpu")
    assert tuple(DEVICE_ENV) == RUN_PLATFORMS == get_args(_LAUNCH_PLATFORM)


def test_an_unknown_platform_lists_the_run_platforms() -> None:
    with pytest.raises(OmniPdError) as e:
        validate_document(parse_text("stages:\n  - stage_id: 0\n", "t.yaml"), ValidateOptions(platform="tpu"))
    d = e.value.diagnostic
    assert (d.code, d.message, d.help) == ("OPD006", "unknown platform `tpu`", "one of: cuda, rocm, npu, xpu, musa, cpu")
