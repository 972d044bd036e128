"""``render --to DIR`` scripts map each engine's logical devices on the host that runs them
(issue 24 item 10 follow-up; omni_pd/render/scripts.py): a stage's ``devices`` are logical ids
into the visibility variable the engine inherits (vllm-omni 0.30 ``stage_runtime_setup``;
omni_pd/compile/devices.py), and the host's own ``CUDA_VISIBLE_DEVICES`` (a scheduler's: Slurm,
a device plugin) is unknown at render time. Before, the script overwrote it with the logical
ids: under ``CUDA_VISIBLE_DEVICES=4,5,6,7`` prefill ran with ``CUDA_VISIBLE_DEVICES=0,1``, on
GPUs the scheduler had not given it.

Each rendered script runs under bash with the engines and the router replaced by a fake that
records the env it got (tests/test_launch_dry_run_shell.py's recorder), ``python3`` (the
health poll) by one that answers once that process recorded: the variable unset (the ids themselves), set to
``4,5,6,7`` (entries i), set too short (the script stops before starting anything), and ROCm's
pair (``CUDA_VISIBLE_DEVICES`` decides, ``HIP_VISIBLE_DEVICES`` when it is unset; both reach the
engine).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omni_pd.cli import main
from omni_pd.compile.devices import VISIBILITY_VARS
from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.io import parse_text

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"

RECORDER = """#!{python}
import json, os, sys
port = sys.argv[sys.argv.index("--port") + 1]
with open(os.path.join({records!r}, port + ".json"), "w") as f:
    json.dump({{"argv": sys.argv, "env": dict(os.environ)}}, f)
"""


@pytest.fixture
def rendered(tmp_path, capsys, monkeypatch):
    """render(platform, *extra) -> the directory: llm.yaml split TP 2 (prefill devices
    "0,1", decode "2,3"), engines and router replaced by the recorder."""
    bin_dir, records = tmp_path / "bin", tmp_path / "records"
    bin_dir.mkdir()
    records.mkdir()
    for name in ("vllm", "router-python"):
        exe = bin_dir / name
        exe.write_text(RECORDER.format(python=sys.executable, records=str(records)))
        exe.chmod(0o755)
    # wait_healthy's poll (python3 -c CODE URL): healthy once the process on URL's port recorded
    (bin_dir / "python3").write_text(f'#!/bin/sh\nport=${{3##*:}}\ntest -f "{records}/${{port%%/*}}.json"\n')
    (bin_dir / "python3").chmod(0o755)
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(expand_document(parse_text(LLM.read_text(), LLM.name),
                                   ExpandOptions(connector="NixlConnector", tp=2), pipeline="llm").text)

    def render(platform: str = "cuda", *extra: str) -> Path:
        to = tmp_path / f"out-{platform}-{len(list(tmp_path.glob('out-*')))}"
        rc = main(["render", str(cfg), "--to", str(to), "--model", "/models/tiny", "--vllm", str(bin_dir / "vllm"),
                   "--python", str(bin_dir / "router-python"),  # the router's interpreter on the host
                   "--platform", platform, "--router-workers", "1", *extra])
        assert rc == 0, capsys.readouterr()
        capsys.readouterr()
        return to

    render.bin, render.records = bin_dir, records  # type: ignore[attr-defined]
    return render


def _run(render, to: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, dict[str, dict[str, str]]]:
    """Run ``to/local.sh`` under ``env``: the bash result and, per started process (by port:
    8100 prefill, 8200 decode, 8000 router), the visibility variables it got."""
    for f in render.records.iterdir():
        f.unlink()
    base = {"PATH": f"{render.bin}:/usr/bin:/bin", "HOME": str(render.bin), **env}
    r = subprocess.run(["bash", str(to / "local.sh")], env=base, capture_output=True, text=True, timeout=60)
    got = {f.stem: {k: v for k, v in json.loads(f.read_text())["env"].items() if k in VISIBILITY_VARS}
           for f in sorted(render.records.iterdir())}
    return r, got


def _mapping_lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith(("prefill-0 (stage 0): ", "decode-0 (stage 1): "))]


def test_unset_the_engines_get_the_logical_ids(rendered):
    to = rendered()
    r, got = _run(rendered, to, {})
    assert "this host: all 3 process(es) healthy" in r.stdout, r.stderr
    assert got == {"8000": {}, "8100": {"CUDA_VISIBLE_DEVICES": "0,1"}, "8200": {"CUDA_VISIBLE_DEVICES": "2,3"}}
    assert _mapping_lines(r.stdout) == ["prefill-0 (stage 0): devices 0,1 (CUDA_VISIBLE_DEVICES unset: the ids themselves)",
                                        "decode-0 (stage 1): devices 2,3 (CUDA_VISIBLE_DEVICES unset: the ids themselves)"]


def test_the_hosts_variable_is_indexed(rendered):
    to = rendered()
    r, got = _run(rendered, to, {"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert "this host: all 3 process(es) healthy" in r.stdout, r.stderr
    # the router is no engine: it inherits the host's variable, as launch's router does
    assert got == {"8000": {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, "8100": {"CUDA_VISIBLE_DEVICES": "4,5"},
                   "8200": {"CUDA_VISIBLE_DEVICES": "6,7"}}
    assert _mapping_lines(r.stdout) == [
        "prefill-0 (stage 0): devices 0,1 -> 4,5 (entries of CUDA_VISIBLE_DEVICES=4,5,6,7)",
        "decode-0 (stage 1): devices 2,3 -> 6,7 (entries of CUDA_VISIBLE_DEVICES=4,5,6,7)"]
    # spaces and a trailing comma are read as vllm-omni reads them (compile/devices.py parse_visible)
    r, got = _run(rendered, to, {"CUDA_VISIBLE_DEVICES": " 4, 5,6 ,7,"})
    assert (got["8100"], got["8200"]) == ({"CUDA_VISIBLE_DEVICES": "4,5"}, {"CUDA_VISIBLE_DEVICES": "6,7"})


def test_a_variable_too_short_stops_the_script_before_anything_starts(rendered):
    to = rendered()
    r, got = _run(rendered, to, {"CUDA_VISIBLE_DEVICES": "4,5"})
    assert r.returncode == 1
    assert r.stderr == ("decode-0 (stage 1): logical device 2 is outside CUDA_VISIBLE_DEVICES=4,5 on this host "
                        "(2 visible): nothing started\n")
    assert got == {}  # no engine, no router
    assert "started" not in r.stdout and list((to / "logs").iterdir()) == []


def test_rocm_cuda_visible_devices_decides_and_the_engine_gets_both(rendered):
    to = rendered("rocm")
    r, got = _run(rendered, to, {"HIP_VISIBLE_DEVICES": "4,5,6,7"})
    assert "this host: all 3 process(es) healthy" in r.stdout, r.stderr
    assert (got["8100"], got["8200"]) == ({"CUDA_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": "4,5"},
                                          {"CUDA_VISIBLE_DEVICES": "6,7", "HIP_VISIBLE_DEVICES": "6,7"})
    r, got = _run(rendered, to, {"CUDA_VISIBLE_DEVICES": "0,1,2,3", "HIP_VISIBLE_DEVICES": "4,5,6,7"})
    assert (got["8100"], got["8200"]) == ({"CUDA_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1"},
                                          {"CUDA_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "2,3"})
    r, got = _run(rendered, to, {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "6,7"})
    assert r.returncode == 1 and got == {}
    assert r.stderr == ("decode-0 (stage 1): logical device 2 is outside HIP_VISIBLE_DEVICES=6,7 on this host "
                        "(2 visible): nothing started\n")


def test_a_visible_set_given_to_render_is_written_as_planned(rendered):
    """``render --env CUDA_VISIBLE_DEVICES=4,5,6,7`` fixes the visible set at render time, as
    ``launch --env`` does: the plan maps it, the script maps nothing."""
    to = rendered("cuda", "--env", "CUDA_VISIBLE_DEVICES=4,5,6,7")
    text = (to / "local.sh").read_text()
    assert "map_devices" not in text
    r, got = _run(rendered, to, {"CUDA_VISIBLE_DEVICES": "0"})
    assert (got["8100"], got["8200"]) == ({"CUDA_VISIBLE_DEVICES": "4,5"}, {"CUDA_VISIBLE_DEVICES": "6,7"})


def test_cpu_has_no_devices_to_map(rendered):
    text = (rendered("cpu") / "local.sh").read_text()
    assert "map_devices" not in text and "VISIBLE_DEVICES" not in text
