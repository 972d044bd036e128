"""The /metrics fixtures of tests/test_status_verdict.py are what vLLM 0.30 renders.

Regenerates the pages with vLLM's own stat logger and NIXL connector metrics in the oracle
venv (tests/oracle/status_pages.py) and compares them sample by sample with
tests/fixtures/status/*.prom.gz (``*_created`` values are timestamps and only compared by
presence). When this fails after an upgrade, the exposition changed: regenerate the
fixtures (the script's output, gzipped) and re-check omni_pd/status/verdict.py.
"""

from __future__ import annotations

import os

import pytest

from omni_pd.launch.smoke import samples
from oracle_pages import fixture_page, oracle_pages, sample_set  # tests/oracle_pages.py

ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")
NAMES = [f"{s}_{r}_{w}" for s in ("pd", "fallback", "failing") for r in ("prefill", "decode") for w in ("before", "after")]

pytestmark = pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return oracle_pages("status_pages.py")


def _norm(text: str) -> set[tuple]:
    return sample_set(text, ("vllm:",))


@pytest.mark.parametrize("name", NAMES)
def test_status_fixture_page_matches_what_vllm_renders(pages, name):
    assert _norm(pages[name]) == _norm(fixture_page("status", name))


def test_nixl_families_are_on_the_page(pages):
    names = {n for n, _, _ in samples(pages["pd_decode_after"])}
    assert {"vllm:nixl_xfer_time_seconds_count", "vllm:nixl_bytes_transferred_sum",
            "vllm:nixl_num_failed_transfers_total", "vllm:nixl_num_failed_notifications_total",
            "vllm:nixl_num_kv_expired_reqs_total"} <= names
