"""`omni-pd migrate --from A --to B` (a `stages:` file between releases) and `omni-pd diff
LEGACY MIGRATED` (a migration shown stage by stage): omni_pd/compile/migrate_release.py,
omni_pd/compile/diff.py migration_diff.

The strongest check is against expand itself: expand writes each release's form from the
same preset, so migrating expand's A output to B must give expand's B output (the one
exception, kv_ip going back below vLLM 0.32, is asserted: migrate does not invent a
setting the file does not carry).
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from omni_pd.compile.expand import expand_document
from omni_pd.compile.migrate import MigrateError
from omni_pd.compile.migrate_release import migrate_release, release_text
from omni_pd.compile.targets import target
from omni_pd.io import load_file, parse_text

ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "presets" / "qwen3_omni_moe.yaml"
LEGACY = ROOT / "tests" / "fixtures" / "legacy_seed_pd_recipe.yaml"
RELEASES = ("0.24", "0.28", "0.30", "0.32", "0.33")


def omni_pd(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omni_pd.cli", *args], capture_output=True, text=True,
                          input=stdin, cwd=ROOT)


def _expanded(version: str, *, connector: str | None = None) -> str:
    from omni_pd.compile.expand import ExpandOptions

    opts = ExpandOptions() if connector is None else ExpandOptions(connector=connector, kv_buffer_device="cpu")
    return expand_document(load_file(PRESET), opts, vllm_version=version,
                           pipeline="qwen3_omni_moe_thinker_only").text


@pytest.fixture(scope="module")
def expanded() -> dict[tuple[str, str], str]:
    return {(c, v): _expanded(v, connector=None if c == "mooncake" else "NixlConnector")
            for c in ("mooncake", "nixl") for v in RELEASES}


@pytest.mark.parametrize("connector", ["mooncake", "nixl"])
@pytest.mark.parametrize("src,dst", list(itertools.permutations(RELEASES, 2)))
def test_migrating_expands_output_gives_expands_output_for_the_target(expanded, connector, src, dst):
    doc = parse_text(expanded[(connector, src)], f"pd-{src}.yaml")
    text, m = release_text(doc, target(src), target(dst))
    want = expanded[(connector, dst)]
    if target(src).version >= (0, 32) > target(dst).version:
        # vLLM 0.32 removed kv_ip; expand writes it from --kv-host below 0.32, migrate invents nothing
        want = "".join(line for line in want.splitlines(True) if line.strip() != 'kv_ip: "127.0.0.1"')
    assert text == want
    assert m.changed


def test_the_same_release_changes_nothing(expanded):
    doc = parse_text(expanded[("mooncake", "0.30")], "pd.yaml")
    text, m = release_text(doc, target("0.30"), target("0.30"))
    assert text == doc.text and m.notes == ()


def test_each_change_is_one_located_note(expanded):
    doc = parse_text(expanded[("mooncake", "0.30")], "pd.yaml")
    _, m = release_text(doc, target("0.30"), target("0.32"))
    assert [(n.code, n.location.line, n.location.column, n.message) for n in m.notes] == [
        ("OPD970", 2, 1, "expand's header now names vLLM 0.32 (it said 0.30)"),
        ("OPD970", 29, 7, "`kv_transfer_config.kv_ip` dropped: vLLM 0.32 has no such field (removed in 0.32; "
                          "vllm/config/kv_transfer.py)"),
        ("OPD970", 47, 7, "`kv_transfer_config.kv_ip` dropped: vLLM 0.32 has no such field (removed in 0.32; "
                          "vllm/config/kv_transfer.py)"),
    ]


def test_the_mooncake_bootstrap_port_moves_to_what_the_target_reads():
    """vllm-omni 0.28 reads the stage env, 0.30 kv_connector_extra_config.bootstrap_port
    (presets/targets/mooncake_bootstrap.yaml): a 0.28 file that sets only the env gets the
    extra key on 0.30, and back on 0.28 the extra key goes (nothing reads it there)."""
    text = _stages("""\
      env:
        VLLM_MOONCAKE_BOOTSTRAP_PORT: "26001"
      kv_transfer_config:
        kv_connector: MooncakeConnector
        kv_role: kv_producer
""")
    up, m = release_text(parse_text(text, "a.yaml"), target("0.28"), target("0.30"))
    assert "      kv_connector_extra_config:\n        bootstrap_port: 26001\n" in up
    assert [n.message for n in m.notes] == [
        "`kv_connector_extra_config.bootstrap_port: 26001` written: what vllm-omni 0.30 reads for the "
        "prefill's bootstrap port (0.28: env VLLM_MOONCAKE_BOOTSTRAP_PORT)"]
    down, m = release_text(parse_text(up, "b.yaml"), target("0.30"), target("0.28"))
    assert down == text
    assert [n.message for n in m.notes] == [
        "`kv_connector_extra_config.bootstrap_port` dropped: nothing reads it on vllm-omni 0.28"]


def test_a_port_only_in_the_extra_key_becomes_the_env_going_down():
    text = _stages("""\
      kv_transfer_config:
        kv_connector: MooncakeConnector
        kv_role: kv_producer
        kv_connector_extra_config:
          bootstrap_port: 26001
""")
    down, m = release_text(parse_text(text, "a.yaml"), target("0.30"), target("0.28"))
    assert '    devices: "0"\n    env:\n      VLLM_MOONCAKE_BOOTSTRAP_PORT: "26001"\n' in down
    assert "bootstrap_port: 26001" not in down
    assert len(m.notes) == 2


def test_a_renamed_connector_takes_the_targets_name_both_ways():
    text = _stages("""\
      kv_transfer_config:
        kv_connector: SharedStorageConnector
        kv_role: kv_both
""", "llm_pd")
    up, m = release_text(parse_text(text, "a.yaml"), target("0.11"), target("0.30"), "vllm")
    assert "kv_connector: ExampleConnector\n" in up
    assert m.notes[0].message == ("`kv_connector: SharedStorageConnector` -> `ExampleConnector`: vLLM 0.30 "
                                  "registers it under that name (vLLM 0.11: `SharedStorageConnector`)")
    down, _ = release_text(parse_text(up, "b.yaml"), target("0.30"), target("0.11"), "vllm")
    assert "kv_connector: SharedStorageConnector\n" in down


def test_a_connector_the_target_does_not_register_is_an_error_naming_it():
    doc = parse_text(_stages("""\
      kv_transfer_config:
        kv_connector: P2pNcclConnector
        kv_role: kv_producer
""", "llm_pd"), "a.yaml")
    with pytest.raises(MigrateError) as e:
        migrate_release(doc, target("0.22"), target("0.30"), "vllm")
    d = e.value.diagnostics
    assert [(x.code, x.location.line, x.message) for x in d] == [
        ("OPD971", 6, "vLLM 0.30 has no KV connector `P2pNcclConnector` (vLLM 0.11 to 0.23)")]
    assert e.value.exit_code == 2


def test_a_field_the_target_does_not_have_yet_is_an_error():
    doc = parse_text(_stages("""\
      kv_transfer_config:
        kv_connector: NixlConnector
        kv_role: kv_producer
        kv_load_failure_policy: fail
""", "llm_pd"), "a.yaml")
    with pytest.raises(MigrateError) as e:
        migrate_release(doc, target("0.30"), target("0.11"), "vllm")
    assert [x.message for x in e.value.diagnostics] == [
        "`kv_transfer_config.kv_load_failure_policy`: vLLM 0.11 has no such field (from vLLM 0.13)"]


def test_a_stages_file_cannot_go_below_vllm_omni_0_20(expanded):
    doc = parse_text(expanded[("nixl", "0.30")], "pd.yaml")
    with pytest.raises(MigrateError) as e:
        migrate_release(doc, target("0.30"), target("0.18"))
    assert e.value.diagnostics[0].message == (
        "vllm-omni 0.18 reads only legacy `stage_args` files (`--stage-configs-path`); the `stages:` schema "
        "is read from vllm-omni 0.20")


def _stages(stage_body: str, pipeline: str = "qwen3_omni_moe_thinker_only_pd") -> str:
    """A file of ``pipeline`` whose stage 0 carries ``stage_body`` (any indentation)."""
    import textwrap

    return (f"pipeline: {pipeline}\nstages:\n  - stage_id: 0\n    devices: \"0\"\n"
            + textwrap.indent(textwrap.dedent(stage_body), "    "))


# --- the CLI --------------------------------------------------------------------------

def test_cli_from_to_writes_the_target_form_and_check_passes_on_it(tmp_path, expanded):
    src = tmp_path / "pd30.yaml"
    src.write_text(expanded[("mooncake", "0.30")])
    out = tmp_path / "pd32.yaml"
    r = omni_pd("migrate", str(src), "--from", "0.30", "--to", "0.32", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_text() == expanded[("mooncake", "0.32")]
    assert src.read_text() == expanded[("mooncake", "0.30")]  # never over the input
    assert r.stderr.count("info[OPD970]") == 3
    assert r.stderr.rstrip().endswith(f"serve with: vllm serve MODEL --omni --trust-remote-code --deploy-config {out}")
    again = omni_pd("migrate", str(out), "--from", "0.32", "--to", "0.32", "--check")
    assert (again.returncode, again.stdout, again.stderr) == (0, "", f"{out}: already in vLLM 0.32's form\n")
    check = omni_pd("migrate", str(src), "--from", "0.30", "--to", "0.32", "--check")
    assert check.returncode == 1
    assert '-      kv_ip: "127.0.0.1"\n' in check.stdout
    assert check.stderr == (f"{src}: written for vLLM 0.30; `omni-pd migrate {src} --from 0.30 --to 0.32 -o OUT` "
                            "rewrites it\n")


def test_cli_without_from_leaves_a_stages_file_alone(tmp_path, expanded):
    src = tmp_path / "pd30.yaml"
    src.write_text(expanded[("mooncake", "0.30")])
    r = omni_pd("migrate", str(src), "--to", "0.32")
    assert r.returncode == 0
    assert r.stdout == src.read_text()
    assert r.stderr.startswith(f"{src}: already in the `stages:` form; nothing to migrate\n")


def test_a_legacy_file_names_migrate_everywhere_it_is_refused():
    r = omni_pd("graph", str(LEGACY))
    assert r.returncode == 2
    assert (f"= help: rewrite it with `omni-pd migrate {LEGACY.relative_to(ROOT)} -o new.yaml`" in r.stderr
            or f"= help: rewrite it with `omni-pd migrate {LEGACY} -o new.yaml`" in r.stderr), r.stderr


# --- diff shows a migration -----------------------------------------------------------

def test_diff_shows_what_the_migration_changed_per_stage(tmp_path):
    new = tmp_path / "new.yaml"
    assert omni_pd("migrate", str(LEGACY), "-o", str(new)).returncode == 1  # written; OPD404 (the fixture's memory)
    r = omni_pd("diff", str(LEGACY), str(new))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:5] == [f"--- {LEGACY} (legacy stage_args)", f"+++ {new}", '+ pipeline: "qwen3_omni_moe_pd"',
                         "+ async_chunk: false", "- runtime.enabled: true"]
    i = lines.index("stage 0 thinker prefill (from input stage 0 thinker prefill)")
    prefill = lines[i + 1:lines.index("stage 1 thinker decode (from input stage 1 thinker decode)")]
    assert '  + env.VLLM_MOONCAKE_BOOTSTRAP_PORT: "25201"' in prefill
    assert "  + kv_transfer_config.kv_connector_extra_config.bootstrap_port: 25201" in prefill
    assert "  - kv_transfer_config.kv_connector_extra_config.mooncake_bootstrap_port: 25201" in prefill
    assert "  - is_prefill_only: true" in prefill
    assert not any(line.startswith("  ~ ") for line in prefill)  # moves between layouts are no change
    assert lines[-1] == f"= what `omni-pd migrate {LEGACY}` writes (vllm-omni 0.30), key for key"


def test_diff_of_a_hand_migration_that_lost_a_setting_exits_1_and_names_it(tmp_path):
    new = tmp_path / "new.yaml"
    assert omni_pd("migrate", str(LEGACY), "-o", str(new)).returncode == 1  # written; OPD404 (the fixture's memory)
    text = new.read_text()
    assert "bootstrap_port: 25201\n" in text
    new.write_text(text.replace("bootstrap_port: 25201\n", "bootstrap_port: 25301\n", 1))
    r = omni_pd("diff", str(LEGACY), str(new))
    assert r.returncode == 1
    assert r.stdout.splitlines()[-2:] == [
        f"not what `omni-pd migrate {LEGACY}` writes (vllm-omni 0.30):",
        "  stage 0: ~ kv_transfer_config.kv_connector_extra_config.bootstrap_port: 25201 -> 25301"]


def test_diff_of_a_legacy_file_against_another_legacy_file_is_a_usage_error():
    r = omni_pd("diff", str(LEGACY), str(LEGACY))
    assert r.returncode == 2
    assert "error[OPD008]" in r.stderr and "has no `stages:` list" in r.stderr


def test_the_serve_line_trusts_remote_code_only_when_a_stage_does():
    """vllm-omni 0.30 resolves the pipeline from the HF config with the command line's
    trust_remote_code (config_factory.py create_from_model), before stage settings apply."""
    from omni_pd.compile.migrate import serve_command

    t = target("0.30")
    trusting = parse_text("stages:\n  - stage_id: 0\n    trust_remote_code: true\n", "a.yaml").tree
    legacy = parse_text("stage_args:\n  - stage_id: 0\n    engine_args:\n      trust_remote_code: true\n", "b.yaml").tree
    plain = parse_text("stages:\n  - stage_id: 0\n    trust_remote_code: false\n", "c.yaml").tree
    assert serve_command("f.yaml", t, tree=trusting) == "vllm serve MODEL --omni --trust-remote-code --deploy-config f.yaml"
    assert serve_command("f.yaml", t, tree=legacy) == "vllm serve MODEL --omni --trust-remote-code --deploy-config f.yaml"
    assert serve_command("f.yaml", t, tree=plain) == "vllm serve MODEL --omni --deploy-config f.yaml"
    assert serve_command("f.yaml", target("0.18"), tree=plain) == "vllm serve MODEL --omni --stage-configs-path f.yaml"


def test_migrate_says_what_validate_finds_in_what_it_wrote(tmp_path):
    """vllm-omni's own legacy PD recipe puts the Talker and Code2Wav on GPU 2 with vLLM's
    default 0.9 each: migrate keeps the settings, so its rewrite is just as unservable. The
    walkthrough's new user got a serve line and a file validate rejects; now migrate says so."""
    out = tmp_path / "m.yaml"
    r = omni_pd("migrate", str(LEGACY), "-q", "-o", str(out))
    assert r.returncode == 1, r.stderr  # written, but not servable as it is: exit 1 as validate
    assert r.stderr.splitlines() == [
        f"{out}: validate finds 1 error, 1 warning (settings the input had):",
        f"  warning[OPD702] {out}:22:5: prefill stage 0 has no engine_id: vllm-omni cannot send remote_engine_id to decode",
        f"  error[OPD404] {out}:60:5: physical GPU 2: 0.9 (vLLM default) (stage 2) + 0.9 (vLLM default) (stage 3) "
        "= 1.80 > 1.0",
        f"fix them (`omni-pd validate {out}` explains each), then serve with: vllm serve MODEL --omni "
        f"--trust-remote-code --deploy-config {out}"]


def test_diff_with_a_legacy_pair_swapped_says_so(tmp_path):
    new = tmp_path / "new.yaml"
    assert omni_pd("migrate", str(LEGACY), "-q", "-o", str(new)).returncode == 1  # written; OPD404
    r = omni_pd("diff", str(new), str(LEGACY))
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.splitlines()[0] == (f"error[OPD008]: the arguments are swapped: {LEGACY} is a legacy "
                                        f"`stage_args` file and {new} is not")
    assert f"= help: give the legacy file first and its rewrite second: `omni-pd diff {LEGACY} {new}`" in r.stderr


def test_expand_of_a_legacy_pd_recipe_points_at_migrate():
    """It said 'already prefill/decode split ... run `omni-pd validate` on it instead' at a
    position in the migrated text, and validate then said to run migrate (walkthrough)."""
    r = omni_pd("expand", str(LEGACY))
    assert (r.returncode, r.stdout) == (2, "")
    lines = r.stderr.splitlines()
    assert lines[0] == ("error[OPD803]: this legacy `stage_args` file is already prefill/decode split "
                        "(qwen3_omni_moe_pd); refusing to split it twice")
    assert lines[1].endswith("legacy_seed_pd_recipe.yaml:6:1")
    assert lines[-1] == (f"  = help: rewrite it with `omni-pd migrate {LEGACY} -o new.yaml`, then validate or "
                         "launch new.yaml")
