"""Branches of the schema rules (OPD102-OPD112, omni_pd/check/rules/schema.py) that no rule
example reaches, with exact messages, locations and help lines (issue 16: the mutation run
of bench/mutation.py measures what the examples leave unpinned).

Each test names the branch it pins. The rule-example golden is in tests/test_rule_branches.py.
"""

from __future__ import annotations

import pytest

from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.diagnostics import Severity
from rule_found import col  # tests/rule_found.py

E, W = Severity.ERROR, Severity.WARNING
PD = "pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
KV = "{{kv_connector: NixlConnector, kv_role: kv_{role}, engine_id: {eid}{x}}}"


def hits(text: str, code: str, opts: ValidateOptions | None = None) -> list[tuple]:
    """(severity, message, (line, column), help, [(line, column, label) of related]) of each
    ``code`` diagnostic; a location without a line (command line, launcher environment) is
    given as (file, path)."""
    res = validate_text(text, "t.yaml", opts)
    assert [d.message for d in res.diagnostics if d.code == "OPD000"] == []  # no rule crashed
    return [(d.severity, d.message,
             (d.location.line, d.location.column) if d.location.line is not None else (d.location.file, d.location.path),
             d.help, [(r.line, r.column, r.label) for r in d.related])
            for d in res.diagnostics if d.code == code]


def pair(p_x: str = "", d_x: str = "", tail: str = "") -> str:
    return (PD + "  - {stage_id: 0, devices: \"0\", kv_transfer_config: " + KV.format(role="producer", eid="p", x=p_x)
            + "}\n  - {stage_id: 1, devices: \"1\", kv_transfer_config: " + KV.format(role="consumer", eid="d", x=d_x)
            + "}\n" + tail)


# --- OPD104 port fields mixing int and str --------------------------------------------------------

def test_opd104_the_string_minority_is_named_with_up_to_two_integer_peers() -> None:
    text = pair(", kv_connector_extra_config: {http_port: 8100, b_port: 8200, c_port: 8300, other: \"x\"}",
                ", kv_port: \"22001\", kv_connector_extra_config: {http_port: \"8400\"}")
    assert hits(text, "OPD104") == [(
        W, "port fields mix int and str: `kv_connector_extra_config.http_port` is a string ('8400') while other port "
        "fields are integers",
        col(text, "\"8400\""), "write every port as an unquoted integer, e.g. http_port: 8400",
        [(*col(text, "8100"), "`kv_connector_extra_config.http_port` written as 8100"),
         (*col(text, "8200"), "`kv_connector_extra_config.b_port` written as 8200")])]


def test_opd104_an_integer_minority_among_strings_is_named_as_the_integer() -> None:
    text = pair(", kv_connector_extra_config: {http_port: \"8100\", b_port: \"8200\"}",
                ", kv_port: \"22001\", kv_connector_extra_config: {http_port: 8300}")
    assert hits(text, "OPD104") == [(
        W, "port fields mix int and str: `kv_connector_extra_config.http_port` is an integer (8300) while other port "
        "fields are strings",
        col(text, "8300"), "write every port as an unquoted integer, e.g. http_port: 8300",
        [(*col(text, '"8100"'), "`kv_connector_extra_config.http_port` written as '8100'"),
         (*col(text, '"8200"'), "`kv_connector_extra_config.b_port` written as '8200'")])]


def test_opd104_kv_port_is_coerced_by_kv_transfer_config_so_its_spelling_is_no_mix() -> None:
    # vLLM 0.30 vllm/config/kv_transfer.py:90 ``kv_port: int`` (pydantic, lax): "22001" is 22001
    assert hits(pair(", kv_port: 21001", ", kv_port: \"22001\""), "OPD104") == []
    assert hits(pair(", kv_port: \"21001\", kv_connector_extra_config: {http_port: 8100}",
                     ", kv_port: 22001, kv_connector_extra_config: {http_port: 8200}"), "OPD104") == []


def test_opd104_a_tie_names_the_strings_and_a_non_numeric_string_is_shown_as_written() -> None:
    got = hits(pair(", kv_connector_extra_config: {side_port: 1}", ", kv_connector_extra_config: {side_port: ab}"),
               "OPD104")
    assert [(g[1], g[3]) for g in got] == [(
        "port fields mix int and str: `kv_connector_extra_config.side_port` is a string ('ab') while other port "
        "fields are integers", "write every port as an unquoted integer, e.g. side_port: ab")]


def test_opd104_booleans_and_one_kind_are_not_a_mix() -> None:
    assert hits(pair(", kv_port: 21001, kv_connector_extra_config: {http_port: true}", ", kv_port: 22001"),
                "OPD104") == []
    assert hits(pair(", kv_port: \"21001\"", ", kv_port: \"22001\""), "OPD104") == []


def test_opd104_reads_the_platform_overlays_value_as_written() -> None:
    overlay = ("platforms:\n  npu:\n    stages:\n      - {stage_id: 1, kv_transfer_config: "
               "{kv_connector_extra_config: {http_port: \"8202\"}}}\n")
    text = pair(", kv_connector_extra_config: {http_port: 8100}", ", kv_connector_extra_config: {http_port: 8200}", overlay)
    got = hits(text, "OPD104", ValidateOptions(platform="npu"))
    assert [(g[1], g[2], g[4]) for g in got] == [(
        "port fields mix int and str: `kv_connector_extra_config.http_port` is a string ('8202') while other port "
        "fields are integers", col(text, '"8202"'),
        [(*col(text, "8100"), "`kv_connector_extra_config.http_port` written as 8100")])]
    assert hits(text, "OPD104") == []


# --- OPD105 environment variable names ------------------------------------------------------------

def test_opd105_the_launcher_environment_and_each_stage_env_are_checked() -> None:
    text = "stages:\n  - stage_id: 0\n    env: {ASCEND_RT_VISIBLE_DEVICE: \"0\", MY_VAR: \"1\", CUDA_VISIBLE_DEVICES: \"0\"}\n"
    opts = ValidateOptions(env={"CUDA_VISIBLE_DEVICE": "0", "HOME": "/root", "VLLM_HOST_IP": "10.0.0.1"})
    assert hits(text, "OPD105", opts) == [
        (E, "`CUDA_VISIBLE_DEVICE` is not a known variable; did you mean `CUDA_VISIBLE_DEVICES`?",
         ("<launcher environment>", ("CUDA_VISIBLE_DEVICE",)),
         "export CUDA_VISIBLE_DEVICES=... instead; the misspelt name is ignored", []),
        (E, "stage 0: `ASCEND_RT_VISIBLE_DEVICE` is not a known variable; did you mean `ASCEND_RT_VISIBLE_DEVICES`?",
         (3, 11), "rename it to `ASCEND_RT_VISIBLE_DEVICES`", [])]


# --- OPD106 global engine flags -------------------------------------------------------------------

def test_opd106_names_every_stage_scoped_flag_and_the_stage_count() -> None:
    text = "stages:\n  - stage_id: 0\n  - stage_id: 1\n  - stage_id: 2\n"
    opts = ValidateOptions(cli={"tensor_parallel_size": 2, "served_model_name": "x", "max_model_len": 4096})
    assert hits(text, "OPD106", opts) == [(
        W, "global --tensor-parallel-size, --max-model-len would be broadcast to all 3 stages",
        ("<command line>", ("tensor_parallel_size", "max_model_len")),
        "drop the flag and set `tensor_parallel_size`, `max_model_len` per stage in the deploy YAML", [])]


def test_opd106_one_stage_or_plain_vllm_engines_are_not_broadcast_to() -> None:
    opts = ValidateOptions(cli={"tensor_parallel_size": 2})
    assert hits("stages:\n  - stage_id: 0\n", "OPD106", opts) == []
    assert hits(pair().replace("qwen3_omni_moe_pd", "llm_pd"), "OPD106", opts) == []
    assert len(hits(pair(), "OPD106", opts)) == 1


# --- OPD103 unknown keys --------------------------------------------------------------------------

def test_opd103_top_level_typo_is_an_error_a_far_key_a_warning_and_x_keys_are_free() -> None:
    got = hits("pipelin: qwen3_omni_moe\nx-notes: 1\nmy_notes: hi\nstages:\n  - stage_id: 0\n", "OPD103")
    assert [(g[0], g[1], g[2], g[3][:40]) for g in got] == [
        (E, "unknown top-level key `pipelin`: vllm-omni reads only its own fields and drops it, so `pipeline` is "
            "not set", (1, 1), "did you mean `pipeline`?"),
        (W, "unknown top-level key `my_notes` (vllm-omni drops it)", (3, 1), "top-level keys: active_stream_window, as")]


def test_opd103_a_stage_key_at_the_top_level_is_named_as_such() -> None:
    # a review found `tensor_parallel_size: 2` at the top level reported as a typo of `data_parallel_size`
    got = hits("tensor_parallel_size: 2\nmax_model_len: 4096\nstages:\n  - stage_id: 0\n", "OPD103")
    assert got == [
        (E, "`tensor_parallel_size` is a stage setting, not a top-level one: vllm-omni reads only its own top-level "
            "fields and drops it, so no stage gets it", (1, 1), "set `tensor_parallel_size` in each stage entry that "
            "needs it", []),
        (E, "`max_model_len` is a stage setting, not a top-level one: vllm-omni reads only its own top-level fields "
            "and drops it, so no stage gets it", (2, 1), "set `max_model_len` in each stage entry that needs it", [])]
    # a pipeline-wide size vllm-omni reads at the top level is no finding
    assert hits("data_parallel_size: 2\nstages:\n  - stage_id: 0\n", "OPD103") == []


def test_opd103_unknown_platforms_near_and_far() -> None:
    text = "stages:\n  - {stage_id: 0}\nplatforms:\n  cudaa: {}\n  foo: {}\n  npu: {}\n"
    said = "under `platforms:`: vllm-omni applies the overlay of the platform it runs on only, so this one never applies"
    assert hits(text, "OPD103") == [
        (E, f"unknown platform `cudaa` {said}", (4, 3), "did you mean `cuda`? platforms: cuda, rocm, npu, xpu, musa", []),
        (W, f"unknown platform `foo` {said}", (5, 3), "platforms: cuda, rocm, npu, xpu, musa", [])]


def test_opd103_stage_keys_in_the_stage_its_engine_args_and_an_overlay_with_parallel_config_keys() -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, max_num_seq: 8, x-max_num_seq: 1, "
            "engine_args: {max_num_seq: 8, max_num_seqs: 4}}\nplatforms:\n  npu:\n    stages:\n"
            "      - {stage_id: 0, max_num_seq: 8, parallel_config: {tensor_parallel: 2, foo: 1}}\n")
    refuses = "vllm-omni 0.30 refuses to start (\"no structured config owner\")"
    owner = "vllm-omni refuses it (\"no structured config owner\")"
    assert hits(text, "OPD103") == [
        (E, f"unknown stage key `max_num_seq`: {refuses}", (3, 19), "did you mean `max_num_seqs`?", []),
        (E, f"unknown stage key `max_num_seq`: {refuses}", (3, 67), "did you mean `max_num_seqs`?", []),
        (E, f"unknown stage key `max_num_seq` in the `platforms.npu` overlay: {refuses}", (7, 23),
         "did you mean `max_num_seqs`?", []),
        (E, "`tensor_parallel` is not a parallel_config key in the `platforms.npu` overlay", (7, 57),
         f"did you mean `tensor_parallel_size`? {owner}", []),
        (E, "`foo` is not a parallel_config key in the `platforms.npu` overlay", (7, 77), owner, [])]


def test_opd103_on_another_release_the_setting_is_lost() -> None:
    got = hits("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, max_num_seq: 8}\n", "OPD103",
               ValidateOptions(vllm_version="0.24"))
    assert [g[1] for g in got] == [
        "unknown stage key `max_num_seq`: the setting it was meant for is not applied (vllm-omni 0.30 refuses to "
        "start: \"no structured config owner\")"]


def test_opd103_plain_vllm_engines_get_the_flag_and_engine_args_parallel_config_is_checked() -> None:
    text = ("pipeline: llm\nstages:\n  - {stage_id: 0, devices: \"0\", max_num_seq: 8, engine_args: {parallel_config: "
            "{tensor_parallel_size: 1, tensor_parallel: 2}}}\n")
    assert hits(text, "OPD103") == [
        (E, "unknown stage key `max_num_seq`: it becomes `--max-num-seq` on the engine's `vllm serve` command line, "
            "which vLLM rejects", (3, 33), "did you mean `max_num_seqs`?", []),
        (E, "`tensor_parallel` is not a parallel_config key", (3, 106),
         "did you mean `tensor_parallel_size`? vllm-omni refuses it (\"no structured config owner\")", [])]


_ENGINE_AGS = "pipeline: {p}\nstages:\n  - stage_id: 0\n    devices: \"0\"\n    engine_ags:\n      max_num_seqs: 8\n"


@pytest.mark.parametrize("pipeline, effect", [
    ("qwen3_omni_moe", "vllm-omni 0.30 refuses to start (\"no structured config owner\")"),
    ("qwen3_omni_moe_pd", "vllm-omni 0.30 refuses to start (\"no structured config owner\")"),
    ("llm", "it becomes `--engine-ags` on the engine's `vllm serve` command line, which vLLM rejects")])
def test_opd103_a_typo_of_engine_args_is_one_error_on_every_pipeline(pipeline: str, effect: str) -> None:
    # issue 24 ("also left"): it was a warning on vllm-omni pipelines (pre-commit passed it) and an
    # error reported twice on llm. vllm-omni 0.30 refuses it: the oracle (python -m
    # omni_pd.upstream.vllm_oracle) answers "ValueError: Stage 0 (llm_ar) has explicit engine
    # argument(s) with no structured config owner: engine_ags" on the qwen3_omni_moe file.
    res = validate_text(_ENGINE_AGS.format(p=pipeline), "t.yaml")
    assert [(d.code, d.severity, d.message, (d.location.line, d.location.column), d.help)
            for d in res.diagnostics if d.location.path == ("stages", 0, "engine_ags")] == [
        ("OPD103", E, f"unknown stage key `engine_ags`: {effect}", (5, 5), "did you mean `engine_args`?")]
    assert [d.code for d in res.diagnostics].count("OPD103") == 1


def test_opd103_engine_ags_fails_the_pre_commit_entry(tmp_path, capsys) -> None:
    from rule_found import validate_cli

    rc, out = validate_cli(tmp_path, capsys, "omni.yaml", _ENGINE_AGS.format(p="qwen3_omni_moe"), "--quiet")
    assert rc == 1
    assert out.splitlines()[0] == ("error[OPD103]: unknown stage key `engine_ags`: vllm-omni 0.30 refuses to start "
                                   "(\"no structured config owner\")")


def test_opd103_a_legacy_file_and_the_later_platforms_of_all_platforms_are_not_checked() -> None:
    assert hits("stage_args:\n  - {stage_id: 0, max_num_seq: 8}\npipelin: x\n", "OPD103") == []
    text = "stages:\n  - {stage_id: 0}\nplatforms:\n  cudaa: {}\n"
    assert len(hits(text, "OPD103", ValidateOptions(all_platforms=True))) == 1  # once, not once per platform


# --- OPD111 stage keys vllm-omni has no place for -------------------------------------------------

_NO_PLACE = "remove it, or use a vLLM engine argument (see `vllm serve --help`)"


def test_opd111_stage_engine_args_and_overlay_keys_and_typos_left_to_opd103() -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, seq_budget: 8, max_num_seq: 2, x-a: 1, "
            "engine_args: {seq_budget: 1, max_num_seqs: 3}}\nplatforms:\n  rocm:\n    stages:\n"
            "      - {stage_id: 0, seq_budget: 8}\n")
    said = "vllm-omni 0.30 has no place for stage key `{}`{}: the server would refuse to start"
    assert hits(text, "OPD111") == [
        (E, said.format("seq_budget", ""), (3, 19), _NO_PLACE, []),
        (E, said.format("x-a", ""), (3, 50), _NO_PLACE, []),
        (E, said.format("seq_budget", ""), (3, 72), _NO_PLACE, []),
        (E, said.format("seq_budget", " (`platforms.rocm` overlay)"), (7, 23), _NO_PLACE, [])]


def test_opd111_names_a_close_owned_key() -> None:
    got = hits("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, max_num_sequences: 8}\n", "OPD111")
    assert [g[3] for g in got] == ["did you mean `max_num_seqs`? " + _NO_PLACE]


def test_opd111_only_named_vllm_omni_pipelines_on_0_30_once_per_run() -> None:
    key = "  - {stage_id: 0, devices: \"0\", seq_budget: 8}\n"
    assert hits("pipeline: llm\nstages:\n" + key, "OPD111") == []               # plain vllm serve: OPD107's
    assert hits("stages:\n" + key, "OPD111") == []                              # no pipeline: a stand-in chain
    assert hits("stage_args:\n" + key, "OPD111") == []                          # legacy file
    assert len(hits("pipeline: qwen3_omni_moe\nstages:\n" + key, "OPD111", ValidateOptions(all_platforms=True))) == 1


# --- OPD112 one parallel size from two sources ----------------------------------------------------

_DIT = "stages:\n  - {{stage_id: 0, devices: \"{dev}\"{flat}, parallel_config: {{{nested}}}}}\n"


def test_opd112_every_clashing_size_is_listed_with_each_winner_and_equal_ones_left_out() -> None:
    text = _DIT.format(dev="0,1,2,3", flat=", tensor_parallel_size: 1, pipeline_parallel_size: 1, data_parallel_size: 1, "
                       "cfg_parallel_size: 2, use_hsdp: true",
                       nested="tensor_parallel_size: 4, pipeline_parallel_size: 2, data_parallel_size: 1, "
                       "cfg_parallel_size: 1, use_hsdp: false")
    assert hits(text, "OPD112") == [(
        E, "stage 0 sets tensor_parallel_size 1 / pipeline_parallel_size 1 / cfg_parallel_size 2 / use_hsdp True and "
        "parallel_config.tensor_parallel_size 4 / pipeline_parallel_size 2 / cfg_parallel_size 1 / use_hsdp False; "
        "vllm-omni uses parallel_config", (2, 61),
        "write each size once: edit parallel_config (or drop it and keep the flat keys)",
        [(2, 192, "wins: tensor_parallel_size 4"), (2, 219, "wins: pipeline_parallel_size 2"),
         (2, 264, "wins: cfg_parallel_size 1"), (2, 277, "wins: use_hsdp False")])]


def test_opd112_a_quoted_equal_size_is_the_same_size() -> None:
    assert hits(_DIT.format(dev="0,1", flat=", tensor_parallel_size: 2", nested="tensor_parallel_size: \"2\""),
                "OPD112") == []


def test_opd112_each_global_flag_an_llm_stages_nested_block_overrides() -> None:
    text = ("pipeline: llm\nstages:\n  - {stage_id: 0, devices: \"0,1\", parallel_config: {tensor_parallel_size: 2, "
            "data_parallel_size: 1}}\n")
    opts = ValidateOptions(cli={"tensor_parallel_size": 1, "data_parallel_size": 2, "pipeline_parallel_size": 1})
    said = ("stage 0: the global --{f} {c} is overridden by parallel_config.{k} {n} (vllm-omni merges the nested block "
            "over flat keys and command-line flags of an LLM stage)")
    assert hits(text, "OPD112", opts) == [
        (E, said.format(f="tensor-parallel-size", c=1, k="tensor_parallel_size", n=2), (3, 75),
         "drop the flag, or set parallel_config.tensor_parallel_size: 1 in the deploy YAML", []),
        (E, said.format(f="data-parallel-size", c=2, k="data_parallel_size", n=1), (3, 98),
         "drop the flag, or set parallel_config.data_parallel_size: 2 in the deploy YAML", [])]
    assert hits(text, "OPD112", ValidateOptions(cli={"tensor_parallel_size": "2"})) == []


def test_opd112_a_parallel_config_that_is_not_a_mapping_is_opd101s() -> None:
    text = "pipeline: llm\nstages:\n  - {stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2, parallel_config: 3}\n"
    assert hits(text, "OPD112", ValidateOptions(cli={"tensor_parallel_size": 1})) == []


# --- OPD107 flags the target `vllm serve` does not accept -----------------------------------------

_TWO = "stages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.4}\n"
_LLM_PD = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
           "  - {{stage_id: 0, devices: \"0\"{x}, kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_producer, "
           "engine_id: p}}}}\n"
           "  - {{stage_id: 1, devices: \"1\", kv_transfer_config: {{kv_connector: NixlConnector, kv_role: kv_consumer, "
           "engine_id: d}}}}\n")
_CLI = "<command line>"


def test_opd107_a_per_stage_flag_names_the_stage_field_or_the_stage_entry() -> None:
    opts = ValidateOptions(cli={"stage_0_devices": "0", "stage_1_seq_budget": 3}, vllm_version="0.30")
    assert hits(_TWO, "OPD107", opts) == [
        (E, "--stage-0-devices is not a `vllm serve --omni` flag (unrecognized arguments): it is per stage",
         (_CLI, ("stage_0_devices",)),
         "set stages[0].devices in the deploy YAML; or --stage-overrides '{\"0\": {\"devices\": \"0\"}}'", []),
        (E, "--stage-1-seq-budget is not a `vllm serve --omni` flag (unrecognized arguments): it is per stage",
         (_CLI, ("stage_1_seq_budget",)),
         "set `seq_budget` in the stage 1 entry of the deploy YAML; or --stage-overrides "
         "'{\"1\": {\"seq_budget\": \"3\"}}'", [])]


def test_opd107_a_per_stage_flag_on_plain_vllm_engines_has_no_stage_overrides() -> None:
    opts = ValidateOptions(cli={"stage_0_devices": "0"}, vllm_version="0.30")
    assert [g[3] for g in hits(_LLM_PD.format(x=""), "OPD107", opts)] == ["set stages[0].devices in the deploy YAML"]


def test_opd107_unknown_flags_with_and_without_a_near_one_and_omni_only_flags() -> None:
    assert hits(_TWO, "OPD107", ValidateOptions(cli={"zzzqqq": 1}, vllm_version="0.30")) == [(
        E, "--zzzqqq is not a `vllm serve --omni` flag in vLLM 0.30", (_CLI, ("zzzqqq",)),
        "see `vllm serve --help` for the flags of this release", [])]
    opts = ValidateOptions(cli={"stage_overrides": "{}", "max_model_length": 3}, vllm_version="0.30")
    assert hits(_LLM_PD.format(x=""), "OPD107", opts) == [
        (E, "--stage-overrides is not a `vllm serve` flag in vLLM 0.30 (a `vllm serve --omni` flag; this pipeline runs "
            "plain `vllm serve` engines)", (_CLI, ("stage_overrides",)), "remove it", []),
        (E, "--max-model-length is not a `vllm serve` flag in vLLM 0.30", (_CLI, ("max_model_length",)),
         "did you mean --max-model-len?", [])]


def test_opd107_flags_of_a_release_without_a_list_are_one_info_and_stage_flags_still_errors() -> None:
    opts = ValidateOptions(cli={"max_model_len": 4096, "dtype": "x", "stage_1_devices": "0"}, vllm_version="0.22")
    got = hits(_TWO, "OPD107", opts)
    assert [(g[0], g[1][:40], g[2]) for g in got] == [
        (E, "--stage-1-devices is not a `vllm serve -", (_CLI, ("stage_1_devices",))),
        (Severity.INFO, "no `vllm serve` flag list for vLLM 0.22 ", (_CLI, ("--max-model-len", "--dtype")))]
    assert got[1][1].endswith(": --max-model-len, --dtype not checked")


def test_opd107_plain_vllm_stage_keys_become_flags_typos_and_x_keys_excepted() -> None:
    text = _LLM_PD.format(x=", seq_budget: 8, x-a: 1, max_num_seqs: 2, engine_args: {zap: 1, max_num_seq: 3}")
    said = "stage 0: `{k}` becomes `--{f}` on this engine's `vllm serve` command line, which vLLM 0.30 does not accept"
    assert hits(text, "OPD107", ValidateOptions(vllm_version="0.30")) == [
        (E, said.format(k="seq_budget", f="seq-budget"), (4, 33), "remove it", []),
        (E, said.format(k="zap", f="zap"), (4, 87), "remove it", [])]
    # no flag list for the release and no flag given: nothing to check against
    assert hits(_LLM_PD.format(x=", seq_budget: 8"), "OPD107", ValidateOptions(vllm_version="0.22")) == []


def test_a_key_near_a_stage_key_that_plain_vllm_serve_accepts_is_not_a_typo_there() -> None:
    # `cudagraph_capture_sizes` is one edit-ratio from `max_cudagraph_capture_size` but a vLLM 0.30 serve flag
    text = "pipeline: {p}\nstages:\n  - {{stage_id: 0, devices: \"0\", cudagraph_capture_sizes: [1, 2]}}\n"
    v30 = ValidateOptions(vllm_version="0.30")
    for code in ("OPD103", "OPD107", "OPD111"):
        assert hits(text.format(p="llm"), code, v30) == [], code
    # no flag list for vLLM 0.22: a near miss of a stage key stays a typo
    assert [g[1] for g in hits(text.format(p="llm"), "OPD103", ValidateOptions(vllm_version="0.22"))] == [
        "unknown stage key `cudagraph_capture_sizes`: it becomes `--cudagraph-capture-sizes` on the engine's "
        "`vllm serve` command line, which vLLM rejects"]
    # vllm-omni has no owner for it
    assert [(g[1], g[3]) for g in hits(text.format(p="qwen3_omni_moe"), "OPD103", v30)] == [(
        "unknown stage key `cudagraph_capture_sizes`: vllm-omni 0.30 refuses to start (\"no structured config owner\")",
        "did you mean `max_cudagraph_capture_size`?")]


def test_opd102_a_legacy_file_is_located_at_stage_args() -> None:
    assert hits("x: 1\nstage_args:\n  - stage_id: 0\n    engine_input_source: []\n", "OPD102") == [(
        E, "legacy `stage_args` file: no schema defaults are applied; vllm-omni 0.30's deploy loader only reads "
        "`stages:`", (2, 1), "run `omni-pd migrate FILE -o OUT.yaml` (the `stages:` schema; serve it with "
        "--deploy-config)", [])]


@pytest.mark.parametrize(("release", "severity"), [("0.24", W), ("0.26", W), ("0.28", E), ("0.30", E)])
def test_opd102_is_a_warning_only_where_stage_configs_path_still_loads_the_file(release: str, severity) -> None:
    # vllm-omni 0.28's load_deploy_config refuses `stage_args:` (the 0.26.0 wheel has no such check)
    got = hits("stage_args:\n  - stage_id: 0\n    engine_input_source: []\n", "OPD102",
               ValidateOptions(vllm_version=release))
    assert [(g[0], g[2]) for g in got] == [(severity, (1, 1))]
    if severity is W:
        assert got[0][1] == (f"legacy `stage_args` file: no schema defaults are applied on vllm-omni {release} (an "
                             "omitted key is missing, not defaulted); vllm-omni 0.28 and later refuse the schema")


def test_opd103_suggests_what_difflib_suggests_over_every_known_stage_key() -> None:
    # close_match skips candidates by length before difflib; the answer must be difflib's own
    # (independent oracle: difflib.get_close_matches over the whole known list, cutoff 0.88)
    from difflib import get_close_matches

    from omni_pd.check.rules.schema import _known_stage_keys

    known = _known_stage_keys()
    typos = ["max_num_seq", "max_num_seqss", "enforce_eagr", "gpu_memory_utilisation", "tensor_paralel_size",
             "devics", "max_model_lenn", "kv_cache_dtyp", "trust_remote_cod", "enable_prefix_cachin",
             "quantizaton", "block_siz", "data_parallel_sizes", "num_replica", "engine_arg"]
    for k in typos:
        want = get_close_matches(k, known, n=1, cutoff=0.88)
        got = hits(f"pipeline: qwen3_omni_moe\nstages:\n  - {{stage_id: 0, {k}: 1}}\n", "OPD103")
        assert [g[3] for g in got] == [f"did you mean `{want[0]}`?" for _ in want[:1]], k
    assert sum(1 for k in typos if get_close_matches(k, known, n=1, cutoff=0.88)) >= 12  # the list tests matches


def test_opd103_a_top_level_key_below_the_075_ratio_is_only_a_warning() -> None:
    # `plat` and `edge_list` are 0.6-0.75 from `platforms`/`edges`: dropped keys, not typos of a setting
    got = hits("plat: 1\nedge_list: []\nstages:\n  - stage_id: 0\n", "OPD103")
    assert [(g[0], g[1]) for g in got] == [(W, "unknown top-level key `plat` (vllm-omni drops it)"),
                                           (W, "unknown top-level key `edge_list` (vllm-omni drops it)")]


def test_opd103_an_empty_platform_overlay_is_no_stage_entry() -> None:
    text = "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, max_num_seq: 3}\nplatforms:\n  npu:\n"
    assert [g[2] for g in hits(text, "OPD103")] == [(3, 19)]


def test_opd107_a_thinker_only_pipeline_is_launched_as_plain_vllm_serve() -> None:
    # runtime vllm-omni (its pipeline), launcher vllm (omni-pd launches one `vllm serve` per engine)
    text = "pipeline: qwen3_omni_moe_thinker_only\nstages:\n  - {stage_id: 0, devices: \"0\"}\n"
    assert hits(text, "OPD107", ValidateOptions(cli={"stage_overrides": "{}"}, vllm_version="0.30")) == [(
        E, "--stage-overrides is not a `vllm serve` flag in vLLM 0.30 (a `vllm serve --omni` flag; this pipeline runs "
        "plain `vllm serve` engines)", (_CLI, ("stage_overrides",)), "remove it", [])]


def test_opd103_a_vllm_serve_omni_flag_is_no_flag_of_plain_vllm_engines() -> None:
    # `--no-async-chunk` exists only under `vllm serve --omni`: on plain engines the key is a typo
    got = hits("pipeline: llm\nstages:\n  - {stage_id: 0, devices: \"0\", no_async_chunk: true}\n", "OPD103",
               ValidateOptions(vllm_version="0.30"))
    assert [(g[1], g[3]) for g in got] == [(
        "unknown stage key `no_async_chunk`: it becomes `--no-async-chunk` on the engine's `vllm serve` command line, "
        "which vLLM rejects", "did you mean `async_chunk`?")]


def test_opd104_related_spans_keep_their_file() -> None:
    res = validate_text(pair(", kv_connector_extra_config: {http_port: 8100}",
                             ", kv_connector_extra_config: {http_port: \"8200\"}"), "t.yaml")
    assert [[r.file for r in d.related] for d in res.diagnostics if d.code == "OPD104"] == [["t.yaml"]]


def test_opd105_a_name_below_the_09_ratio_is_not_a_near_miss() -> None:
    # CUDA_DEVICES is 0.75 from CUDA_VISIBLE_DEVICES: another variable, not a typo
    assert hits("stages:\n  - stage_id: 0\n", "OPD105", ValidateOptions(env={"CUDA_DEVICES": "0"})) == []


def test_opd111_suggests_only_owned_keys_above_08_and_keeps_runtime_and_stand_ins_out() -> None:
    text = "pipeline: qwen3_omni_moe\nstages:\n  - {{stage_id: 0, {k}: 1}}\n"
    assert [g[3] for g in hits(text.format(k="active_stream_w"), "OPD111")] == [
        "did you mean `active_stream_window`? " + _NO_PLACE]
    assert [g[3] for g in hits(text.format(k="gpu_mem_util"), "OPD111")] == [_NO_PLACE]  # 0.6-0.8: no suggestion
    # `runtime:` is the stage's runtime block, not an engine argument
    assert hits("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, runtime: {devices: \"0\"}}\n", "OPD111") == []
    # two stages and no pipeline: validate's `<linear chain>` stand-in, whose stage kinds are unknown
    two = "stages:\n  - {stage_id: 0, devices: \"0\", seq_budget: 8}\n  - {stage_id: 1, devices: \"1\"}\n"
    assert hits(two, "OPD111") == []


def test_opd111_runs_once_under_all_platforms_with_an_overlay() -> None:
    text = "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, seq_budget: 8}\nplatforms:\n  npu: {}\n"
    assert [g[2] for g in hits(text, "OPD111", ValidateOptions(all_platforms=True))] == [(3, 19)]


def test_opd112_a_stage_without_parallel_config_does_not_end_the_scan() -> None:
    text = ("stages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1,2\", tensor_parallel_size: 1, "
            "parallel_config: {tensor_parallel_size: 2}}\n")
    assert [g[1] for g in hits(text, "OPD112")] == [
        "stage 1 sets tensor_parallel_size 1 and parallel_config.tensor_parallel_size 2; vllm-omni uses parallel_config"]


def test_opd112_a_data_parallel_clash_after_a_stage_without_one() -> None:
    text = ("stages:\n  - {stage_id: 0, devices: \"0\", tensor_parallel_size: 1, parallel_config: {tensor_parallel_size: 1}}\n"
            "  - {stage_id: 1, devices: \"1,2\", data_parallel_size: 1, parallel_config: {data_parallel_size: 2}}\n")
    assert [g[1] for g in hits(text, "OPD112")] == [
        "stage 1 sets data_parallel_size 1 and parallel_config.data_parallel_size 2; vllm-omni uses parallel_config"]


def test_opd107_a_legacy_file_is_not_checked() -> None:
    legacy = "stage_args:\n  - stage_id: 0\n    engine_input_source: []\n"
    assert hits(legacy, "OPD107", ValidateOptions(cli={"zzzqqq": 1}, vllm_version="0.30")) == []
    assert len(hits(_TWO, "OPD107", ValidateOptions(cli={"zzzqqq": 1}, vllm_version="0.30"))) == 1


def test_opd107_a_misspelt_omni_flag_under_omni_is_matched_among_omni_flags() -> None:
    got = hits(_TWO, "OPD107", ValidateOptions(cli={"stage_overide": "{}"}, vllm_version="0.30"))
    assert [(g[1], g[3]) for g in got] == [("--stage-overide is not a `vllm serve --omni` flag in vLLM 0.30",
                                            "did you mean --stage-overrides?")]


def test_opd107_plain_stage_keys_near_a_flag_an_omni_flag_and_a_stage_without_an_entry() -> None:
    # llm_pd's stage 0 has no entry here (scan goes on); stage_overrides is a --omni flag only
    text = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n  - {stage_id: 1, devices: \"1\", allowed_headerx: [a], "
            "stage_overrides: x, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}\n")
    said = "stage 1: `{k}` becomes `--{f}` on this engine's `vllm serve` command line, which vLLM 0.30 does not accept"
    assert hits(text, "OPD107", ValidateOptions(vllm_version="0.30")) == [
        (E, said.format(k="allowed_headerx", f="allowed-headerx"), (4, 33), "did you mean `allowed_headers`?", []),
        (E, said.format(k="stage_overrides", f="stage-overrides"), (4, 55), "did you mean `hf_overrides`?", [])]


def test_opd103_a_typo_in_a_stage_the_pipeline_lacks_or_with_no_topology_at_all() -> None:
    said = "unknown stage key `max_num_seq`: vllm-omni 0.30 refuses to start (\"no structured config owner\")"
    # stage 7 is not a qwen3_omni_moe stage (OPD202); a stage without stage_id leaves no topology (OPD101)
    assert [(g[1], g[2]) for g in hits("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 7, max_num_seq: 3}\n",
                                       "OPD103")] == [(said, (3, 19))]
    assert [(g[1], g[2]) for g in hits("pipeline: qwen3_omni_moe\nstages:\n  - {devices: \"0\", max_num_seq: 3}\n",
                                       "OPD103")] == [(said, (3, 20))]
