"""One instance spanning hosts (issue 25, "goldens for ... TP-across-nodes renderings
(scripts and manifests)"): ``placement: {0: [A, B], 1: C}`` in the inventory.

``expand --inventory`` writes the prefill stage with ``nnodes: 2`` and one host's devices
(TP 4 over two hosts of two GPUs: ``devices: "0,1"``); ``render --to DIR`` writes host A's
script with node rank 0 (the API server, ``--nnodes 2 --node-rank 0 --master-addr`` its own
address), host B's with the headless workers of node rank 1 (no API-server flags, ready when
A's ``/health`` answers) and host C's with decode and the router. Golden:
tests/golden/render_scripts_tp_across_nodes/. The same plan renders to Kubernetes as a
LeaderWorkerSet of size 2 whose pods each ask for two GPUs, and validates. What omni-pd does
not span (a vllm-omni stage, an xPyD side, a world the host count does not divide, a
config whose ``nnodes`` the placement does not match) is refused with the rule that says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_pd.check.context import Inventory
from omni_pd.cli import main
from omni_pd.compile.placement import PlacementError, Placement, host_devices, span_devices
from omni_pd.io import load_file

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"
GOLDEN = ROOT / "tests" / "golden" / "render_scripts_tp_across_nodes"
HOSTS_YAML = ("hosts:\n  A: {address: 10.201.0.1, count: 2}\n  B: {address: 10.201.0.2, count: 2}\n"
              "  C: {address: 10.201.0.3, count: 1}\nplacement: {0: [A, B], 1: C}\n")
UPDATE = os.environ.get("OMNI_PD_UPDATE_GOLDEN") == "1"


def _expand(tmp_path: Path, capsys, hosts: str = HOSTS_YAML, *extra: str) -> tuple[int, Path, Path, str]:
    inv = tmp_path / "hosts.yaml"
    inv.write_text(hosts)
    pd = tmp_path / "pd.yaml"
    rc = main(["expand", "-q", str(LLM), "--pipeline", "llm", "--connector", "NixlConnector", "--prefill-tp", "4",
               "--inventory", str(inv), "-o", str(pd), *extra])
    return rc, inv, pd, capsys.readouterr().err


def test_expand_writes_nnodes_and_one_hosts_devices_and_validate_accepts_it(tmp_path, capsys):
    rc, inv, pd, err = _expand(tmp_path, capsys)
    assert rc == 0, err
    text = pd.read_text()
    assert "# Placement (--inventory): stage 0 -> A + B, stage 1 -> C; device ids and ports are per host.\n" in text
    p, d = load_file(pd).tree["stages"]
    assert (p["tensor_parallel_size"], p["nnodes"], p["devices"]) == (4, 2, "0,1")
    assert "nnodes" not in d and d["devices"] == "0"
    # node rank 0's address is the side channel decode dials (the scheduler's handshake listener)
    assert [s["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] for s in (p, d)] == ["10.201.0.1", "10.201.0.3"]
    assert main(["validate", str(pd), "--inventory", str(inv)]) == 0
    assert capsys.readouterr().out.endswith(f"{pd}: ok (0 errors, 0 warnings, 1 info)\n")


def test_scripts_match_goldens_and_parse(tmp_path, capsys):
    rc, inv, pd, err = _expand(tmp_path, capsys)
    assert rc == 0, err
    to = tmp_path / "out"
    rc = main(["render", str(pd), "--to", str(to), "--model", "/models/tiny", "--inventory", str(inv),
               "--vllm", "/opt/vllm/bin/vllm", "--router-workers", "1"])
    assert rc == 0, capsys.readouterr()
    for name in ("A.sh", "B.sh", "C.sh", "placement.yaml"):
        text = (to / name).read_text().replace(sys.executable, "$PYTHON")
        if UPDATE:
            GOLDEN.mkdir(exist_ok=True)
            (GOLDEN / name).write_text(text)
        assert text == (GOLDEN / name).read_text(), name
        if name.endswith(".sh"):
            assert subprocess.run(["bash", "-n", str(to / name)]).returncode == 0
    a, b, c = ((to / f"{h}.sh").read_text() for h in "ABC")
    nodes = "--nnodes 2 --node-rank {} --master-addr 10.201.0.1 --master-port 8700"
    # node rank 0: the API server on A's address, every rank's message queues on A's
    assert ("VLLM_HOST_IP=10.201.0.1 /opt/vllm/bin/vllm serve /models/tiny --host 10.201.0.1 --port 8100 "
            "--served-model-name /models/tiny") in a
    assert a.count("setsid ") == 1 and nodes.format(0) + " > logs/prefill-0.log" in a
    # node rank 1: headless, B's own address, no API server flags, ready with prefill-0
    worker = next(line for line in b.splitlines() if line.startswith("setsid "))
    assert b.count("setsid ") == 1 and worker.endswith(nodes.format(1) + " --headless > logs/prefill-0-node1.log 2>&1 &")
    assert "VLLM_HOST_IP=10.201.0.2 " in worker and "VLLM_NIXL_SIDE_CHANNEL_HOST=10.201.0.2 " in worker
    assert not any(f in worker.split() for f in ("--host", "--port", "--served-model-name", "--api-key"))
    assert "--tensor-parallel-size 4" in worker and "wait_healthy prefill-0 http://10.201.0.1:8100/health 1200" in b
    # the router lists the instance once (its node rank 0)
    assert "--prefill http://10.201.0.1:8100 --decode http://10.201.0.3:8200" in c
    assert (to / "placement.yaml").read_text().endswith("placement:\n  0: [A, B]\n  1: C\n")


def test_the_same_plan_renders_a_leaderworkerset_whose_pods_add_up_to_the_world(tmp_path, capsys):
    pytest.importorskip("kubernetes_validate")
    from ruamel.yaml import YAML

    rc, inv, pd, err = _expand(tmp_path, capsys)
    assert rc == 0, err
    to = tmp_path / "k8s"
    assert main(["render", str(pd), "--to", str(to), "--target", "kubernetes", "--model", "/models/tiny",
                 "--inventory", str(inv)]) == 0, capsys.readouterr()
    lws = YAML(typ="safe").load((to / "prefill.yaml").read_text().split("\n---\n")[0])
    assert lws["kind"] == "LeaderWorkerSet"
    tmpl = lws["spec"]["leaderWorkerTemplate"]
    assert tmpl["size"] == 2
    gpus = [t["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
            for t in (tmpl["leaderTemplate"], tmpl["workerTemplate"])]
    assert gpus == [2, 2]  # TP 4 = 2 pods x 2 GPUs
    leader, worker = (t["spec"]["containers"][0]["args"] for t in (tmpl["leaderTemplate"], tmpl["workerTemplate"]))
    assert leader.count("--nnodes") == 1 and leader[-6:] == ["--nnodes", "2", "--node-rank", "0", "--master-addr",
                                                              "$(POD_IP)"]
    assert "10.201.0.1" not in " ".join(leader + worker)  # the pods' addresses, not the inventory's


@pytest.mark.parametrize("hosts, extra, message", [
    (HOSTS_YAML.replace("count: 2}\n  C", "count: 2}\n  D: {address: 10.201.0.4, count: 2}\n  C")
     .replace("[A, B]", "[A, B, D]"), (),
     "error[OPD805]: cannot place the stages: stage 0 spans 3 hosts but its world size is 4: vLLM needs --nnodes "
     "to divide the world size (TP x PP x DP)"),
    (HOSTS_YAML, ("--prefill-replicas", "2"),
     "error[OPD805]: cannot place the stages: stage 0 spans 2 hosts and has 2 replicas: omni-pd places one "
     "instance across hosts"),
    (HOSTS_YAML.replace("{0: [A, B], 1: C}", "{0: A, 1: [B, C]}").replace("count: 1}", "count: 2}"), (),
     "error[OPD805]: cannot place the stages: stage 1 spans 2 hosts but its world size is 1: vLLM needs --nnodes "
     "to divide the world size (TP x PP x DP)"),
])
def test_a_span_omni_pd_does_not_compile_is_refused(tmp_path, capsys, hosts, extra, message):
    rc, _, pd, err = _expand(tmp_path, capsys, hosts, *extra)
    assert rc == 2 and err.splitlines()[0] == message
    assert not pd.exists()


def test_a_vllm_omni_stage_spanning_hosts_is_refused(tmp_path, capsys):
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  A: {address: 10.0.0.1, count: 8}\n  B: {address: 10.0.0.2, count: 8}\n"
                   "placement: {0: [A, B], all: B}\n")
    rc = main(["expand", "-q", "--inventory", str(inv), "-o", str(tmp_path / "pd.yaml")])
    assert rc == 2
    assert capsys.readouterr().err.splitlines()[0] == (
        "error[OPD805]: cannot place the stages: stage 0 is placed on 2 hosts (A, B): omni-pd spans only the prefill "
        "or decode instance of a pair it launches with `vllm serve` (the llm and thinker-only pipelines)")


def test_launch_refuses_nnodes_the_inventory_does_not_match(tmp_path, capsys):
    rc, inv, pd, err = _expand(tmp_path, capsys)
    assert rc == 0, err
    one = tmp_path / "one.yaml"
    one.write_text(HOSTS_YAML.replace("[A, B]", "A"))
    rc = main(["launch", str(pd), "--model", "/models/tiny", "--dry-run", "--inventory", str(one)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "error[OPD966]: stage 0 (prefill) spans nnodes 2 hosts, but the inventory places it on 1 host (A)" in err
    assert "= help: list 2 hosts for it in the inventory (placement: {0: [HOST_A, HOST_B]})" in err


def test_inventory_spans_parse_and_refuse_what_they_cannot_mean():
    inv = Inventory.from_dict({"hosts": {"A": {}, "B": {}}, "placement": {"0": ["A", "B"], "1": ["B"]}})
    assert inv.placement == {0: "A", 1: "B"} and inv.spans == {0: ("A", "B")}
    for placement, message in (({"0": ["A", "A"]}, "placement.0 must list distinct host names"),
                               ({"0": []}, "placement.0 must list distinct host names"),
                               ({"all": ["A", "B"]}, "placement.all must be one host name"),
                               ({"0": ["A", "Z"]}, "placement names host 'Z', which is not under hosts:")):
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            Inventory.from_dict({"hosts": {"A": {}, "B": {}}, "placement": placement})


def test_span_devices_and_per_host_numbering():
    assert span_devices((0, 1, 2, 3), 2, 0) == (0, 1)
    assert span_devices("cpu", 2, 0) == "cpu" and span_devices((0, 1), 1, 0) == (0, 1)
    with pytest.raises(PlacementError, match="stage 0 spans 3 hosts but its world size is 4"):
        span_devices((0, 1, 2, 3), 3, 0)
    # prefill (one host's ids 2,3) spans A and B; decode (0) on B: on B the spanning stage's ids
    # come first, so they are 0,1 on both hosts and decode takes 2
    assert host_devices({0: (2, 3), 1: (0,)}, {0: "A", 1: "B"}, {0: ("A", "B")}) == {0: (0, 1), 1: (2,)}
    # two spanning stages that share one host of two: no common numbering
    with pytest.raises(PlacementError, match="local device ids differ"):
        host_devices({0: (0,), 1: (1,)}, {0: "A", 1: "B"}, {0: ("A", "B"), 1: ("B", "C")})
    where = Placement({0: "A", 1: "C"}, {}, ("A", "B", "C"), spans={0: ("A", "B")})
    assert where.nodes_of(0) == ("A", "B") and where.nodes_of(1) == ("C",)
    assert where.stages_on("B") == (0,) and where.describe() == "stage 0 -> A + B, stage 1 -> C"
