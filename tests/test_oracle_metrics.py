"""The /metrics fixtures of tests/test_smoke.py are what vLLM 0.30 / vllm-omni 0.30 render.

Regenerates the pages with the real stat loggers in the oracle venv
(tests/oracle/metrics_pages.py) and compares them sample by sample with
tests/fixtures/metrics/*.prom.gz (vLLM's and vllm-omni's families; ``*_created`` values are
timestamps and only compared by presence). When this fails after an upgrade, the exposition changed: regenerate the
fixtures (the script's output, gzipped) and re-check ``omni_pd/launch/smoke.py``.
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
NAMES = ["vllm_decode_before", "vllm_decode_after_pd", "omni_before", "omni_after_pd", "omni_after_recompute"]

pytestmark = pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    proc = subprocess.run([ORACLE, str(ROOT / "tests" / "oracle" / "metrics_pages.py")], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))


def _norm(text: str) -> set[tuple]:
    """vLLM's and vllm-omni's samples (not the process/GC collectors of the generating process)."""
    return {(n, tuple(sorted(lb.items())), None if n.endswith("_created") else v) for n, lb, v in samples(text)
            if n.startswith(("vllm:", "vllm_omni:"))}


@pytest.mark.parametrize("name", NAMES)
def test_fixture_page_matches_what_upstream_renders(pages, name):
    with gzip.open(ROOT / "tests" / "fixtures" / "metrics" / f"{name}.prom.gz", "rt", encoding="utf-8") as f:
        fixture = f.read()
    assert _norm(pages[name]) == _norm(fixture)


def test_omni_page_labels_decode_by_stage_and_replica(pages):
    rows = [lb for n, lb, _ in samples(pages["omni_after_pd"]) if n == "vllm:prompt_tokens_by_source_total"]
    assert {tuple(sorted(lb)) for lb in rows} == {("model_name", "replica", "source", "stage")}
    assert {lb["stage"] for lb in rows} == {"0", "1", "2", "3"}
