"""Placement across hosts in the compiler (issue 25): ``expand --inventory``.

Goldens: the tiny LLM split into a NIXL 1P1D pair on two hosts (the two-host e2e's config)
and the bundled Qwen3-Omni preset on two hosts with Mooncake and the proposed placement.
Rules: device ids restart per host, each side's connector range starts at the base on its
own host, each side advertises its own host's address; a placement the inventory cannot
hold is OPD805 (exit 2); the written file validates with the inventory, and the same file
with a localhost side channel is OPD503.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from omni_pd.check.context import Inventory
from omni_pd.cli import main
from omni_pd.compile.placement import PlacementError, check_capacity, host_devices, resolve_placement
from omni_pd.compile.pipelines import PipelineStage
from omni_pd.io import load_file

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"
TWO_HOSTS = "hosts:\n  A: {address: 10.201.0.1, count: 1}\n  B: {address: 10.201.0.2, count: 1}\nplacement: {0: A, 1: B}\n"
#: the inventory of placement_qwen3_omni_mooncake_two_hosts.yaml: no placement (expand proposes one)
OMNI_TWO_HOSTS = ("hosts:\n  A: {address: 10.0.0.1, count: 8, accelerator: cuda}\n"
                  "  B: {address: 10.0.0.2, count: 8, accelerator: cuda}\n")
#: the placement expand proposes for it (the OPD906 info asserted below)
OMNI_PROPOSED_PLACEMENT = "placement: {0: A, 1: B, 2: B, 3: B}\n"
UPDATE = os.environ.get("OMNI_PD_UPDATE_GOLDEN") == "1"


def _run(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text()


def _inv(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "hosts.yaml"
    p.write_text(text)
    return p


def test_llm_nixl_pair_on_two_hosts_matches_golden(tmp_path, capsys):
    inv = _inv(tmp_path, TWO_HOSTS)
    out = tmp_path / "pd.yaml"
    rc, _, err = _run(capsys, "expand", "-q", LLM, "--pipeline", "llm", "--connector", "NixlConnector",
                      "--kv-buffer-device", "cpu", "--port-base", "18500", "--inventory", inv, "-o", out)
    assert rc == 0, err
    _golden("placement_llm_nixl_two_hosts.yaml", out.read_text())
    stages = load_file(out).tree["stages"]
    # devices restart per host; ports per host; each side advertises its own host
    assert [s["devices"] for s in stages] == ["0", "0"]
    assert [s["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] for s in stages] == ["18500", "18500"]
    assert [s["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] for s in stages] == ["10.201.0.1", "10.201.0.2"]
    rc, vout, _ = _run(capsys, "validate", out, "--inventory", inv)
    assert rc == 0 and vout.endswith(f"{out}: ok (0 errors, 0 warnings, 1 info)\n")
    assert vout.startswith("info[OPD703]: PD pair stage 0 -> 1: prefill runs on A and decode on B")


def test_omni_preset_on_two_hosts_with_the_proposed_placement_matches_golden(tmp_path, capsys):
    inv = _inv(tmp_path, OMNI_TWO_HOSTS)
    out = tmp_path / "pd.yaml"
    rc, _, err = _run(capsys, "expand", "--inventory", inv, "-o", out)
    assert rc == 0, err
    assert err.startswith("info[OPD906]: the inventory places no stage 0, 1, 2, 3: placed as stage 0 -> A, "
                          "stage 1 -> B, stage 2 -> B, stage 3 -> B\n")
    _golden("placement_qwen3_omni_mooncake_two_hosts.yaml", out.read_text())
    stages = load_file(out).tree["stages"]
    # prefill alone on A at device 0; decode, Talker, Code2Wav on B from device 0 (Talker and
    # Code2Wav still share theirs)
    assert [s["devices"] for s in stages] == ["0", "0", "1", "1"]
    assert [s["kv_transfer_config"].get("kv_ip") for s in stages[:2]] == ["10.0.0.1", "10.0.0.2"]


@pytest.mark.parametrize("placement", ["", "placement: {0: A, 1: B}\n"])
def test_validate_places_the_stages_an_inventory_leaves_unplaced_as_expand_did(tmp_path, capsys, placement):
    # expand proposes a host for every stage the inventory does not place (Talker and Code2Wav
    # follow decode to B, so their edges keep SharedMemoryConnector); validate with the same
    # inventory judges that placement, not "localhost" (it said OPD508 "from B to localhost")
    inv = _inv(tmp_path, OMNI_TWO_HOSTS + placement)
    out = tmp_path / "pd.yaml"
    rc, _, err = _run(capsys, "expand", "-q", "--inventory", inv, "-o", out)
    assert rc == 0, err
    assert "SharedMemoryConnector" in out.read_text() and "NixlConnector" not in out.read_text()
    rc, vout, _ = _run(capsys, "validate", out, "--inventory", inv)
    assert rc == 0 and vout.endswith(f"{out}: ok (0 errors, 0 warnings, 1 info)\n"), vout
    assert "OPD508" not in vout


def test_one_host_inventory_keeps_prefill_and_decode_apart(tmp_path, capsys):
    inv = _inv(tmp_path, "hosts:\n  A: {address: 10.0.0.1, count: 2}\n")
    out = tmp_path / "pd.yaml"
    rc, _, err = _run(capsys, "expand", "-q", LLM, "--pipeline", "llm", "--connector", "NixlConnector",
                      "--port-base", "18500", "--inventory", inv, "-o", out)
    assert rc == 0, err
    stages = load_file(out).tree["stages"]
    assert [s["devices"] for s in stages] == ["0", "1"]
    assert [s["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] for s in stages] == ["18500", "18501"]
    assert [s["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] for s in stages] == ["10.0.0.1", "10.0.0.1"]


@pytest.mark.parametrize("hosts, message, help", [
    ("hosts:\n  A: {address: 10.0.0.1, count: 0}\n  B: {address: 10.0.0.2, count: 1}\nplacement: {0: A, 1: B}\n",
     "error[OPD805]: cannot place the stages: host A has 0 device(s) but stages 0 placed on it need 1",
     "place some of them on another host (placement: in the inventory), or raise hosts.A.count"),
    ("hosts:\n  A: {count: 1}\n  B: {address: 10.0.0.2, count: 1}\nplacement: {0: A, 1: B}\n",
     "error[OPD805]: cannot place the stages: prefill is placed on A, which has no address, and its peer is on "
     "another host", "set hosts.A.address to the address the other host reaches it at"),
])
def test_a_placement_the_inventory_cannot_hold_is_refused(tmp_path, capsys, hosts, message, help):
    out = tmp_path / "pd.yaml"
    rc, _, err = _run(capsys, "expand", "-q", LLM, "--pipeline", "llm", "--connector", "NixlConnector",
                      "--inventory", _inv(tmp_path, hosts), "-o", out)
    assert rc == 2
    assert err.splitlines()[0] == message
    assert f"= help: {help}" in err
    assert not out.exists()


def test_the_placed_file_with_a_localhost_side_channel_is_opd503(tmp_path, capsys):
    inv = _inv(tmp_path, TWO_HOSTS)
    text = (GOLDEN / "placement_llm_nixl_two_hosts.yaml").read_text()
    bad = tmp_path / "pd-localhost.yaml"
    bad.write_text(text.replace('VLLM_NIXL_SIDE_CHANNEL_HOST: "10.201.0.1"', 'VLLM_NIXL_SIDE_CHANNEL_HOST: "127.0.0.1"'))
    rc, vout, _ = _run(capsys, "validate", bad, "--inventory", inv)
    assert rc == 1
    assert ("error[OPD503]: stage 0 (prefill) on A advertises '127.0.0.1' as its NIXL side channel; "
            "decode on B cannot reach it") in vout
    assert "= help: set env VLLM_NIXL_SIDE_CHANNEL_HOST: 10.201.0.1 on the prefill stage" in vout


def _stages(*roles):
    return [PipelineStage(i, "llm", "llm", pd_role=r) for i, r in enumerate(roles)]


def test_proposal_rule():
    two = Inventory.from_dict({"hosts": {"A": {"address": "a"}, "B": {"address": "b"}, "C": {}}})
    got = resolve_placement(_stages("prefill", "decode", None, None), two)
    assert dict(got.stage_host) == {0: "A", 1: "B", 2: "B", 3: "B"}
    assert got.proposed == (0, 1, 2, 3)
    partial = Inventory.from_dict({"hosts": {"A": {}, "B": {}}, "placement": {1: "A"}})
    got = resolve_placement(_stages("prefill", "decode"), partial)
    assert (dict(got.stage_host), got.proposed) == ({0: "A", 1: "A"}, (0,))
    every = Inventory.from_dict({"hosts": {"A": {}, "B": {}}, "placement": {"all": "B", 0: "A"}})
    assert dict(resolve_placement(_stages("prefill", "decode"), every).stage_host) == {0: "A", 1: "B"}
    one = Inventory.from_dict({"hosts": {"A": {}}})
    assert dict(resolve_placement(_stages("prefill", "decode"), one).stage_host) == {0: "A", 1: "A"}
    with pytest.raises(PlacementError, match="lists no hosts"):
        resolve_placement(_stages("prefill"), Inventory())


def test_host_devices_examples():
    assert host_devices({0: (0,), 1: (1,)}, {0: "A", 1: "B"}) == {0: (0,), 1: (0,)}
    assert host_devices({0: (0, 1), 1: (2, 3), 2: (4,), 3: (4,)}, {0: "A", 1: "B", 2: "B", 3: "B"}) == \
        {0: (0, 1), 1: (0, 1), 2: (2,), 3: (2,)}
    assert host_devices({0: "cpu", 1: None, 2: (5,)}, {0: "A", 1: "A"}) == {0: "cpu", 1: None, 2: (5,)}


def test_capacity_counts_distinct_devices_per_host():
    inv = Inventory.from_dict({"hosts": {"A": {"count": 2}, "B": {"count": 1}}, "placement": {0: "A", 1: "B", 2: "B"}})
    where = resolve_placement(_stages("prefill", "decode", None), inv)
    check_capacity({0: (0, 1), 1: (0,), 2: (0,)}, where, inv)  # shared device: one
    with pytest.raises(PlacementError, match=r"host B has 1 device\(s\) but stages 1, 2 placed on it need 2"):
        check_capacity({0: (0, 1), 1: (0,), 2: (1,)}, where, inv)


@given(st.dictionaries(st.integers(0, 7), st.lists(st.integers(0, 15), min_size=1, max_size=4, unique=True),
                       min_size=1, max_size=6),
       st.lists(st.sampled_from("AB"), min_size=8, max_size=8))
def test_host_devices_keeps_sharing_and_numbers_each_host_from_zero(layout, hosts):
    lay = {k: tuple(v) for k, v in layout.items()}
    where = {k: hosts[k] for k in lay}
    got = host_devices(lay, where)
    for h in "AB":
        on = [k for k in lay if where[k] == h]
        used = sorted({d for k in on for d in got[k]})
        assert used == list(range(len(used)))  # 0..n-1 on every host
        for a in on:
            for b in on:
                for i, x in enumerate(lay[a]):
                    for j, y in enumerate(lay[b]):
                        assert (x == y) == (got[a][i] == got[b][j])  # shared stays shared, distinct distinct
