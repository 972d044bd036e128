"""A vllm-omni pipeline across hosts through ``omni-pd launch --inventory`` (issue 25, the runtime half).

The CPU Qwen3-Omni PD pipeline (tests/fixtures/qwen3_omni_moe_cpu.yaml expanded with the
inventory) with prefill on A and decode, Talker and Code2Wav on B: A runs vllm-omni's head
(API server, orchestrator, stage 0), B one headless process per stage pointing at A's
registration port; B's launch waits for the head's /health (which answers once every stage
registered). ``--dry-run`` prints every host, ``render --to`` writes one script per host, a
stage with replicas across hosts is still refused (OPD966). Facts: omni_pd/launch/omni_hosts.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_pd.check.context import Inventory
from omni_pd.cli import main
from omni_pd.diagnostics import OmniPdError
from omni_pd.io import load_file
from omni_pd.launch.plan import LaunchOptions, for_host, hosts_of, plan_document, without_peers

ROOT = Path(__file__).resolve().parents[1]
CPU = ROOT / "tests" / "fixtures" / "qwen3_omni_moe_cpu.yaml"
HOSTS_YAML = ("hosts:\n  A: {address: 10.202.0.1, count: 2}\n  B: {address: 10.202.0.2, count: 2}\n"
              "placement: {0: A, 1: B, 2: B, 3: B}\n")
MODEL = "/models/tiny"


@pytest.fixture
def compiled(tmp_path, capsys):
    inv, pd = tmp_path / "hosts.yaml", tmp_path / "pd.yaml"
    inv.write_text(HOSTS_YAML)
    assert main(["expand", "-q", str(CPU), "--mooncake-protocol", "tcp", "--port-base", "19570",
                 "--inventory", str(inv), "-o", str(pd)]) == 0
    capsys.readouterr()
    return pd, inv


def _plan(pd: Path, hosts: str = HOSTS_YAML, **kw):
    import yaml

    opts = LaunchOptions(**{"model": MODEL, "platform": "cpu", "port": 19710, "engine_port_base": 19400,
                            "vllm": "vllm", **kw})
    return plan_document(load_file(pd), str(pd), opts, inventory=Inventory.from_dict(yaml.safe_load(hosts)))


def test_head_on_prefills_host_and_one_headless_process_per_other_stage(compiled):
    pd, _ = compiled
    plan = _plan(pd).plan
    assert plan is not None and plan.runtime == "vllm-omni"
    assert hosts_of(plan) == ("A", "B")
    assert [(p.name, p.role, p.host) for p in plan.processes] == [
        ("omni", "omni", "A"), ("stage-1", "omni-stage", "B"), ("stage-2", "omni-stage", "B"),
        ("stage-3", "omni-stage", "B")]
    common = ("vllm", "serve", MODEL, "--omni", "--deploy-config", str(pd), "--omni-master-address", "10.202.0.1",
              "--omni-master-port", "19700")
    assert plan.process("omni").argv == common + (
        "--stage-id", "0", "--stage-init-timeout", "900", "--host", "10.202.0.1", "--port", "19710",
        "--served-model-name", MODEL)
    assert plan.process("stage-2").argv == common + ("--stage-id", "2", "--headless", "--omni-replica-address",
                                                     "10.202.0.2")
    head = plan.process("omni")
    assert [(u.port, u.purpose, u.host) for u in head.ports] == [
        (19710, "http", "10.202.0.1"), (19700, "omni master (registration)", "10.202.0.1"),
        (19570, "Mooncake bootstrap", "10.202.0.1")]
    assert head.health.url == "http://10.202.0.1:19710/health" and plan.entrypoint == "http://10.202.0.1:19710"
    # headless stages open no HTTP port: nothing probes them, nothing waits for them
    assert all(p.health is None and p.depends_on == () and p.ports == () for p in plan.processes[1:])


def test_host_b_starts_its_stages_at_once_and_gates_on_the_heads_health(compiled):
    pd, _ = compiled
    plan = _plan(pd).plan
    b = for_host(plan, "B")
    assert [(p.name, p.role) for p in b.processes] == [("omni", "peer"), ("stage-1", "omni-stage"),
                                                       ("stage-2", "omni-stage"), ("stage-3", "omni-stage")]
    assert b.process("omni").argv == () and b.process("omni").health.url == "http://10.202.0.1:19710/health"
    assert [p.name for p in without_peers(b).processes] == ["stage-1", "stage-2", "stage-3"]
    a = for_host(plan, "A")
    assert [(p.name, p.role) for p in a.processes] == [("omni", "omni")]


def test_dry_run_prints_every_hosts_commands(compiled, capsys):
    pd, inv = compiled
    rc = main(["launch", str(pd), "--inventory", str(inv), "--model", MODEL, "--platform", "cpu", "--port", "19710",
               "--engine-port-base", "19400", "--dry-run"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "# ===== host A: omni =====" in out and "# ===== host B: stage-1, stage-2, stage-3 =====" in out
    assert out.count("--headless") == 3 and out.count("--omni-master-address 10.202.0.1") == 4


def test_render_writes_one_script_per_host_and_b_waits_for_the_head(compiled, tmp_path, capsys):
    pd, inv = compiled
    to = tmp_path / "out"
    assert main(["render", str(pd), "--inventory", str(inv), "--model", MODEL, "--port", "19710",
                 "--engine-port-base", "19400", "--to", str(to)]) == 0
    capsys.readouterr()
    b = (to / "B.sh").read_text()
    assert "# Starts stage-1, stage-2, stage-3; waits for omni on A." in b
    assert b.count("--headless --omni-replica-address 10.202.0.2") == 3
    # readiness of B is the head's /health, after its stages started
    assert b.index("wait_healthy omni http://10.202.0.1:19710/health") > b.index("started stage-3")
    a = (to / "A.sh").read_text()
    assert "--stage-id 0 --stage-init-timeout 900 --host 10.202.0.1 --port 19710" in a and "--headless" not in a


def test_replicas_across_hosts_are_still_refused(compiled, tmp_path):
    pd, _ = compiled
    lines = pd.read_text().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if ln.startswith("  - stage_id: 1"))
    text = "".join(lines[:at + 1] + ["    num_replicas: 2\n"] + lines[at + 1:])
    many = tmp_path / "many.yaml"
    many.write_text(text)
    with pytest.raises(OmniPdError) as e:
        _plan(many)
    d = e.value.diagnostic
    assert (d.code, d.message) == ("OPD966", "the stages of this vllm-omni pipeline are placed on A, B: stage 1 has "
                                   "num_replicas > 1: omni-pd has not run vllm-omni's headless stages with replicas "
                                   "(--omni-dp-size-local)")


def test_one_host_placement_keeps_the_single_omni_process(compiled):
    pd, _ = compiled
    one = "hosts:\n  A: {address: 10.202.0.1, count: 2}\nplacement: {all: A}\n"
    planned = _plan(pd, one)
    if planned.plan is None:  # the file's kv_ip are the two hosts' addresses: only the plan shape matters here
        pytest.skip([d.message for d in planned.validation.diagnostics])
    assert [p.name for p in planned.plan.processes] == ["omni"]
    assert "--headless" not in planned.plan.process("omni").argv
