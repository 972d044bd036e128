"""Talker conditioning under PD on vllm-omni 0.30 (issue 10; reference §4), from vllm-omni's own code.

``tests/oracle/talker_pd_probe.py`` runs in the oracle venv: the Thinker engine's real
payload path and full-payload accumulator, the real ``thinker2talker_full_payload`` of
Qwen3-Omni and Qwen2.5-Omni, and Qwen3-Omni's real Talker prefill builder, fed what a
Thinker engine produces without PD (first step computes the whole prompt) and what the
PD decode engine produces (it loads the prompt's KV and recomputes only the last prompt
token). Verdict, asserted here: under PD the Talker misses the prompt rows -- Qwen3-Omni
raises or silently conditions on generated-token rows, Qwen2.5-Omni ships nothing (its
Talker waits) or shifted rows -- while the orchestrator's prefill copy merged in front
would restore the exact non-PD input. That copy has no reader, and the payload is built
in the decode engine process, so omni-pd warns (OPD704) instead of patching.

These assertions describe vllm-omni 0.30.0. When one of them fails after an upgrade,
upstream changed the hand-off: re-check the verdict and OPD704
(omni_pd/check/rules/runtime.py), then update both.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")

pytestmark = pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")

PROMPT = 21  # the probe's chat prompt: system, user (3 audio placeholders + text), assistant header


@pytest.fixture(scope="module")
def probe() -> dict:
    proc = subprocess.run([ORACLE, str(ROOT / "tests" / "oracle" / "talker_pd_probe.py")], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))


def test_the_probe_ran_vllm_omni_0_30(probe):
    assert probe["vllm_omni"] == "0.30.0"
    assert probe["prompt_len"] == PROMPT


@pytest.mark.parametrize("answer,gen", [("short", 7), ("long", 31)])
def test_decode_engine_accumulates_only_the_last_prompt_row_and_the_generated_rows(probe, answer, gen):
    # without PD: every prompt row + one row per generated token but the last
    assert probe[f"qwen3_{answer}_plain"]["accumulated_rows"] == PROMPT + gen - 1
    # PD decode: the recomputed last prompt token + the same generated rows
    assert probe[f"qwen3_{answer}_pd_decode"]["accumulated_rows"] == gen


def test_qwen3_plain_payload_starts_at_the_first_prompt_token(probe):
    plain = probe["qwen3_short_plain"]
    assert (plain["prefill_rows"], plain["ids_all"], plain["ids_prompt"]) == (PROMPT + 7 - 2, PROMPT + 7, PROMPT)
    assert plain["prefill"][:3] == [0.0, 1.0, 2.0]  # rows of positions 0, 1, 2
    assert "error" not in plain["talker"] and plain["talker"]["rows"] == 20


def test_qwen3_talker_raises_under_pd_when_the_answer_is_shorter_than_the_prompt(probe):
    pd = probe["qwen3_short_pd_decode"]
    # ids still say 21 prompt tokens, the rows start at the last prompt token (position 20)
    assert (pd["prefill_rows"], pd["ids_all"], pd["ids_prompt"]) == (6, PROMPT + 7, PROMPT)
    assert pd["prefill"][0] == 20.0
    assert pd["talker"] == {"error": "RuntimeError: The size of tensor a (6) must match the size of tensor b (9) "
                                     "at non-singleton dimension 0"}


def test_qwen3_talker_conditions_on_generated_rows_under_pd_when_the_answer_is_long(probe):
    plain, pd = probe["qwen3_long_plain"], probe["qwen3_long_pd_decode"]
    assert "error" not in pd["talker"]  # no error: the wrong rows go through silently
    assert pd["talker"]["ids"] == plain["talker"]["ids"]
    assert pd["talker"]["embeds"] != plain["talker"]["embeds"]
    assert pd["talker"]["tail_rows"] != plain["talker"]["tail_rows"]


def test_qwen2_5_talker_gets_no_payload_or_shifted_rows_under_pd(probe):
    assert probe["qwen2_5_short_plain"]["payload"] is True
    assert probe["qwen2_5_short_pd_decode"]["payload"] is False  # builder refuses: the Talker waits for it
    plain, pd = probe["qwen2_5_long_plain"], probe["qwen2_5_long_pd_decode"]
    assert pd["prefill_rows"] == plain["prefill_rows"] == PROMPT
    assert pd["prefill"] != plain["prefill"] and pd["prefill"][0] == PROMPT - 1 + 0.25


@pytest.mark.parametrize("case", ["qwen3_short", "qwen3_long", "qwen2_5_short", "qwen2_5_long"])
def test_orchestrators_prefill_copy_merged_in_front_restores_the_plain_input(probe, case):
    """The data a fix needs exists: prefill's rows (the orchestrator keeps them) followed by
    decode's rows without its first (the recomputed last prompt token)."""
    assert probe["orchestrator_prefill_rows"] == {"0": PROMPT, "3": PROMPT}
    assert probe[f"{case}_pd_merged"] == {**probe[f"{case}_plain"], "accumulated_rows": probe[f"{case}_pd_merged"][
        "accumulated_rows"]}


def test_nothing_reads_the_orchestrators_prefill_copy(probe):
    """Only the orchestrator mentions ``pd_prefill_multimodal_output_by_req`` (it writes it)."""
    assert probe["readers_of_pd_prefill_by_req"] == ["engine/orchestrator.py"]
