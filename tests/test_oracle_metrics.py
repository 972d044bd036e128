"""The /metrics fixtures of tests/test_smoke.py are what vLLM 0.30 / vllm-omni 0.30 render.

Regenerates the pages with the real stat loggers in the oracle venv
(tests/oracle/metrics_pages.py) and compares them sample by sample with
tests/fixtures/metrics/*.prom.gz (vLLM's and vllm-omni's families; ``*_created`` values are
timestamps and only compared by presence). When this fails after an upgrade, the exposition changed: regenerate the
fixtures (the script's output, gzipped) and re-check ``omni_pd/launch/smoke.py``.
"""

from __future__ import annotations

import os

import pytest

from omni_pd.launch.smoke import samples
from oracle_pages import fixture_page, oracle_pages, sample_set  # tests/oracle_pages.py

ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")
NAMES = ["vllm_decode_before", "vllm_decode_after_pd", "omni_before", "omni_after_pd", "omni_after_recompute"]

pytestmark = pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    return oracle_pages("metrics_pages.py")


def _norm(text: str) -> set[tuple]:
    """vLLM's and vllm-omni's samples (not the process/GC collectors of the generating process)."""
    return sample_set(text, ("vllm:", "vllm_omni:"))


@pytest.mark.parametrize("name", NAMES)
def test_fixture_page_matches_what_upstream_renders(pages, name):
    assert _norm(pages[name]) == _norm(fixture_page("metrics", name))


def test_omni_page_labels_decode_by_stage_and_replica(pages):
    rows = [lb for n, lb, _ in samples(pages["omni_after_pd"]) if n == "vllm:prompt_tokens_by_source_total"]
    assert {tuple(sorted(lb)) for lb in rows} == {("model_name", "replica", "source", "stage")}
    assert {lb["stage"] for lb in rows} == {"0", "1", "2", "3"}
