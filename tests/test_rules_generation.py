"""Accelerator generations in the inventory and OPD314 (issue 22, seed 004: vllm-ascend does
not support prefill on A2 with decode on A3)."""

from __future__ import annotations

import pytest
from rule_found import found_with_notes  # tests/rule_found.py

from omni_pd.check.context import Inventory, generations
from omni_pd.check.rules.pd_generation import _Y, _inv, refused_pairs


def test_a2_prefill_a3_decode_is_refused_with_its_source() -> None:
    assert found_with_notes(_Y, "OPD314", {"platform": "npu", **_inv("A2", "A3")}) == [(
        "error", "vllm-ascend does not support heterogeneous prefill and decode nodes (prefill on A2, decode on A3): "
        "prefill (stage 0) on host-p, decode (stage 1) on host-d", (5, 5),
        "run prefill and decode on the same Atlas generation (both A2 or both A3)", [(4, 5, "prefill on A2")],
        ["source: vllm-ascend docs/source/developer_guide/feature_guide/disaggregated_prefill.md, Limitations: "
         "heterogeneous P and D nodes, e.g. P on A2 and D on A3, are not supported",
         "source: vllm-ascend 0.23.0.post1 docs/source/developer_guide/Design_Documents/disaggregated_prefill.md:103 "
         "(its sdist: the same limitation; the page moved; re-read for issue 35)"])]


@pytest.mark.parametrize("pg,dg", [("A2", "A2"), ("A3", "A3")])
def test_one_generation_passes(pg: str, dg: str) -> None:
    assert found_with_notes(_Y, "OPD314", {"platform": "npu", **_inv(pg, dg)}) == []


def test_no_generation_no_finding() -> None:
    inv = {"inventory": {"hosts": {"host-p": {"accelerator": "npu"}, "host-d": {"accelerator": "npu", "generation": "A3"}},
                         "placement": {0: "host-p", 1: "host-d"}}}
    assert found_with_notes(_Y, "OPD314", {"platform": "npu", **inv}) == []


def test_the_inventory_reads_a_generation_and_refuses_an_unknown_one() -> None:
    inv = Inventory.from_dict({"hosts": {"a": {"accelerator": "npu", "generation": "A3"}}})
    assert inv.hosts["a"].generation == "A3"
    with pytest.raises(ValueError, match=r"hosts.a.generation 'A4' is not a known npu generation \(known: A2, A3\)"):
        Inventory.from_dict({"hosts": {"a": {"accelerator": "npu", "generation": "A4"}}})
    with pytest.raises(ValueError, match="is not a known cuda generation"):
        Inventory.from_dict({"hosts": {"a": {"accelerator": "cuda", "generation": "A2"}}})
    assert Inventory.from_dict({"hosts": {"a": {"generation": "H200"}}}).hosts["a"].generation == "H200"


def test_an_unknown_generation_is_a_usage_error(tmp_path) -> None:
    from omni_pd.cli import main

    (tmp_path / "inv.yaml").write_text("hosts:\n  a: {accelerator: npu, generation: A9}\n")
    (tmp_path / "pd.yaml").write_text(_Y)
    assert main(["validate", str(tmp_path / "pd.yaml"), "--inventory", str(tmp_path / "inv.yaml")]) == 2


def test_every_refused_row_names_known_generations_and_a_source() -> None:
    gens = generations()
    for row in refused_pairs():
        assert row["platform"] in gens and {row["prefill"], row["decode"]} <= set(gens[row["platform"]]), row["id"]
        assert row["sources"] and row["help"] and row["message"], row["id"]
