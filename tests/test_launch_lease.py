"""The NIXL KV lease the plan sets from the platform, and OPD623 where a lease is too short
(issue 24, item 4).

The CPU recipe's prefill freed the smoke request's KV when vLLM 0.30's 30 s lease ran out
(tests/fixtures/smoke_logs/prefill-0.nixl-lease-expired.log). ``--platform cpu`` now writes
``kv_connector_extra_config.kv_lease_duration: 480`` into each engine's
``--kv-transfer-config`` (plain-vLLM runtime) and says why in the plan; a lease the file
sets stays as written and is warned about when shorter; a vllm-omni pipeline (the file is
passed as written) is warned about when it sets none.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from omni_pd.check.rules.nixl_lease import facts
from omni_pd.cli import main
from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.io import load_file, parse_text
from omni_pd.launch.plan import LaunchOptions, plan_document

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"
OMNI_CPU = ROOT / "tests" / "fixtures" / "qwen3_omni_moe_cpu.yaml"
VLLM_030 = ROOT / ".cache" / "oracle" / "venv030" / "lib" / "python3.11" / "site-packages" / "vllm"

NOTE = ("NIXL KV lease: kv_lease_duration 480 s in every engine's --kv-transfer-config (--platform cpu): vLLM "
        "0.30's default lease, 30 s, ran out on a loaded CPU before decode read prefill's KV, and decode then used "
        "freed blocks (presets/targets/nixl_lease.yaml)")


def _compiled(tmp_path: Path, src: Path, pipeline: str | None = None, **kw) -> Path:
    res = expand_document(parse_text(src.read_text(), src.name), ExpandOptions(**kw), pipeline=pipeline)
    out = tmp_path / "pd.yaml"
    out.write_text(res.text)
    return out


def _plan(path: Path, platform: str):
    planned = plan_document(load_file(path), str(path), LaunchOptions(model="m", platform=platform))
    assert planned.plan is not None, [d.message for d in planned.validation.diagnostics]
    return planned


def _kv(plan) -> dict[str, dict]:
    return {p.name: json.loads(p.argv[p.argv.index("--kv-transfer-config") + 1])
            for p in plan.processes if "--kv-transfer-config" in p.argv}


def _run(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def cpu_recipe(tmp_path):
    """docs/launch.md's CPU recipe config ("A real PD run on a CPU-only machine"): llm.yaml,
    NixlConnector, host-buffer KV."""
    return _compiled(tmp_path, LLM, "llm", connector="NixlConnector", kv_buffer_device="cpu")


def test_cpu_plan_sets_480_s_on_both_engines_and_says_why(cpu_recipe):
    planned = _plan(cpu_recipe, "cpu")
    kv = _kv(planned.plan)
    assert {n: c.get("kv_connector_extra_config") for n, c in kv.items()} == {
        "prefill-0": {"kv_lease_duration": 480}, "decode-0": {"kv_lease_duration": 480}}
    assert planned.plan.notes[-1] == NOTE
    assert [d.code for d in planned.validation.diagnostics] == []  # set by the plan: nothing to warn about
    assert "kv_lease_duration" not in cpu_recipe.read_text()  # the input is not rewritten


def test_a_gpu_plan_keeps_vllms_default_lease(cpu_recipe):
    planned = _plan(cpu_recipe, "cuda")
    assert all("kv_connector_extra_config" not in c for c in _kv(planned.plan).values())
    assert not any("lease" in n for n in planned.plan.notes)


def test_mooncake_gets_no_nixl_lease(tmp_path):
    planned = _plan(_compiled(tmp_path, LLM, "llm"), "cpu")
    assert all("kv_connector_extra_config" not in c or "kv_lease_duration" not in c["kv_connector_extra_config"]
               for c in _kv(planned.plan).values())
    assert not any("lease" in n for n in planned.plan.notes)


def _with_lease(path: Path, seconds: int) -> Path:
    text = path.read_text()
    n = text.count("kv_buffer_device: cpu\n")
    assert n == 2, text
    text = re.sub(r"( *)kv_buffer_device: cpu\n",
                  lambda m: f"{m.group(0)}{m.group(1)}kv_connector_extra_config:\n{m.group(1)}  kv_lease_duration: "
                            f"{seconds}\n", text)
    path.write_text(text)
    return path


def test_a_shorter_lease_in_the_file_is_kept_and_warned_about_before_the_plan(cpu_recipe, capsys):
    cfg = _with_lease(cpu_recipe, 60)
    lines = [i for i, line in enumerate(cfg.read_text().splitlines(), 1) if "kv_lease_duration: 60" in line]
    rc, out, _ = _run(capsys, "launch", cfg, "--model", "m", "--platform", "cpu", "--dry-run", "--format", "json")
    assert rc == 0
    plan = json.loads(out)
    kv = {p["name"]: json.loads(p["argv"][p["argv"].index("--kv-transfer-config") + 1])
          for p in plan["processes"] if "--kv-transfer-config" in p["argv"]}
    assert {n: c["kv_connector_extra_config"] for n, c in kv.items()} == {
        "prefill-0": {"kv_lease_duration": 60}, "decode-0": {"kv_lease_duration": 60}}
    assert plan["notes"][-1].startswith("NIXL KV lease: 60 s, from the file; --platform cpu needs 480 s (OPD623)")
    _, _, err = _run(capsys, "launch", cfg, "--model", "m", "--platform", "cpu", "--dry-run", "--format", "json")
    heads = [line for line in err.splitlines() if line.startswith("warning[")]
    assert heads == [f"warning[OPD623]: stage {i} ({role}): kv_lease_duration 60 s is shorter than the 480 s NIXL KV "
                     "lease cpu needs: prefill can free a request's KV blocks before decode reads them, and decode "
                     "then uses blocks that may hold another request's KV" for i, role in ((0, "prefill"), (1, "decode"))]
    assert [f"{cfg}:{n}:" in err for n in lines] == [True, True]
    assert "= help: set kv_transfer_config.kv_connector_extra_config.kv_lease_duration: 480 on both stages of the " \
           "pair; `launch` writes it where the file sets none" in err
    assert err.endswith(f"{cfg}: ok (0 errors, 2 warnings, 0 info)\n")
    # validate knows no cpu platform: the file itself is fine there
    rc, vout, _ = _run(capsys, "validate", cfg)
    assert (rc, vout) == (0, f"{cfg}: ok (0 errors, 0 warnings, 0 info)\n")


def test_a_long_enough_lease_in_the_file_is_kept_silently(cpu_recipe):
    planned = _plan(_with_lease(cpu_recipe, 600), "cpu")
    assert {c["kv_connector_extra_config"]["kv_lease_duration"] for c in _kv(planned.plan).values()} == {600}
    assert planned.validation.diagnostics == []


def test_vllm_omni_on_cpu_without_a_lease_is_warned_about_since_launch_cannot_add_it(tmp_path, capsys):
    cfg = _compiled(tmp_path, OMNI_CPU, connector="NixlConnector", kv_buffer_device="cpu")
    rc, plan, out = _run(capsys, "launch", cfg, "--model", "m", "--platform", "cpu", "--dry-run")
    assert rc == 0 and plan.startswith("# launch plan: ")  # --dry-run: the findings on stderr, the plan on stdout
    assert [line for line in out.splitlines() if line.startswith("warning[")] == [
        f"warning[OPD623]: stage {i} ({role}): kv_lease_duration unset (the default of vLLM 0.30 (assumed: no --vllm-version given; pass --vllm-version X.Y): 30 s) is shorter than "
        "the 480 s NIXL KV lease cpu needs: prefill can free a request's KV blocks before decode reads them, and "
        "decode then uses blocks that may hold another request's KV" for i, role in ((0, "prefill"), (1, "decode"))]
    assert "vllm-omni passes the file's kv_transfer_config as written, so `launch` cannot add it" in out
    assert f"{cfg}: ok (0 errors, 2 warnings, 0 info)\n" in out
    rc, plan, out = _run(capsys, "launch", cfg, "--model", "m", "--platform", "cuda", "--dry-run")
    assert rc == 0 and "OPD623" not in out + plan


def test_the_lease_facts_are_vllm_030s_to_034s():
    f = facts()
    assert (f.key, f.default_s, f.since, f.until, f.platform_lease_s) == ("kv_lease_duration", 30, "0.30", "0.34",
                                                                          {"cpu": 480})
    if not VLLM_030.is_dir():
        pytest.skip("vLLM 0.30 (the oracle venv) is not installed")
    nixl = VLLM_030 / "distributed" / "kv_transfer" / "kv_connector" / "v1" / "nixl"
    for src in ("base_scheduler.py", "base_worker.py"):
        assert re.search(r'get_from_extra_config\(\s*"kv_lease_duration", 30\s*\)', (nixl / src).read_text()), src
    # the single timeout the lease replaced is gone from 0.30's envs.py
    assert "VLLM_NIXL_ABORT_REQUEST_TIMEOUT" not in (VLLM_030 / "envs.py").read_text()
