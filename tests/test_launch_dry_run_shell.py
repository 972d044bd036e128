"""``launch --dry-run`` prints the plan as copy-pasteable commands (issue 24, conventions):
one block per process (comment header, ``VAR=value`` assignments, the command), the table
only as a summary. Before: one rich table whose cells wrapped each command mid-word.

The golden (tests/golden/launch_dry_run_llm_pd.txt, the interpreter of this run written as
``$PYTHON``) is the exact text for the tiny ``llm`` fixture split with NIXL. The bash test
runs every printed block under ``bash`` with a fake ``vllm`` and a fake router python that
record their argv and environment: each must equal the plan's ProcessSpec argv and env
exactly (the ``--kv-transfer-config`` JSON, a value with spaces and quotes, a secret read
from the environment).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from omni_pd.cli import main
from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.io import load_file, parse_text
from omni_pd.launch.plan import DEVICE_ENV, LaunchOptions, plan_document

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"
GOLDEN = ROOT / "tests" / "golden" / "launch_dry_run_llm_pd.txt"
TWO_HOSTS = ROOT / "tests" / "golden" / "placement_llm_nixl_two_hosts.yaml"
UPDATE = os.environ.get("OMNI_PD_UPDATE_GOLDEN") == "1"
#: a value bash would split or expand unless it is quoted
AWKWARD = "a b 'c' \"d\" $HOME `x` ;|&"


@pytest.fixture
def pd(tmp_path, monkeypatch) -> Path:
    for var in filter(None, DEVICE_ENV.values()):  # the devices the plan prints are the stage's own
        monkeypatch.delenv(var, raising=False)
    res = expand_document(parse_text(LLM.read_text(), LLM.name), ExpandOptions(connector="NixlConnector"),
                          pipeline="llm")
    out = tmp_path / "pd.yaml"
    out.write_text(res.text)
    return out


def _dry_run(capsys, cfg: Path, *extra: str) -> tuple[int, str, str]:
    rc = main(["launch", str(cfg), "--model", "/models/tiny", "--dry-run", "--router-workers", "1", *extra])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_dry_run_text_is_the_golden(pd, capsys):
    rc, out, err = _dry_run(capsys, pd, "--env", "HF_TOKEN=hf_not_a_real_token")
    assert rc == 0, err
    text = out.replace(sys.executable, "$PYTHON")
    if UPDATE:
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()
    assert "hf_not_a_real_token" not in out
    assert subprocess.run(["bash", "-n"], input=out, text=True).returncode == 0  # the whole text is bash


def _blocks(text: str) -> list[tuple[str, str]]:
    """(process name, block text) of every process block of a dry-run text."""
    out = []
    for chunk in text.split("\n\n"):
        lines = chunk.strip("\n").splitlines()
        if lines and lines[0].startswith("# ") and any(not ln.startswith("#") for ln in lines):
            out.append((lines[0][2:].split(" ", 1)[0], chunk.strip("\n") + "\n"))
    return out


RECORDER = """#!{python}
import json, os, sys
with open({record!r}, "w") as f:
    json.dump({{"argv": sys.argv, "env": dict(os.environ)}}, f)
"""


def _fake(bin_dir: Path, name: str, record: Path) -> Path:
    exe = bin_dir / name
    exe.write_text(RECORDER.format(python=sys.executable, record=str(record)))
    exe.chmod(0o755)
    return exe


def _run_block(block: str, bin_dir: Path, record: Path, extra_env: dict[str, str]) -> dict:
    if record.exists():
        record.unlink()
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(bin_dir), **extra_env}
    r = subprocess.run(["bash", "-c", block], env=base, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(record.read_text())


def test_every_block_run_by_bash_gives_the_plans_argv_and_env(pd, tmp_path, capsys, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "record.json"
    _fake(bin_dir, "vllm", record)
    # the router runs under omni-pd's interpreter (sys.executable): a recorder in its place
    monkeypatch.setattr(sys, "executable", str(_fake(bin_dir, "python", record)))
    secrets = {"HF_TOKEN": "hf_not_a_real_token", "API_KEY": "sk-not-real"}
    extra = ("--env", f"AWKWARD={AWKWARD}", "--env", f"HF_TOKEN={secrets['HF_TOKEN']}",
             "--engine-arg=--chat-template-content-format", f"--engine-arg={AWKWARD}",
             f"--engine-arg=--api-key={secrets['API_KEY']}")
    rc, out, err = _dry_run(capsys, pd, *extra)
    assert rc == 0, err
    planned = plan_document(load_file(pd), str(pd.resolve()), LaunchOptions(
        model="/models/tiny", router_workers=1, env={"AWKWARD": AWKWARD, "HF_TOKEN": secrets["HF_TOKEN"]},
        extra_args=("--chat-template-content-format", AWKWARD, f"--api-key={secrets['API_KEY']}")))
    plan = planned.plan
    assert plan is not None
    blocks = _blocks(out)
    assert [name for name, _ in blocks] == [p.name for p in plan.processes] == ["prefill-0", "decode-0", "router"]
    # what bash itself sets in a child (PWD, SHLVL, _) and the secrets given to the shell
    baseline = _run_block(str(bin_dir / "vllm"), bin_dir, record, secrets)["env"]
    for (name, block), spec in zip(blocks, plan.processes):
        assert "sk-not-real" not in block and "hf_not_a_real_token" not in block
        got = _run_block(block, bin_dir, record, secrets)
        assert Path(got["argv"][0]) == Path(shutil.which(spec.argv[0], path=str(bin_dir)) or spec.argv[0]), name
        assert got["argv"][1:] == list(spec.argv[1:]), name
        # `_`: bash puts each command's own path there
        added = {k: v for k, v in got["env"].items() if k != "_" and (baseline.get(k) != v or k in spec.env)}
        assert added == dict(spec.env), name
    kv = plan.process("prefill-0").argv[plan.process("prefill-0").argv.index("--kv-transfer-config") + 1]
    assert json.loads(kv)["kv_connector"] == "NixlConnector"  # the JSON arrived whole


def test_a_secret_the_shell_lacks_stops_the_block_before_the_command(pd, tmp_path, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "record.json"
    _fake(bin_dir, "vllm", record)
    rc, out, err = _dry_run(capsys, pd, "--env", "HF_TOKEN=hf_not_a_real_token")
    assert rc == 0, err
    name, block = _blocks(out)[0]
    r = subprocess.run(["bash", "-c", block], env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True,
                       text=True, timeout=60)
    assert (name, r.returncode != 0, record.exists()) == ("prefill-0", True, False)
    assert "HF_TOKEN: set HF_TOKEN in the environment of this host" in r.stderr


def test_json_keeps_its_shape_and_adds_each_process_shell_command(pd, capsys):
    from omni_pd.launch.shell import command

    rc = main(["launch", str(pd), "--model", "/models/tiny", "--dry-run", "--router-workers", "1",
               "--format", "json"])
    got = json.loads(capsys.readouterr().out)
    assert rc == 0
    planned = plan_document(load_file(pd), str(pd.resolve()), LaunchOptions(model="/models/tiny", router_workers=1))
    assert planned.plan is not None
    want = planned.plan.to_json()
    for p, spec in zip(want["processes"], planned.plan.processes):
        p["shell"] = command(spec)
    assert got == json.loads(json.dumps(want))
    assert sorted(got) == ["config", "connector", "ec_connector", "ec_storage", "entrypoint", "model", "notes",
                           "processes", "runtime"]


def test_multi_host_dry_run_prints_every_hosts_blocks_grouped_by_host(tmp_path, capsys):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  A: {address: 10.201.0.1, count: 1}\n  B: {address: 10.201.0.2, count: 1}\n"
                   "placement: {0: A, 1: B}\n")
    rc = main(["launch", str(TWO_HOSTS), "--model", "/m", "--platform", "cpu", "--inventory", str(inv),
               "--dry-run", "--router-workers", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    plan_text = out[out.index("# launch plan: "):]
    groups = [ln for ln in plan_text.splitlines() if ln.startswith("# =====")]
    assert groups == ["# ===== host A: prefill-0 =====", "# ===== host B: decode-0, router ====="]
    a, b = plan_text.split("# ===== host B")
    assert [n for n, _ in _blocks(a)] == ["prefill-0"] and [n for n, _ in _blocks(b)] == ["decode-0", "router"]
    assert "# prefill-0 (prefill) on host A\n# health: http://10.201.0.1:8100/health (up to 1200 s)\n" \
           "# waits for: nothing\nVLLM_NIXL_SIDE_CHANNEL_HOST=10.201.0.1 \\\n" in a
    assert "# router (router) on host B\n# health: http://10.201.0.2:8000/health (up to 60 s)\n" \
           "# waits for: prefill-0 (host A), decode-0 (each healthy)\n" in b
    assert plan_text.splitlines()[2:6] == [
        "# process    role     host  devices  ports                               health",
        "# prefill-0  prefill  A     -        8100 http, 18500 NIXL side channel  http://10.201.0.1:8100/health",
        "# decode-0   decode   B     -        8200 http, 18500 NIXL side channel  http://10.201.0.2:8200/health",
        "# router     router   B     -        8000 http                           http://10.201.0.2:8000/health"]
    # one host: its blocks alone, a peer only in the summary and in `waits for`
    rc = main(["launch", str(TWO_HOSTS), "--model", "/m", "--platform", "cpu", "--inventory", str(inv),
               "--dry-run", "--router-workers", "1", "--host", "B"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "# launch plan for host B: llm_pd (vllm serve per engine + router), NixlConnector" in out
    assert "# prefill-0  peer    A     -        -" in out
    assert [n for n, _ in _blocks(out)] == ["decode-0", "router"]


def test_an_env_name_that_is_not_a_shell_name_runs_through_env():
    from omni_pd.launch.shell import command, dry_run_text
    from omni_pd.launch.spec import LaunchPlan, ProcessSpec

    code = "import os, sys; print(os.environ['my.var'], os.environ['OK'], sys.argv[1:])"
    spec = ProcessSpec(name="x", argv=("/usr/bin/python3", "-c", code, "--a", "b c"), env={"my.var": "1", "OK": "2 3"})
    assert command(spec) == (
        "env \\\nmy.var=1 \\\nOK='2 3' \\\n"
        "/usr/bin/python3 -c 'import os, sys; print(os.environ['\"'\"'my.var'\"'\"'], "
        "os.environ['\"'\"'OK'\"'\"'], sys.argv[1:])' \\\n"
        "  --a 'b c'")
    r = subprocess.run(["bash", "-c", command(spec).replace("/usr/bin/python3", sys.executable, 1)],
                       capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, "1 2 3 ['--a', 'b c']\n"), r.stderr
    plan = LaunchPlan(runtime="vllm", model="m", connector="c", entrypoint="e", config="f", processes=(spec,))
    assert dry_run_text(plan, launch_form="form").endswith("\n# x (engine)\n# waits for: nothing\n"
                                                            + command(spec) + "\n")
