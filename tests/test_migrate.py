"""``omni-pd migrate``: legacy ``stage_args`` files -> the ``stages:`` schema (issue 23).

The seed is vllm-omni's own documented PD recipe (tests/fixtures/legacy_seed_pd_recipe.yaml,
its three YAML blocks joined byte for byte). The oracle test runs vllm-omni 0.30.0's own
loader on the migrated file where ``OMNI_PD_ORACLE_PYTHON`` is set (tests/test_oracle.py).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from omni_pd.cli import app
from omni_pd.compile.expand import expand_document
from omni_pd.compile.migrate import MigrateError, doc_table, migrate_document, migrate_text
from omni_pd.compile.parse import to_plain
from omni_pd.compile.pipelines import load_catalogue
from omni_pd.compile.targets import target
from omni_pd.check.validate import validate_document
from omni_pd.diagnostics import Severity
from omni_pd.io import load_file, parse_text
from omni_pd.resources import preset_path

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "tests" / "fixtures" / "legacy_seed_pd_recipe.yaml"
SWAPPED = ROOT / "tests" / "fixtures" / "legacy_pd_swapped_same_gpu.yaml"
GOLDEN = ROOT / "tests" / "golden" / "migrate_seed_pd_recipe.yaml"
DIFFS = ROOT / "tests" / "golden" / "migrate_seed_vs_expand.yaml"
SHARED_SEED = ROOT.parent / "shared" / "seeds" / "001_032048c257008b88.txt"
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")
T030 = target("0.30")


def migrate(text: str, name: str = "legacy.yaml", version: str = "0.30"):
    return migrate_document(parse_text(text, name), target(version), load_catalogue())


def notes(m) -> list[tuple[int, int, str]]:
    return sorted((d.location.line, d.location.column, d.message) for d in m.notes)


def test_docs_table_is_generated_from_the_key_map() -> None:
    assert (ROOT / "docs" / "migrate.md").read_text() == doc_table() + "\n", \
        "regenerate: python -c 'from omni_pd.compile.migrate import doc_table; print(doc_table())' > docs/migrate.md"


@pytest.mark.skipif(not SHARED_SEED.is_file(), reason="../shared/seeds not present")
def test_the_fixture_is_the_seeds_three_blocks_byte_for_byte() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", SHARED_SEED.read_text(), re.S)
    body = SEED.read_text()
    assert len(blocks) == 3 and body[body.index("stage_args:"):] == "".join(blocks)


def test_seed_migrates_to_the_golden_text() -> None:
    text, m = migrate_text(load_file(SEED), T030, load_catalogue())
    assert m is not None and m.pipeline.name == "qwen3_omni_moe_pd"
    assert text == GOLDEN.read_text()
    again, m2 = migrate_text(parse_text(text, "migrated.yaml"), T030, load_catalogue())
    assert again == text and m2 is None  # idempotent


def test_seed_runtime_keys_go_where_vllm_omni_030_reads_them() -> None:
    m = migrate_document(load_file(SEED), T030, load_catalogue())
    p, d = (to_plain(m.tree)["stages"][i] for i in (0, 1))
    assert p["kv_transfer_config"] == {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer",
                                       "kv_connector_extra_config": {"bootstrap_port": 25201}}
    assert p["env"] == {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "25201"} and p["async_scheduling"] is False
    assert d["kv_transfer_config"] == {"kv_connector": "MooncakeConnector", "kv_role": "kv_consumer"}
    assert "env" not in d
    got = notes(m)
    assert (33, 11, "stage 0: `mooncake_bootstrap_port: 25201` -> kv_connector_extra_config.bootstrap_port and env "
            "VLLM_MOONCAKE_BOOTSTRAP_PORT (what vllm-omni 0.30 reads for the prefill's bootstrap port)") in got
    assert (71, 11, "stage 1: `mooncake_bootstrap_port` dropped: a kv_consumer binds no bootstrap server (only the "
            "prefill side's port is read; vllm-omni 0.30)") in got
    assert (30, 9, "stage 0: `kv_transfer_config.kv_rank` dropped: no vLLM 0.30 KV connector reads it") in got
    assert (6, 1, "async_chunk: false written: the legacy loader's default; the `stages:` schema defaults to true") in got
    assert (99, 3, "`runtime.edges` -> top-level `edges`") in got
    assert len(got) == 58


def test_vllm_032_drops_kv_fields_it_removed_and_env_decides_before_030() -> None:
    m = migrate_document(load_file(SEED), target("0.32"), load_catalogue())
    assert (30, 9, "stage 0: `kv_transfer_config.kv_rank` dropped: vLLM 0.32 has no such KVTransferConfig field") \
        in notes(m)
    m = migrate_document(load_file(SEED), target("0.28"), load_catalogue())
    p = to_plain(m.tree)["stages"][0]
    assert p["env"] == {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "25201"} and "kv_connector_extra_config" not in p["kv_transfer_config"]


def _flat(x, p=()):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _flat(v, p + (k,))
    elif isinstance(x, list) and x and all(isinstance(i, dict) for i in x):
        for i, v in enumerate(x):
            yield from _flat(v, p + (i,))
    else:
        yield ".".join(map(str, p)), x


def test_seed_equals_expand_of_the_preset_in_every_field_both_set_but_the_explained_ones() -> None:
    from ruamel.yaml import YAML

    mig = dict(_flat(to_plain(load_file(GOLDEN).tree)))
    from omni_pd.compile.passes.pd_split import ExpandOptions

    # the legacy recipe is the one-piece answer (async_chunk false): compare with expand --no-stream
    exp = dict(_flat(to_plain(parse_text(expand_document(load_file(preset_path("qwen3_omni_moe")),
                                                         ExpandOptions(stream=False)).text, "x").tree)))
    common = set(mig) & set(exp)
    assert len(common) == 38
    differ = {k: {"migrated": mig[k], "expand": exp[k]} for k in common if mig[k] != exp[k]}
    golden = YAML(typ="safe").load(DIFFS.read_text())
    assert all(g["why"] for g in golden.values())
    assert differ == {k: {"migrated": g["migrated"], "expand": g["expand"]} for k, g in golden.items()}


def test_swapped_roles_on_one_gpu_are_found_at_the_legacy_lines() -> None:
    res = validate_document(load_file(SWAPPED, comments=False))
    errors = [(d.code, d.location.line, d.location.column) for d in res.errors]
    assert errors == [("OPD102", 5, 1), ("OPD302", 17, 18), ("OPD404", 29, 31), ("OPD302", 32, 18)]
    assert all(d.location.file == str(SWAPPED) for d in res.diagnostics)
    r = CliRunner().invoke(app, ["validate", str(SWAPPED)])
    assert r.exit_code == 1 and "run `omni-pd migrate" in r.output


def test_a_key_with_no_home_is_an_error_naming_it() -> None:
    text = SEED.read_text().replace("      max_num_seqs: 1\n", "      max_num_seqs: 1\n      seq_budget: 3\n", 1)
    text = text.replace("    final_output: false\n", "    final_output: false\n    omni_magic: 1\n", 1)
    with pytest.raises(MigrateError) as e:
        migrate(text)
    assert [(d.code, d.location.line, d.message) for d in e.value.diagnostics] == [
        ("OPD971", 35, "stage 0: `omni_magic` has no home in the `stages:` schema"),
        ("OPD971", 96, "stage 3: `seq_budget` is no engine argument vllm-omni 0.30 can place")]


def test_a_value_that_contradicts_the_pipeline_is_an_error() -> None:
    text = SEED.read_text().replace("    engine_input_source: [0]\n", "    engine_input_source: [2]\n", 1)
    with pytest.raises(MigrateError) as e:
        migrate(text)
    assert [d.message for d in e.value.diagnostics] == [
        "stage 1: `engine_input_source: [2]` contradicts pipeline `qwen3_omni_moe_pd` ([0])"]


def test_cli_writes_atomically_never_over_the_input_and_prints_the_serve_line(tmp_path) -> None:
    src = tmp_path / "pd.yaml"
    src.write_text(SEED.read_text())
    out = tmp_path / "out.yaml"
    r = CliRunner().invoke(app, ["migrate", str(src), "-o", str(out)])
    assert r.exit_code == 1, r.output  # written; what it wrote does not validate (OPD404, the fixture's memory)
    assert out.read_text() == GOLDEN.read_text()
    assert f"serve with: vllm serve MODEL --omni --trust-remote-code --deploy-config {out}" in r.output
    assert "info[OPD970]" in r.output
    from omni_pd.cli import main

    assert main(["migrate", str(src), "-o", str(src)]) == 2
    assert src.read_text() == SEED.read_text()


def test_check_mode_exits_1_with_the_diff_and_0_on_the_current_form() -> None:
    r = CliRunner().invoke(app, ["migrate", str(SEED), "--check"])
    assert r.exit_code == 1 and "+pipeline: qwen3_omni_moe_pd" in r.output and "-stage_args:" in r.output
    r = CliRunner().invoke(app, ["migrate", str(GOLDEN), "--check"])
    assert r.exit_code == 0


# --- properties: generated legacy three-stage files ---------------------------------

@st.composite
def legacy_three_stage(draw) -> str:
    """A legacy Qwen3-Omni three-stage file as vllm-omni 0.18-0.24 shipped them."""
    mem = draw(st.lists(st.sampled_from([0.1, 0.3, 0.45]), min_size=3, max_size=3))
    dev = draw(st.sampled_from([("0", "1", "1"), ("0", "1", "2"), ("0,1", "2", "2")]))
    tp = len(dev[0].split(","))
    seqs = draw(st.integers(1, 128))
    sched = draw(st.booleans())
    extra = draw(st.sampled_from(["", "      enforce_eager: true\n", "      max_model_len: 8192\n"]))
    ac = draw(st.sampled_from(["", "async_chunk: false\n"]))
    stages = []
    for i, (ms, wt) in enumerate((("thinker", "ar"), ("talker", "ar"), ("code2wav", "generation"))):
        s = f"  - stage_id: {i}\n    stage_type: llm\n    runtime:\n      devices: \"{dev[i]}\"\n    engine_args:\n" \
            f"      model_stage: {ms}\n      model_arch: Qwen3OmniMoeForConditionalGeneration\n      worker_type: {wt}\n" \
            f"      gpu_memory_utilization: {mem[i]}\n      max_num_seqs: {seqs}\n"
        if i == 0:
            s += f"      tensor_parallel_size: {tp}\n" + extra
            if sched:
                s += "      scheduler_cls: vllm_omni.core.sched.omni_ar_scheduler.OmniARScheduler\n"
            s += "    final_output: true\n    final_output_type: text\n"
        else:
            s += f"    engine_input_source: [{i - 1}]\n"
        if i == 2:
            s += "    final_output: true\n    final_output_type: audio\n"
        stages.append(s)
    return "# generated legacy file\n" + ac + "stage_args:\n" + "".join(stages)


@settings(max_examples=25)
@given(legacy_three_stage())
def test_migrate_is_idempotent_and_commutes_with_expand(text: str) -> None:
    doc = parse_text(text, "legacy.yaml")
    once, m = migrate_text(doc, T030, load_catalogue())
    assert m is not None and m.pipeline.name == "qwen3_omni_moe"
    twice, m2 = migrate_text(parse_text(once, "m.yaml"), T030, load_catalogue())
    assert (twice, m2) == (once, None)
    # expand of the legacy file (which migrates first) == expand of the migrated file, and
    # migrating that output changes nothing: migrate . expand == expand . migrate
    via_legacy = expand_document(doc).text
    via_migrated = expand_document(parse_text(once, "legacy.yaml (migrated)")).text
    assert via_legacy == via_migrated
    assert migrate_text(parse_text(via_legacy, "x.yaml"), T030, load_catalogue()) == (via_legacy, None)
    assert not validate_document(parse_text(once, "m.yaml", comments=False)).errors


# --- vllm-omni 0.30.0's own loader ---------------------------------------------------

@pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")
def test_vllm_omni_030_loads_the_migrated_seed_with_pd_detected(tmp_path) -> None:
    f = tmp_path / "seed_migrated.yaml"
    f.write_text(GOLDEN.read_text())
    proc = subprocess.run([ORACLE, "-m", "omni_pd.upstream.vllm_oracle", str(f)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")][1]
    assert res["verdict"] == "valid", res
    assert res["pipeline"] == "qwen3_omni_moe_pd" and res["detect_on_typed"] == [0, 1]
    assert [s[:6] for s in res["stages"]] == [[0, True, False, [], 1, "kv_producer"], [1, False, True, [0], 1, "kv_consumer"],
                                              [2, False, False, [1], 1, None], [3, False, False, [2], 1, None]]


# --- fixes found by the vllm-omni 0.24.0 wheel files (tests/test_migrate_legacy_wheels.py) ---

UNCAT = """stage_args:
  - stage_id: 0
    stage_type: llm
    runtime:
      devices: "0"
      max_batch_size: 1
    engine_args:
      model_stage: audio_generation
      max_num_seqs: 32
      custom_process_next_stage_input_func: pkg.mod.fn
    tts_args:
      max_instructions_length: 500
    final_output: false
  - stage_id: 1
    runtime:
      max_batch_size: 4
    engine_args:
      model_stage: audio_tokenizer
    engine_input_source: [0]
runtime:
  enabled: true
  defaults:
    window_size: -1
"""


def test_a_pipeline_omni_pd_does_not_catalogue_migrates_unchecked() -> None:
    from omni_pd.compile.migrate import UNCATALOGUED

    m = migrate(UNCAT)
    assert m.pipeline.name == UNCATALOGUED and m.pipeline.linear_chain
    tree = to_plain(m.tree)
    assert "pipeline" not in tree  # vllm-omni 0.30 takes the model's registered pipeline
    assert tree["stages"] == [{"stage_id": 0, "devices": "0", "max_num_seqs": 32},
                              {"stage_id": 1, "max_num_seqs": 4}]
    got = [x[2] for x in notes(m)]
    assert "stage 0: `runtime.max_batch_size` dropped: the stage sets `max_num_seqs` (32), which wins" in got
    assert "stage 1: `runtime.max_batch_size` -> `max_num_seqs`" in got
    assert "`runtime.defaults` (window_size) dropped: there are no edges to apply it to" in got
    assert ("stage 0: `tts_args` dropped, not checked: vllm-omni takes it from the pipeline registered for the "
            "model's model_type, which omni-pd does not catalogue") in got
    assert any(n.startswith("stage 0: `engine_args.custom_process_next_stage_input_func` dropped") for n in got)


# --- fixes found by the vllm-omni 0.14.0-0.22.0 wheel files (tests/test_migrate_legacy_wheels.py) ---

OLDER = """modes:
  - mode: text-to-image
    stages: [1]
stage_args:
  - stage_id: 0
    runtime:
      devices: 0  # one GPU
      requires_multimodal_data: true
    engine_args:
      model_stage: AR
  - stage_id: 1
    stage_type: diffusion
    runtime:
      devices: "0,1"
    engine_args:
      model_stage: dit
"""


def test_modes_requires_multimodal_data_and_a_numeric_device_migrate() -> None:
    """0.18.0's hunyuan_image_3_moe.yaml (`modes`), 0.16.0's glm_image.yaml
    (`runtime.requires_multimodal_data`) and 0.18.0's cosyvoice3.yaml (`devices: 0`, which
    vllm-omni 0.30 refuses: OmniStageRuntimeConfig.devices is a str)."""
    text, m = migrate_text(parse_text(OLDER, "legacy.yaml"), target("0.30"), load_catalogue())
    assert text == """async_chunk: false
stages:
  - stage_id: 0
    devices: "0"  # one GPU
  - stage_id: 1
    devices: "0,1"
"""
    assert notes(m) == [
        (1, 1, "top-level `modes` dropped: vllm-omni 0.30 has no mode filter and runs every stage the file lists "
               "(the legacy loader kept only the stages listed for the caller's `mode`, text-to-image when none was "
               "passed); to serve one mode, keep only its stages (and the model_type registered for that mode, e.g. "
               "hunyuan_image3_dit)"),
        (4, 1, "async_chunk: false written: the legacy loader's default; the `stages:` schema defaults to true"),
        (7, 7, 'stage 0: `runtime.devices: 0` -> `devices: "0"` (vllm-omni 0.30 refuses a number here: '
               'OmniStageRuntimeConfig.devices is a str)'),
        (8, 7, "stage 0: `runtime.requires_multimodal_data` dropped, not checked: vllm-omni takes it from the pipeline "
               "registered for the model's model_type, which omni-pd does not catalogue"),
        (10, 7, "stage 0: `engine_args.model_stage` dropped, not checked: vllm-omni takes it from the pipeline "
                "registered for the model's model_type, which omni-pd does not catalogue"),
        (12, 5, "stage 1: `stage_type` dropped, not checked: vllm-omni takes it from the pipeline registered for the "
                "model's model_type, which omni-pd does not catalogue"),
        (14, 7, "stage 1: `runtime.devices` -> `devices`"),
        (16, 7, "stage 1: `engine_args.model_stage` dropped, not checked: vllm-omni takes it from the pipeline "
                "registered for the model's model_type, which omni-pd does not catalogue"),
    ]


def test_a_pd_file_still_needs_a_catalogued_pipeline() -> None:
    text = UNCAT.replace("    final_output: false\n", "    final_output: false\n    is_prefill_only: true\n")
    with pytest.raises(MigrateError) as e:
        migrate(text)
    assert e.value.diagnostics[0].message.startswith("no catalogued pipeline has these 2 stages")
