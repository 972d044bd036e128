"""The /metrics fixtures of tests/test_status_verdict.py are what vLLM 0.30 renders.

Regenerates the pages with vLLM's own stat logger and NIXL connector metrics in the oracle
venv (tests/oracle/status_pages.py) and compares them sample by sample with
tests/fixtures/status/*.prom.gz (``*_created`` values are timestamps and only compared by
presence). When this fails after an upgrade, the exposition changed: regenerate the
fixtures (the script's output, gzipped) and re-check omni_pd/status/verdict.py.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest

from omni_pd.launch.smoke import samples

ROOT = Path(__file__).resolve().parents[1]
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")
NAMES = [f"{s}_{r}_{w}" for s in ("pd", "fallback", "failing") for r in ("prefill", "decode") for w in ("before", "after")]

pytestmark = pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    proc = subprocess.run([ORACLE, str(ROOT / "tests" / "oracle" / "status_pages.py")], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))


def _norm(text: str) -> set[tuple]:
    return {(n, tuple(sorted(lb.items())), None if n.endswith("_created") else v) for n, lb, v in samples(text)
            if n.startswith("vllm:")}


@pytest.mark.parametrize("name", NAMES)
def test_status_fixture_page_matches_what_vllm_renders(pages, name):
    with gzip.open(ROOT / "tests" / "fixtures" / "status" / f"{name}.prom.gz", "rt", encoding="utf-8") as f:
        fixture = f.read()
    assert _norm(pages[name]) == _norm(fixture)


def test_nixl_families_are_on_the_page(pages):
    names = {n for n, _, _ in samples(pages["pd_decode_after"])}
    assert {"vllm:nixl_xfer_time_seconds_count", "vllm:nixl_bytes_transferred_sum",
            "vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_failed_notifications_total",
            "vllm:nixl_num_kv_expired_reqs_total"} <= names
