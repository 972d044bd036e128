"""Streaming PD on vllm-omni 0.30 (issue 34), seam by seam, from vllm-omni's own code.

``tests/oracle/stream_probe.py`` runs in the oracle venv over expand's outputs with and
without ``async_chunk`` (the bundled preset, the one-piece file from ``--no-stream``):

* vllm-omni's ``_validate_async_chunk_support`` refuses the streaming PD file by itself and
  accepts it with omni-pd's layer; a kv_transfer_config on the Talker as well (the AR-to-DiT
  shape the check was written for) stays refused;
* the connector roles vllm-omni derives (``load_omni_transfer_config`` +
  ``get_stage_connector_spec``): without the prefill -> decode stage edge decode is a
  *sender* (the orchestrator submits it after prefill) and prefill has no role (its rows go to
  the orchestrator on the normal output path); with the edge, as the one-piece file has it,
  decode is a *receiver* (prewarmed with a placeholder prompt under async_chunk);
* the real ``thinker2talker_async_chunk``: a non-PD Thinker's first chunk is sent after the
  second step with P + 1 rows; a PD decode engine's (its first step recomputes only the last
  prompt token) is not sent within the same steps upstream, and with omni-pd's wrapper it is
  the non-PD chunk row for row, ids included.

When one of these fails after an upgrade, upstream changed the streaming path: re-check the
``stream_*`` rows of presets/targets/vllm_omni_compat.yaml and OPD310.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.io import load_file
from omni_pd.resources import preset_path

ROOT = Path(__file__).resolve().parents[1]
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")
pytestmark = pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")
REFUSAL = "Native AR-to-DiT KV transfer requires async_chunk=False."


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("stream-probe")
    stream, one_piece = d / "stream.yaml", d / "one_piece.yaml"
    stream.write_text(expand_document(load_file(preset_path("qwen3_omni_moe")), ExpandOptions()).text)
    one_piece.write_text(expand_document(load_file(preset_path("qwen3_omni_moe")), ExpandOptions(stream=False)).text)
    proc = subprocess.run([ORACLE, str(ROOT / "tests" / "oracle" / "stream_probe.py"), str(stream), str(one_piece)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_vllm_omni_refuses_streaming_pd_and_the_layer_accepts_the_pair_only(probe):
    assert probe["installed"] == {"stream_async_chunk_ok": True, "stream_decode_request": True, "stream_chunk0": True}
    assert probe["async_chunk_check"] == {"off": REFUSAL, "on": None, "ar_to_dit_on": REFUSAL}


def test_without_the_prefill_decode_edge_decode_is_a_sender_and_prefill_has_no_role(probe):
    assert probe["roles"]["stream"] == {"0": None, "1": "sender", "2": "receiver", "3": "receiver"}
    # the one-piece file keeps the edge: decode would be a prewarmed chunk receiver under async_chunk
    assert probe["roles"]["one_piece"] == {"0": "sender", "1": "receiver", "2": "receiver", "3": "receiver"}


def test_decodes_first_talker_chunk_is_the_non_pd_chunk_with_the_layer_only(probe):
    plain, off, on = probe["chunk0_plain"], probe["chunk0_pd_off"], probe["chunk0_pd_on"]
    assert (plain["step"], plain["rows"], plain["ids_all"], plain["ids_prompt"]) == (1, 6, 7, 5)
    assert off == {"step": None}  # upstream holds it back for P decode steps
    assert on == plain
