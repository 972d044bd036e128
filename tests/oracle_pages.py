"""The oracle-venv side of the /metrics fixture tests (tests/test_oracle_metrics.py,
tests/test_oracle_status_pages.py): run a page-generating script of tests/oracle/, read a
gzipped fixture page, and reduce a page to the samples compared.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

from omni_pd.launch.smoke import samples

ROOT = Path(__file__).resolve().parents[1]


def oracle_pages(script: str) -> dict[str, str]:
    """Page name -> Prometheus text, from the JSON line ``tests/oracle/<script>`` prints when
    run with ``OMNI_PD_ORACLE_PYTHON`` (at most 600 s). Fails the test with the script's
    output tails when it exits non-zero."""
    proc = subprocess.run([os.environ["OMNI_PD_ORACLE_PYTHON"], str(ROOT / "tests" / "oracle" / script)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))


def fixture_page(folder: str, name: str) -> str:
    """The text of ``tests/fixtures/<folder>/<name>.prom.gz``."""
    with gzip.open(ROOT / "tests" / "fixtures" / folder / f"{name}.prom.gz", "rt", encoding="utf-8") as f:
        return f.read()


def sample_set(text: str, prefixes: tuple[str, ...]) -> set[tuple]:
    """(name, sorted labels, value) of every sample whose name starts with one of
    ``prefixes``; a ``*_created`` value (a timestamp) counts by presence only (None)."""
    return {(n, tuple(sorted(lb.items())), None if n.endswith("_created") else v) for n, lb, v in samples(text)
            if n.startswith(prefixes)}
