"""Every branch of the topology rules (OPD201-OPD206), with exact messages, locations,
help lines and notes (issue 16). The rule examples' golden (tests/test_rule_branches.py)
reaches one branch of each; these pin the others, named by the mutation run of
omni_pd/check/rules/topology.py (bench/mutation.py).
"""

from __future__ import annotations

from omni_pd.check.validate import ValidateOptions, options_from_example
from rule_found import found_with_notes as found  # tests/rule_found.py


_ROCM = "platforms:\n  rocm:\n    stages:\n      - {stage_id: 0, devices: \"0\"}\n"
_SHM = "connectors:\n  shm: {name: SharedMemoryConnector}\n"


# --- OPD201 input sources ---------------------------------------------------------------------------

def test_opd201_legacy_stage_args_missing_and_unknown_sources() -> None:
    text = ("stage_args:\n"
            "  - stage_id: 0\n    engine_input_source: []\n"
            "  - stage_id: 1\n    engine_args:\n      engine_input_source: [0, 5]\n"   # read under engine_args too
            "  - stage_id: 2\n"                                                     # missing
            "  - just-a-string\n"                                                   # not a stage: skipped
            "  - stage_id: 3\n    engine_input_source: 0\n")                        # not a list: left to the schema
    assert found(text, "OPD201") == [
        ("error", "stage 1: engine_input_source names stage 5, which does not exist", (4, 5),
         "use one of the stage ids: 0, 1, 2, 3", [], []),
        ("error", "stage 2: `engine_input_source` missing; a legacy stage_args file gets no default", (7, 5),
         "add `engine_input_source: []` to an entry stage, `[<upstream id>]` to the others", [], [])]


def test_opd201_legacy_top_level_source_is_pointed_at_its_value() -> None:
    # a file of no catalogued pipeline migrates (its sources unchecked) and, from vllm-omni 0.28
    # on, is served in its migrated form; before 0.28 --stage-configs-path reads these lists
    text = ("stage_args:\n  - stage_id: 0\n    engine_input_source: []\n"
            "  - stage_id: 1\n    engine_input_source: [0, 7, 0]\n")
    assert found(text, "OPD201", opts=ValidateOptions(vllm_version="0.26")) == [
        ("error", "stage 1: engine_input_source names stage 7, which does not exist", (5, 30),
         "use one of the stage ids: 0, 1", [], [])]


def test_opd201_the_entry_stage_and_a_missing_stage_and_a_stage_that_is_not_an_input() -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n"
            "  - stage_id: 0\n    input_connectors:\n      from_stage_1: shm\n      to_stage_1: shm\n"
            "  - stage_id: 1\n    input_connectors:\n      from_stage_0: shm\n"
            "  - stage_id: 2\n    input_connectors:\n      from_stage_7: shm\n      from_stage_0: shm\n" + _SHM)
    assert found(text, "OPD201") == [
        ("error", "stage 0 (thinker) reads `from_stage_1`, but stage 1 is not one of its inputs in pipeline "
                  "qwen3_omni_moe", (5, 7), "name its input here: none (entry stage)", [], []),
        ("error", "stage 2 (code2wav) reads `from_stage_7`, but stage 7 does not exist in pipeline qwen3_omni_moe",
         (12, 7), "name its input here: from_stage_1", [(7, 5, "stage 1 is its input")], []),
        ("error", "stage 2 (code2wav) reads `from_stage_0`, but stage 0 is not one of its inputs in pipeline "
                  "qwen3_omni_moe", (13, 7), "name its input here: from_stage_1", [(7, 5, "stage 1 is its input")], [])]


def test_opd201_a_legacy_entry_that_is_not_a_stage_does_not_end_the_scan() -> None:
    text = "stage_args:\n  - just-a-string\n  - stage_id: 0\n"
    assert [h[1] for h in found(text, "OPD201")] == [
        "stage 0: `engine_input_source` missing; a legacy stage_args file gets no default"]


def test_opd201_a_key_that_is_not_from_stage_and_a_right_input_do_not_end_the_scan() -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n"
            "  - stage_id: 1\n    input_connectors:\n      to_stage_2: shm\n      from_stage_2: shm\n"
            "  - stage_id: 2\n    input_connectors:\n      from_stage_1: shm\n      from_stage_0: shm\n" + _SHM)
    assert [(h[1], h[2]) for h in found(text, "OPD201")] == [
        ("stage 1 (talker) reads `from_stage_2`, but stage 2 is not one of its inputs in pipeline qwen3_omni_moe",
         (6, 7)),
        ("stage 2 (code2wav) reads `from_stage_0`, but stage 0 is not one of its inputs in pipeline qwen3_omni_moe",
         (10, 7))]


def test_opd201_all_platforms_checks_an_overlays_input_connectors_too() -> None:
    # `--platform rocm` reports the overlay's wrong input; `--all-platforms` ("base + every
    # overlay") must as well, not only the base platform's
    text = ("pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n  - stage_id: 1\n  - stage_id: 2\n"
            "    input_connectors:\n      from_stage_1: shm\n" + _SHM +
            "platforms:\n  rocm:\n    stages:\n      - stage_id: 2\n        input_connectors:\n          from_stage_0: shm\n")
    msg = "stage 2 (code2wav) reads `from_stage_0`, but stage 0 is not one of its inputs in pipeline qwen3_omni_moe"
    assert [(h[1], h[2]) for h in found(text, "OPD201", opts=ValidateOptions(platform="rocm"))] == [(msg, (15, 11))]
    assert [(h[1], h[2], h[5]) for h in found(text, "OPD201", opts=ValidateOptions(all_platforms=True))] == [
        (msg, (15, 11), ["found with the `platforms.rocm` overlay applied"])]


def test_opd201_an_input_the_deploy_file_does_not_list_has_no_related_entry() -> None:
    text = "pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 2\n    input_connectors:\n      from_stage_0: shm\n" + _SHM
    assert found(text, "OPD201") == [
        ("error", "stage 2 (code2wav) reads `from_stage_0`, but stage 0 is not one of its inputs in pipeline "
                  "qwen3_omni_moe", (5, 7), "name its input here: from_stage_1", [], [])]


def test_opd201_is_said_once_per_file_under_all_platforms() -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n  - stage_id: 1\n    input_connectors:\n"
            "      from_stage_2: shm\n" + _SHM + _ROCM)
    assert [h[1] for h in found(text, "OPD201", opts=ValidateOptions(all_platforms=True))] == [
        "stage 1 (talker) reads `from_stage_2`, but stage 2 is not one of its inputs in pipeline qwen3_omni_moe"]


# --- OPD202 stage ids -------------------------------------------------------------------------------

def test_opd202_every_duplicate_points_at_its_first_definition_and_an_orphan_id_is_named() -> None:
    text = "pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n  - stage_id: 5\n  - stage_id: 0\n  - stage_id: 5\n"
    assert found(text, "OPD202") == [
        ("error", "stage_id 5 is not a stage of pipeline qwen3_omni_moe (stages 0, 1, 2)", (4, 15),
         "use one of the pipeline's stage ids, or select the pipeline that has this stage (`pipeline:`)", [], []),
        ("error", "stage_id 0 appears twice", (5, 15), "give each stage its own id; vllm-omni keeps only one entry per id",
         [(3, 15, "first defined here")], []),
        ("error", "stage_id 5 appears twice", (6, 15), "give each stage its own id; vllm-omni keeps only one entry per id",
         [(4, 15, "first defined here")], [])]


def test_opd202_an_inferred_chain_with_a_gap_or_no_stage_0() -> None:
    for ids, known in (("0", "2"), ("1", "2")):
        text = f"stages:\n  - stage_id: {ids}\n  - stage_id: {known}\n"
        assert found(text, "OPD202") == [(
            "error", f"pipeline <linear chain> numbers its stages [{ids}, {known}], not 0..1", (1, 1),
            "number the stages 0..n-1 in routing order", [], [])]


def test_opd202_a_subset_of_the_pipelines_ids_in_any_order_is_fine() -> None:
    assert found("pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 2\n  - stage_id: 0\n", "OPD202") == []


def test_opd202_is_said_once_per_file_under_all_platforms() -> None:
    text = "pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n  - stage_id: 0\n" + _ROCM
    assert [h[1] for h in found(text, "OPD202", opts=ValidateOptions(all_platforms=True))] == [
        "stage_id 0 appears twice"]


# --- OPD203 connector references --------------------------------------------------------------------

def test_opd203_close_names_unknown_names_and_missing_target_stages() -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n"
            "  - stage_id: 0\n    output_connectors:\n      to_stage_1: shmm\n      other: zzz\n"
            "      to_stage_9: shm\n      to_stage_x: shm\n      to_stage_2: {name: inline}\n"
            "  - stage_id: 1\n    input_connectors:\n      from_stage_0: qqq\n      to_stage_8: shm\n" + _SHM)
    assert found(text, "OPD203") == [
        ("error", "stage 0: output_connectors.to_stage_1 names connector `shmm`, which `connectors:` does not define",
         (5, 19), "did you mean `shm`?", [], []),
        ("error", "stage 0: output_connectors.other names connector `zzz`, which `connectors:` does not define",
         (6, 14), "define `connectors: {zzz: {name: SharedMemoryConnector}}`", [], []),
        ("error", "stage 0: output connector `to_stage_9` targets a stage that does not exist", (7, 7),
         "name an existing downstream stage", [], []),
        ("error", "stage 1: input_connectors.from_stage_0 names connector `qqq`, which `connectors:` does not define",
         (12, 21), "define `connectors: {qqq: {name: SharedMemoryConnector}}`", [], []),
        ("error", "stage 1: output connector `to_stage_8` targets a stage that does not exist", (13, 7),
         "name an existing downstream stage", [], [])]


def test_opd203_connectors_that_are_not_a_mapping_define_nothing() -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n  - stage_id: 1\n    input_connectors:\n"
            "      from_stage_0: shm\nconnectors: [shm]\n")
    assert found(text, "OPD203") == [
        ("error", "stage 1: input_connectors.from_stage_0 names connector `shm`, which `connectors:` does not define",
         (6, 21), "define `connectors: {shm: {name: SharedMemoryConnector}}`", [], [])]


def test_opd203_is_said_once_per_file_under_all_platforms() -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n  - stage_id: 1\n    input_connectors:\n"
            "      from_stage_0: nope\n" + _SHM + _ROCM)
    assert [h[1] for h in found(text, "OPD203", opts=ValidateOptions(all_platforms=True))] == [
        "stage 1: input_connectors.from_stage_0 names connector `nope`, which `connectors:` does not define"]


# --- OPD204 edges -----------------------------------------------------------------------------------

_CHAIN = "pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\nedges:\n"


def test_opd204_unknown_ends_and_steps_that_are_not_n_to_n_plus_1() -> None:
    text = _CHAIN + "  - {from: 0, to: 1}\n  - {from: 1, to: 2}\n  - {from: 2, to: 7}\n  - {from: 9, to: 0}\n"
    assert found(text, "OPD204") == [
        ("error", "edge 2 -> 7 is not a chain step; the orchestrator forwards stage N to N+1 only", (7, 5),
         "write `{from: 2, to: 3}` or renumber the stages", [], []),
        ("error", "edge 2 -> 7 names stage 7, which does not exist", (7, 19), "use existing stage ids", [], []),
        ("error", "edge 9 -> 0 is not a chain step; the orchestrator forwards stage N to N+1 only", (8, 5),
         "write `{from: 9, to: 10}` or renumber the stages", [], []),
        ("error", "edge 9 -> 0 names stage 9, which does not exist", (8, 12), "use existing stage ids", [], [])]


def test_opd204_a_dag_that_skips_a_stage_is_not_a_cycle() -> None:
    text = _CHAIN + "  - {from: 0, to: 1}\n  - {from: 1, to: 2}\n  - {from: 0, to: 2}\n"
    assert found(text, "OPD204") == [
        ("error", "edge 0 -> 2 is not a chain step; the orchestrator forwards stage N to N+1 only", (7, 5),
         "write `{from: 0, to: 1}` or renumber the stages", [], [])]


def test_opd204_a_cycle_behind_the_entry_stage_and_a_self_loop() -> None:
    cycle = ("error", "`edges:` contain a cycle", (4, 1), "the stage graph must be a DAG (a chain today)", [], [])
    text = _CHAIN + "  - {from: 0, to: 1}\n  - {from: 1, to: 2}\n  - {from: 2, to: 1}\n"
    assert found(text, "OPD204") == [cycle, (
        "error", "edge 2 -> 1 is not a chain step; the orchestrator forwards stage N to N+1 only", (7, 5),
        "write `{from: 2, to: 3}` or renumber the stages", [], [])]
    assert found(_CHAIN + "  - {from: 1, to: 1}\n", "OPD204") == [cycle, (
        "error", "edge 1 -> 1 is not a chain step; the orchestrator forwards stage N to N+1 only", (5, 5),
        "write `{from: 1, to: 2}` or renumber the stages", [], [])]


def test_has_cycle_counts_every_incoming_edge() -> None:
    from omni_pd.check.rules.topology import _has_cycle

    assert _has_cycle({}) is False
    assert _has_cycle({0: [1, 2], 1: [2]}) is False      # 2 has two incoming edges
    assert _has_cycle({0: [1], 1: [2], 2: [1]}) is True
    assert _has_cycle({0: [1], 1: [0], 2: [3]}) is True  # the cycle has no entry; 2 -> 3 does
    assert _has_cycle({i: [i + 1] for i in range(2000)}) is False


def test_opd204_is_said_once_per_file_under_all_platforms() -> None:
    text = _CHAIN + "  - {from: 0, to: 2}\n" + _ROCM
    assert [h[1] for h in found(text, "OPD204", opts=ValidateOptions(all_platforms=True))] == [
        "edge 0 -> 2 is not a chain step; the orchestrator forwards stage N to N+1 only"]


# --- OPD205 final outputs ---------------------------------------------------------------------------

def test_opd205_final_output_set_against_the_catalogued_pipeline_either_way() -> None:
    text = ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n  - stage_id: 0\n    final_output: false\n"
            "  - stage_id: 1\n    final_output: false\n  - stage_id: 2\n    final_output: true\n"
            "  - stage_id: 3\n    final_output: true\n")
    assert found(text, "OPD205") == [
        ("error", "stage 1 sets final_output: false, but pipeline qwen3_omni_moe_pd has it on", (7, 19),
         "remove `final_output`; the pipeline decides the final outputs", [], []),
        ("error", "stage 2 sets final_output: true, but pipeline qwen3_omni_moe_pd has it off", (9, 19),
         "remove `final_output`; the pipeline decides the final outputs", [], [])]


def test_opd205_a_stage_without_the_key_does_not_end_the_scan() -> None:
    text = "pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n  - stage_id: 1\n    final_output: true\n"
    assert found(text, "OPD205") == [(
        "error", "stage 1 sets final_output: true, but pipeline qwen3_omni_moe has it off", (5, 19),
        "remove `final_output`; the pipeline decides the final outputs", [], [])]


def test_opd205_an_inferred_chain_is_not_held_to_a_catalogue_entry() -> None:
    assert found("stages:\n  - stage_id: 0\n  - stage_id: 1\n    final_output: false\n", "OPD205") == []


def test_opd205_is_said_once_per_file_under_all_platforms() -> None:
    text = ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n  - stage_id: 0\n    final_output: true\n"
            "  - stage_id: 1\n" + _ROCM)
    assert [h[1] for h in found(text, "OPD205", opts=ValidateOptions(all_platforms=True))] == [
        "stage 0 is the prefill stage; it must not be a final output"]


# --- OPD206 stage set -------------------------------------------------------------------------------

def test_opd206_a_pd_pipeline_names_each_missing_sub_config_and_the_thinker_only_pipeline() -> None:
    text = "pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n  - {stage_id: 0, devices: \"0\"}\n"
    ctx = {"model": {"model_type": "qwen3_omni_moe", "subconfigs": ["thinker_config", "talker_config"]}}
    assert found(text, "OPD206", ctx) == [(
        "error", "pipeline qwen3_omni_moe_pd also materialises stage 3 (code2wav, needs code2wav_config); the "
                 "checkpoint has none of these", (1, 11),
        "use `pipeline: qwen3_omni_moe_thinker_only_pd` (the same split of the Thinker alone: prefill + decode)", [],
        ["checkpoint sub-configs: talker_config, thinker_config"])]


def test_opd206_a_split_file_keeps_its_split_and_an_empty_sub_config_list_says_none() -> None:
    # a review found the three-stage name (qwen3_omni_moe_thinker_only) suggested for a file that is already PD,
    # and "checkpoint sub-configs: " for a checkpoint with none
    text = "pipeline: qwen2_5_omni_pd\nasync_chunk: false\nstages:\n  - {stage_id: 0, devices: \"0\"}\n"
    got = found(text, "OPD206", {"model": {"model_type": "qwen2_5_omni", "subconfigs": []}})
    assert [(g[3], g[5]) for g in got] == [(
        "use `pipeline: qwen2_5_omni_thinker_only_pd` (the same split of the Thinker alone: prefill + decode)",
        ["checkpoint sub-configs: none"])]


def test_opd206_a_pipeline_chosen_from_the_model_points_at_stages() -> None:
    ctx = {"model": {"model_type": "qwen2_5_omni", "subconfigs": ["thinker_config"]}}
    assert found("stages:\n  - {stage_id: 0, devices: \"0\"}\n", "OPD206", ctx) == [(
        "error", "pipeline qwen2_5_omni also materialises stage 1 (talker, needs talker_config), stage 2 (code2wav, "
                 "needs code2wav_config); the checkpoint has none of these", (1, 1),
        "use `pipeline: qwen2_5_omni_thinker_only` (its PD split then yields exactly prefill and decode)", [],
        ["checkpoint sub-configs: thinker_config"])]


def test_opd206_without_a_thinker_only_alternative_the_help_says_so() -> None:
    text = "pipeline: qwen3_omni_moe_thinker_only_pd\nasync_chunk: false\nstages:\n  - {stage_id: 0, devices: \"0\"}\n"
    ctx = {"model": {"model_type": "qwen3_omni_moe", "subconfigs": ["talker_config"]}}
    assert found(text, "OPD206", ctx) == [(
        "error", "pipeline qwen3_omni_moe_thinker_only_pd also materialises stage 0 (thinker, needs thinker_config), "
                 "stage 1 (thinker, needs thinker_config); the checkpoint has none of these", (1, 11),
        "select a pipeline whose stages the checkpoint provides", [], ["checkpoint sub-configs: talker_config"])]


def test_opd206_needs_the_checkpoints_sub_configs() -> None:
    text = "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"0\"}\n"
    assert found(text, "OPD206", {"model": {"model_type": "qwen3_omni_moe"}}) == []
    full = {"model": {"model_type": "qwen3_omni_moe",
                      "subconfigs": ["thinker_config", "talker_config", "code2wav_config"]}}
    assert found(text, "OPD206", full) == []


def test_opd206_is_said_once_per_file_under_all_platforms() -> None:
    text = "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"0\"}\n" + _ROCM
    opts = options_from_example({"model": {"model_type": "qwen3_omni_moe", "subconfigs": ["thinker_config"]}})
    opts.all_platforms = True
    assert len(found(text, "OPD206", opts=opts)) == 1


def test_opd203_and_opd205_all_platforms_check_an_overlays_settings_too() -> None:
    # `--platform rocm` reports the overlay's undefined connector and wrong final_output;
    # `--all-platforms` ("base + every overlay") must as well
    text = ("pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n  - stage_id: 1\n    input_connectors:\n"
            "      from_stage_0: shm\n" + _SHM + "platforms:\n  rocm:\n    stages:\n      - stage_id: 1\n"
            "        input_connectors:\n          from_stage_0: nope\n        final_output: true\n")
    note = ["found with the `platforms.rocm` overlay applied"]
    ref = "stage 1: input_connectors.from_stage_0 names connector `nope`, which `connectors:` does not define"
    fin = "stage 1 sets final_output: true, but pipeline qwen3_omni_moe has it off"
    one = ValidateOptions(platform="rocm")
    assert [(h[1], h[2]) for h in found(text, "OPD203", opts=one)] == [(ref, (14, 25))]
    assert [(h[1], h[2]) for h in found(text, "OPD205", opts=one)] == [(fin, (15, 23))]
    every = ValidateOptions(all_platforms=True)
    assert [(h[1], h[2], h[5]) for h in found(text, "OPD203", opts=every)] == [(ref, (14, 25), note)]
    assert [(h[1], h[2], h[5]) for h in found(text, "OPD205", opts=every)] == [(fin, (15, 23), note)]
