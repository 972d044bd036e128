"""Stage edges across hosts (issue 25, the runtime half): which omni connector carries each
stage-to-stage edge when ``expand --inventory`` places a stage edge across hosts, and
validate's OPD508 / OPD509 on a same-host-only connector or a localhost listener across
hosts (facts: omni_pd/compile/stage_edges.py).

Golden: the CPU shape of the bundled Qwen3-Omni preset (tests/fixtures/qwen3_omni_moe_cpu.yaml)
with prefill and the Talker + Code2Wav on A and decode on B (edge 1 -> 2 runs B -> A): every
edge NixlConnector, each edge's ``host`` its sender's.
"""

from __future__ import annotations

import os
from pathlib import Path

from omni_pd.cli import main
from omni_pd.compile.stage_edges import (AUTO_CONNECTOR, Edge, cross_host_plan, crossing, payload_edges,
                                         sender_port)
from omni_pd.io import load_file

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
#: the CPU shape of the bundled preset (no platform overlays): the e2e's deploy file
CPU = ROOT / "tests" / "fixtures" / "qwen3_omni_moe_cpu.yaml"
UPDATE = os.environ.get("OMNI_PD_UPDATE_GOLDEN") == "1"
#: decode on B, everything else on A: the decode -> Talker edge crosses B -> A
DECODE_ON_B = ("hosts:\n  A: {address: 10.0.0.1, count: 8, accelerator: cuda}\n"
               "  B: {address: 10.0.0.2, count: 8, accelerator: cuda}\n"
               "placement: {0: A, 1: B, 2: A, 3: A}\n")


def _run(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _inv(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "hosts.yaml"
    p.write_text(text)
    return p


def test_decode_on_b_and_talker_on_a_gets_nixl_on_every_edge_golden(tmp_path, capsys):
    inv, out = _inv(tmp_path, DECODE_ON_B), tmp_path / "pd.yaml"
    rc, _, err = _run(capsys, "expand", "-q", CPU, "--port-base", "25200", "--inventory", inv, "-o", out)
    assert rc == 0, err
    path = GOLDEN / "placement_qwen3_omni_decode_on_b_nixl_edges.yaml"
    if UPDATE:
        path.write_text(out.read_text())
    assert out.read_text() == path.read_text()
    tree = load_file(out).tree
    conns = tree["connectors"]
    assert sorted(conns) == ["connector_of_nixl_0_1", "connector_of_nixl_1_2", "connector_of_nixl_2_3"]
    # each edge's host is its sender's host address; the SharedMemoryConnector entry is gone
    assert {k: (v["name"], v["extra"]["host"], v["extra"]["zmq_port"]) for k, v in conns.items()} == {
        "connector_of_nixl_0_1": ("NixlConnector", "10.0.0.1", 25264),
        "connector_of_nixl_1_2": ("NixlConnector", "10.0.0.2", 25264),
        "connector_of_nixl_2_3": ("NixlConnector", "10.0.0.1", 25264)}
    assert conns["connector_of_nixl_2_3"]["extra"]["codec_chunk_frames"] == 25  # the edge's own extra is kept
    assert [s.get("input_connectors") for s in tree["stages"]] == [
        None, {"from_stage_0": "connector_of_nixl_0_1"}, {"from_stage_1": "connector_of_nixl_1_2"},
        {"from_stage_2": "connector_of_nixl_2_3"}]
    rc, vout, _ = _run(capsys, "validate", out, "--inventory", inv)
    assert rc == 0 and vout.endswith(": ok (0 errors, 0 warnings, 1 info)\n"), vout


def test_expand_says_why_it_wrote_nixl(tmp_path, capsys):
    rc, _, err = _run(capsys, "expand", CPU, "--port-base", "25200", "--inventory", _inv(tmp_path, DECODE_ON_B),
                      "-o", tmp_path / "pd.yaml")
    assert rc == 0
    assert ("info[OPD907]: stage edge 1 -> 2 (B -> A) crosses hosts: every stage edge now uses NixlConnector "
            "(zmq_port 25264, each edge's host its sender's address), as SharedMemoryConnector reaches one host only"
            ) in err


def test_the_proposed_placement_keeps_shared_memory(tmp_path, capsys):
    """Prefill alone on A: only the PD edge crosses, and it carries no payload."""
    inv = _inv(tmp_path, DECODE_ON_B.replace("placement: {0: A, 1: B, 2: A, 3: A}\n",
                                             "placement: {0: A, 1: B, 2: B, 3: B}\n"))
    out = tmp_path / "pd.yaml"
    rc, _, err = _run(capsys, "expand", CPU, "--inventory", inv, "-o", out)
    assert rc == 0 and "OPD907" not in err
    assert list(load_file(out).tree["connectors"]) == ["connector_of_shared_memory"]


def test_shared_memory_across_hosts_is_opd508_and_localhost_is_opd509(tmp_path, capsys):
    inv, out = _inv(tmp_path, DECODE_ON_B), tmp_path / "pd.yaml"
    assert _run(capsys, "expand", "-q", CPU, "--port-base", "25200", "--inventory", inv, "-o", out)[0] == 0
    good = out.read_text()
    # the one-host expand output (SharedMemoryConnector) placed across hosts
    one = tmp_path / "one.yaml"
    assert _run(capsys, "expand", "-q", CPU, "-o", one)[0] == 0
    rc, vout, _ = _run(capsys, "validate", one, "--inventory", inv)
    assert rc == 1
    assert ("error[OPD508]: stage edge 1 -> 2 runs from B to A over SharedMemoryConnector "
            "(connectors.connector_of_shared_memory), which reaches one host only") in vout
    assert "stage edge 2 -> 3" not in vout  # Talker and Code2Wav share A
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.replace("host: 10.0.0.2", "host: 127.0.0.1"))
    rc, vout, _ = _run(capsys, "validate", bad, "--inventory", inv)
    assert rc == 1
    assert ("error[OPD509]: stage edge 1 -> 2 (NixlConnector): stage 1 on B advertises '127.0.0.1' as its host; "
            "stage 2 on A cannot reach it") in vout
    assert "= help: set host: 10.0.0.2" in vout


def test_payload_edges_reads_named_inline_and_auto_edges():
    tree = {"connectors": {"x": {"name": "NixlConnector", "extra": {"host": "h"}}},
            "stages": [{"stage_id": 0}, {"stage_id": 1, "input_connectors": {"from_stage_0": "x"}},
                       {"stage_id": 2, "engine_args": {"input_connectors": {"from_stage_1": {"name": "Y"}}}},
                       {"stage_id": 3, "output_connectors": {"to_stage_4": "missing"}}],
            "edges": [{"from": 0, "to": 1}, {"from": 2, "to": 3}]}
    assert payload_edges(tree) == [Edge(0, 1, "NixlConnector", "x", True, {"host": "h"}),
                                   Edge(1, 2, "Y", None, True, None), Edge(3, 4, "", "missing", True, None),
                                   Edge(2, 3, AUTO_CONNECTOR)]


def test_crossing_skips_the_pd_edge_and_unplaced_stages():
    edges = [Edge(0, 1, "S"), Edge(1, 2, "S"), Edge(2, 3, "S"), Edge(3, 9, "S")]
    hosts = {0: "A", 1: "B", 2: "B", 3: "A"}
    assert crossing(edges, hosts, (0, 1)) == [Edge(2, 3, "S")]
    assert crossing(edges, hosts, None) == [Edge(0, 1, "S"), Edge(2, 3, "S")]
    assert cross_host_plan(edges[:2], hosts, {"A": "a", "B": "b"}, (0, 1), 100) == []


def test_cross_host_plan_needs_the_senders_address():
    import pytest

    with pytest.raises(ValueError, match="stage 1 sends to stage 2 from B, which has no address"):
        cross_host_plan([Edge(1, 2, "S")], {1: "B", 2: "A"}, {"A": "a"}, (0, 1), 100)


def test_sender_port_is_vllm_omnis_formula():
    # initialization.py compute_connector_zmq_port: base + 1024 replica + 16 rank + from_stage
    assert sender_port(25264, 1) == 25265
    assert sender_port(25264, 2, replica=1, rank=1) == 25264 + 1024 + 16 + 2
