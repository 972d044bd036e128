"""Talker conditioning under PD on vllm-omni 0.30 (issues 10 and 21), from vllm-omni's own code.

``tests/oracle/talker_pd_probe.py`` runs in the oracle venv: the Thinker engine's real
payload path and full-payload accumulator, the real ``thinker2talker_full_payload`` of
Qwen3-Omni and Qwen2.5-Omni, and Qwen3-Omni's real Talker prefill builder, fed what a
Thinker engine produces without PD (first step computes the whole prompt) and what the
PD decode engine produces (it loads the prompt's KV and recomputes only the last prompt
token). Verdict of upstream alone: under PD the Talker misses the prompt rows --
Qwen3-Omni raises or silently conditions on generated-token rows, Qwen2.5-Omni ships
nothing (its Talker waits) or shifted rows -- while prefill's rows merged in front would
restore the exact non-PD input; and the orchestrator never keeps prefill's rows
(``_route_output`` reads ``RequestOutput.multimodal_output``, always None).

Then the same request through every seam omni-pd's layer patches (``seams_off`` before
``vllm_omni_compat.install()``, ``seams_on`` after, one process): the real
``OrchestratorBase._route_output`` and ``_forward_to_next_stage_unguarded``, the real
``thinker2talker_token_only`` resolved as the stage client resolves it, the request
through vLLM's msgpack channel, the Talker runner's buffer merge, the real
``talker_preprocess`` -> ``talker_preprocess_prefill``. With the layer the Talker's input
under PD equals the non-PD input exactly; without it, it does not.

These assertions describe vllm-omni 0.30.0. When one fails after an upgrade, upstream
changed the hand-off: the canary below says whether the Talker patches can go; re-check
OPD704 (omni_pd/check/rules/runtime.py) and presets/targets/vllm_omni_compat.yaml.
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


def test_nothing_upstream_reads_the_orchestrators_prefill_copy(probe):
    """Only the orchestrator mentions ``pd_prefill_multimodal_output_by_req`` (it writes it)."""
    assert probe["readers_of_pd_prefill_by_req"] == ["engine/orchestrator.py"]


# --------------------------------------------------------------------------- the seams (issue 21)

CASES = ("short", "long", "one")


def test_the_probe_installed_every_patch_of_the_layer(probe):
    assert probe["install"] == {"status": "patched", "patched": [
        "pd_detect", "pd_validate", "pd_connector_info", "engine_bootstrap_addr", "decode_kv_params",
        "pd_prefill_rows", "talker_prefill_rows", "talker_prefill_merge",
        "stream_async_chunk_ok", "stream_decode_request", "stream_chunk0", "pd_request_params"]}


def test_orchestrator_drops_prefills_rows_without_the_layer_and_keeps_them_with_it(probe):
    """engine/orchestrator.py ``_route_output`` reads ``getattr(output, "multimodal_output")``
    on a vLLM RequestOutput (None); the rows are on ``outputs[0]``."""
    for case in CASES:
        assert probe["seams_off"][f"{case}_pd"]["orchestrator_kept"] is False
        assert probe["seams_on"][f"{case}_pd"]["orchestrator_kept"] is True
    # so without the layer the Talker request carries nothing of prefill's
    assert probe["seams_off"]["short_pd"]["request_keys"] == []


@pytest.mark.parametrize("case", CASES)
def test_with_the_layer_the_talkers_input_under_pd_equals_the_non_pd_input(probe, case):
    on, off = probe["seams_on"], probe["seams_off"]
    assert on[f"{case}_pd"]["talker"] == on[f"{case}_plain"]["talker"]
    assert on[f"{case}_plain"] == off[f"{case}_plain"]  # a non-PD request is left exactly as upstream has it


def test_the_talkers_input_is_the_full_prompt_conditioning(probe):
    short, long = probe["seams_on"]["short_plain"]["talker"], probe["seams_on"]["long_plain"]["talker"]
    assert short["rows"] == long["rows"] == 20 and short["ids"] == long["ids"]
    assert len(long["trailing"]) == 29 and len(short["trailing"]) == 5
    # one generated token: vllm-omni's Talker fails the same way with and without PD
    # (an upstream edge case of its own, not PD's); the layer keeps it the non-PD failure
    assert probe["seams_on"]["one_plain"]["talker"] == {
        "error": "RuntimeError: The size of tensor a (8) must match the size of tensor b (9) at non-singleton dimension 0"}


def test_without_the_layer_the_talker_raises_or_gets_the_wrong_rows(probe):
    off = probe["seams_off"]
    assert off["short_pd"]["talker"] == {"error": "RuntimeError: The size of tensor a (6) must match the size of "
                                                  "tensor b (9) at non-singleton dimension 0"}
    assert "error" not in off["long_pd"]["talker"]
    assert off["long_pd"]["talker"]["ids"] == off["long_plain"]["talker"]["ids"]
    assert off["long_pd"]["talker"]["embeds"] != off["long_plain"]["talker"]["embeds"]


def test_prefills_rows_travel_as_two_top_level_keys_and_are_released_after_use(probe):
    on = probe["seams_on"]["short_pd"]
    assert on["request_keys"] == ["omni_pd_prefill_layer_0", "omni_pd_prefill_layer_3"]
    assert on["released"] == on["request_keys"]  # set to None in the Talker's request buffer
    assert on["bridge_left"] == []  # the orchestrator's bridge entry is dropped once attached
    # bytes added to the engine request: 2 layers x P rows x H x 4 B (float32 here; bf16 on a
    # real model: 2 x P x H x 2 B), plus msgpack framing
    extra = on["request_bytes"] - probe["seams_on"]["short_plain"]["request_bytes"]
    assert 2 * PROMPT * 8 * 4 <= extra < 2 * PROMPT * 8 * 4 + 256


@pytest.mark.parametrize("case,more", [("short", 1), ("long", 1), ("one", 2)])
def test_the_talker_receives_one_row_per_layer_more_than_without_pd(probe, case, more):
    """Rows per layer reaching the Talker: the connector payload plus the request's prefill rows
    (a one-token answer: the builder keeps decode's single row, so two)."""
    on = probe["seams_on"]
    plain, pd = on[f"{case}_plain"], on[f"{case}_pd"]
    assert plain["request_rows"] == {}
    assert pd["request_rows"] == {"omni_pd_prefill_layer_0": PROMPT, "omni_pd_prefill_layer_3": PROMPT}
    for layer, key in (("omni_pd_prefill_layer_0", "embed.prefill"), ("omni_pd_prefill_layer_3", "hidden_states.output")):
        assert pd["connector_rows"][key] + pd["request_rows"][layer] == plain["connector_rows"][key] + more


def test_canary_upstream_does_not_merge_prefills_rows_by_itself(probe):
    """Fails when vllm-omni starts handing the Talker prefill's rows on its own: then the
    three Talker patches (pd_prefill_rows, talker_prefill_rows, talker_prefill_merge in
    presets/targets/vllm_omni_compat.yaml) can be dropped for that release, and OPD704
    re-checked. Each line is one way upstream could fix it."""
    off = probe["seams_off"]
    assert off["short_pd"]["orchestrator_kept"] is False, "upstream keeps prefill's rows now"
    assert "error" in off["short_pd"]["talker"], "upstream's Talker gets a full payload under PD now"
    assert off["long_pd"]["talker"] != off["long_plain"]["talker"], "upstream merges prefill's rows now"
    assert probe["qwen3_short_pd_decode"]["prefill_rows"] == 6, "decode's payload has prompt rows now"
    assert probe["merge_definitions"] == [], "upstream defines _merge_pd_embeddings now"
    assert probe["readers_of_pd_prefill_by_req"] == ["engine/orchestrator.py"], "something reads the bridge now"


def test_a_worker_process_installs_the_talker_merge_through_vllm_omnis_plugin_loader():
    """vllm-omni 0.30's workers call ``load_omni_general_plugins()`` in
    ``OmniWorkerMixin.__init__`` (worker/mixins.py; omni-pd's CPU workers inherit it):
    in a fresh process that call alone puts the Talker merge in place, so the Talker's
    worker runs it. The orchestrator patches are installed the same way in the API
    process (tests/test_vllm_omni_compat.py shows the serve path's order)."""
    code = ("from vllm_omni.plugins import load_omni_general_plugins; load_omni_general_plugins(); "
            "import json; from omni_pd.upstream.vllm_omni_compat import installed; print(json.dumps(installed()))")
    proc = subprocess.run([ORACLE, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {k: got[k] for k in ("pd_prefill_rows", "talker_prefill_rows", "talker_prefill_merge")} == dict.fromkeys(
        ("pd_prefill_rows", "talker_prefill_rows", "talker_prefill_merge"), True)
    off = subprocess.run([ORACLE, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env={**{k: v for k, v in os.environ.items() if k != "VLLM_PLUGINS"},
                              "OMNI_PD_VLLM_OMNI_TALKER_PD": "0"})
    got = json.loads(off.stdout.strip().splitlines()[-1])
    assert (got["talker_prefill_merge"], got["pd_detect"]) == (False, True)  # the finer switch: just the Talker


DRAFT = ROOT / "docs" / "upstream" / "vllm-omni-0.30-orchestrator-prefill-mm.md"


def test_the_orchestrator_reproducer_prints_what_its_draft_shows():
    """docs/upstream/repro_orchestrator_prefill_mm.py, upstream only (no plugin): a canary too,
    it fails when vllm-omni keeps prefill's rows."""
    proc = subprocess.run([ORACLE, str(ROOT / "docs" / "upstream" / "repro_orchestrator_prefill_mm.py")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "VLLM_PLUGINS": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = DRAFT.read_text()
    pasted = text.split("Output:\n\n```text\n", 1)[1].split("```", 1)[0]
    assert proc.stdout.strip().splitlines()[-4:] == pasted.strip().splitlines()
