"""Replica device layout: omni-pd's :func:`~omni_pd.compile.devices.split_replica_devices` is
vllm-omni 0.30.0's ``split_devices_for_replicas`` (vllm_omni/engine/stage_init_utils.py):
pinned values always, and the real function over a grid where the oracle venv exists
(``OMNI_PD_ORACLE_PYTHON``, built by ``.ci/oracle_venv.sh``)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from omni_pd.compile.devices import ReplicaSplitError, replica_devices, split_replica_devices

ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")

#: (devices, num_replicas, per_replica) -> list, or the error kind
PINNED = {
    ("0", 1, 1): ["0"], ("1", 1, 1): ["1"], (None, 3, 1): [None, None, None], (None, 0, 2): [None],
    ("1,2,3,4", 2, 2): ["1,2", "3,4"],          # pool
    ("0,1", 2, 2): ["0,1", "2,3"],              # template
    ("0,1", 4, 2): ["0,1", "2,3", "4,5", "6,7"],
    ("0", 2, 1): ["0", "1"], ("0", 3, 1): ["0", "1", "2"],
    ("0,1", 2, 1): ["0", "1"],                  # pool of one device each
    ("1,0", 2, 2): ["1,0", "3,2"],              # template keeps the order
    ("1", 2, 1): "offset", ("0,2", 2, 2): "offset", ("3", 3, 1): "offset",
    ("0,1,2", 2, 1): "length", ("0,1,2", 2, 2): "length", ("0", 2, 2): "length",
    (" 0 , 1 ,", 2, 1): ["0", "1"],             # stripped, blanks dropped
}


def _run(devices, reps, per):
    try:
        return split_replica_devices(devices, reps, per, 0)
    except ReplicaSplitError as e:
        return e.kind


@pytest.mark.parametrize("args,want", list(PINNED.items()), ids=[repr(k) for k in PINNED])
def test_pinned(args, want):
    assert _run(*args) == want


def test_offset_error_names_the_offsets_as_vllm_omni_does():
    with pytest.raises(ReplicaSplitError) as e:
        split_replica_devices("1", 2, 1, 0)
    assert e.value.bad == (1,)
    assert "template-mode device offset(s) [1] out of range [0, 1)" in str(e.value)


def test_replica_devices_on_parsed_tuples():
    assert replica_devices((0,), 2, 1) == ((0,), (1,))
    assert replica_devices((0, 1, 2, 3), 2, 2) == ((0, 1), (2, 3))
    assert replica_devices((0, 1), 2, 2) == ((0, 1), (2, 3))
    assert replica_devices((1,), 2, 1) is None
    assert replica_devices((0, 1), 1, 1) == ((0, 1),)
    assert replica_devices("cpu", 2, 1) == ("cpu", "cpu")
    assert replica_devices(None, 2, 1) == (None, None)


GRID = [(d, n, p) for d in (None, "0", "1", "2", "0,1", "1,0", "0,2", "1,2", "0,1,2", "0,1,2,3", "2,3,0,1",
                            "0,1,2,3,4,5", " 0, 1", "0,,1")
        for n in (0, 1, 2, 3) for p in (1, 2, 3)]

_PROBE = r"""
import json, sys
from vllm_omni.engine.stage_init_utils import split_devices_for_replicas
out = []
for d, n, p in json.loads(sys.stdin.read()):
    try:
        out.append(split_devices_for_replicas(d, n, p, 0))
    except ValueError as e:
        s = str(e)
        out.append("offset" if "offset" in s else "int" if "must be ints" in s else "length")
print(json.dumps(out))
"""


@pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")
def test_matches_vllm_omni_over_a_grid():
    proc = subprocess.run([ORACLE, "-c", _PROBE], input=json.dumps(GRID), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = [_run(*g) for g in GRID]
    diff = [(g, o, t) for g, o, t in zip(GRID, ours, theirs) if o != t]
    assert not diff, diff[:10]
