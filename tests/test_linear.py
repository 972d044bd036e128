"""Regressions found by the scaling benchmark (bench/fig3_scaling.py, bench/RESULTS.md):
work that grew quadratically, or broke, with the number of stages."""

from __future__ import annotations

import copy
import sys

from omni_pd.io import copy_tree, dump, parse_text
from omni_pd.check.rules.topology import _has_cycle
from omni_pd.check.validate import validate_text

TRICKY = """\
# top comment
base: &b {a: 1, b: [1, 2]}   # eol
derived:
  c: 3
empty: []
flow: {x: [1, 2], y: "q"}
stages:
  - stage_id: 0   # thinker
    devices: "0"
    env: {A: "1"}
    list: [a, b]

  - stage_id: 1
    same: *b
    nested:
      - - 1
        - 2   # inner
# trailing comment
"""


def test_copy_tree_matches_deepcopy():
    doc = parse_text(TRICKY, "t.yaml")
    a, b = copy.deepcopy(doc.tree), copy_tree(doc.tree)
    assert dump(b) == dump(a) == dump(doc.tree)
    assert b["stages"][1]["same"] is b["base"]  # an alias stays one object
    b["stages"][0]["env"]["A"] = "2"
    b["stages"].append({"stage_id": 2})
    assert doc.tree["stages"][0]["env"]["A"] == "1" and len(doc.tree["stages"]) == 2


def test_copy_tree_copies_merge_keys_as_deepcopy_does():
    # both spell the merged keys out next to the `<<:` (a known expand issue with merge
    # keys, not a change of this function)
    doc = parse_text("d: &d {a: 1}\ns:\n  - <<: *d\n    b: 2\n", "m.yaml")
    assert dump(copy_tree(doc.tree)) == dump(copy.deepcopy(doc.tree))


def _events(fn) -> int:
    n = 0

    def prof(frame, event, arg):
        nonlocal n
        n += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n


def test_copy_tree_is_linear_in_stages():
    # ruamel's own deepcopy re-copies a sequence's attributes once per item: O(n^2)
    def tree(n: int):
        return parse_text("stages:\n" + "".join(f"  - stage_id: {i}   # s{i}\n    devices: \"{i}\"\n"
                                                for i in range(n)), "s.yaml").tree

    small, big = tree(50), tree(200)
    ratio = _events(lambda: copy_tree(big)) / _events(lambda: copy_tree(small))
    assert ratio < 6, f"4x the stages cost {ratio:.1f}x the calls"


def test_cycle_check_is_iterative():
    chain = {i: [i + 1] for i in range(5000)}
    assert not _has_cycle(chain)
    assert _has_cycle({**chain, 5000: [17]})
    assert _has_cycle({3: [3]})
    assert not _has_cycle({0: [1, 1], 1: [2]})


def test_graph_shape_on_a_chain_longer_than_the_recursion_limit():
    n = sys.getrecursionlimit() + 50
    text = ("stages:\n" + "".join(f"  - {{stage_id: {i}}}\n" for i in range(n))
            + "edges:\n" + "".join(f"  - {{from: {i}, to: {i + 1}}}\n" for i in range(n - 1)))
    codes = validate_text(text, "long.yaml").codes()
    assert "OPD000" not in codes and "OPD204" not in codes
