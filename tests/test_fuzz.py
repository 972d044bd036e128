"""Robustness (issue 6): ``expand`` and ``validate`` never crash on bad input.

* property tests: mutated real deploy configs and generated deploy-shaped documents
  (``tests/fuzz_strategies.py``) through the CLI entry in process; every run exits 0,
  1 or 2 with located diagnostics, never a traceback or an internal error (OPD000);
* hostile YAML: alias bombs, 100k-deep nesting, a 50 MB file, endless and piped input,
  non-UTF-8 and control characters, duplicate keys (both locations), complex keys,
  malformed scalars; each with its exact diagnostic, in process and as a subprocess;
* files: ``expand -o`` writes atomically, never over its input, and a failed run leaves
  neither the output nor a temp file;
* one regression test per crash the fuzzing found, with the exact diagnostic.

Example counts (see :func:`budget`): 60/30/10 under the ``dev`` profile, 200/100/25 under
``HYPOTHESIS_PROFILE=ci`` (the whole file then takes about 35 s on 2 cores), ten times
that under ``long``; ``OMNI_PD_FUZZ_EXAMPLES=N`` sets each to N. ``bench/fuzz_long.py``
is the 10,000-example run. Time and memory of the hostile inputs are measured there
(``--hostile-only``), never asserted here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings

from conftest import HYPOTHESIS_PROFILE
from fuzz_strategies import (
    HOSTILE, REPO, SEEDS, SHARED_CASES, FuzzInput, Hostile, Outcome, check_outcome, command_pairs, fuzz_inputs,
    generated_documents, hostile, mutated_documents, read_diagnostics, run_cli, run_input, seed_paths)
from omni_pd import io as omni_io

PRESET_TEXT = (REPO / "presets" / "qwen3_omni_moe.yaml").read_text(encoding="utf-8")


def budget(dev: int, ci: int) -> int:
    """Examples for one fuzz property: ``$OMNI_PD_FUZZ_EXAMPLES`` when set; else ``dev``
    under the ``dev`` profile, ``ci`` under ``ci`` (each example runs the CLI twice, about
    0.1 s: these keep the file under a minute on 2 cores) and ``10 * ci`` under ``long``."""
    env = os.environ.get("OMNI_PD_FUZZ_EXAMPLES")
    if env:
        return int(env)
    return {"dev": dev, "ci": ci}.get(HYPOTHESIS_PROFILE, 10 * ci)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def cli(args: list[str]) -> Outcome:
    return run_cli(args)


def first_error(o: Outcome):
    errors = [d for d in read_diagnostics(o.err + o.out) if d.severity == "error"]
    assert errors, f"no error diagnostic in {o.err + o.out!r}"
    return errors[0]


# --- the harness itself ---------------------------------------------------------------

def test_seeds_include_preset_goldens_and_shared_cases() -> None:
    names = [p.name for p in seed_paths()]
    goldens = sorted(p.name for p in (Path(__file__).parent / "golden").glob("*.yaml"))
    # the PD outputs, the migrate and the two-host placement goldens are all mutated
    assert {"qwen3_omni_moe_pd.yaml", "qwen3_omni_moe_pd_nixl.yaml", "migrate_seed_pd_recipe.yaml",
            "placement_llm_nixl_two_hosts.yaml"} <= set(goldens)
    assert names[:1 + len(goldens)] == ["qwen3_omni_moe.yaml", *goldens]
    if SHARED_CASES.is_dir():
        assert len(names) == 1 + len(goldens) + len(list(SHARED_CASES.glob("*.yaml")))
    assert len(SEEDS) == len(names)


def test_unmodified_preset_passes_the_contract_with_exit_0(fuzz_dir: Path) -> None:
    problems, outcomes = run_input(FuzzInput(PRESET_TEXT.encode(), "qwen3_omni_moe.yaml"), fuzz_dir)
    assert problems == []
    assert [o.rc for o in outcomes] == [0, 0, 0]
    assert outcomes[0].out.startswith("# yaml-language-server: $schema=")


def test_contract_check_flags_crashes_unlocated_errors_and_control_characters() -> None:
    path = "/x/in.yaml"
    crash = Outcome(["expand", path], 3, "", "error[OPD000]: internal error: TypeError: boom\n")
    assert check_outcome(crash, path) == ["expand: exit status 3", "expand: internal error OPD000: internal error: TypeError: boom"]
    unlocated = Outcome(["validate", path], 1, "error[OPD101]: bad\n", "")
    assert check_outcome(unlocated, path) == ["validate: OPD101 not located (file=None, line=None, col=None): bad"]
    silent = Outcome(["validate", path], 2, "", "")
    assert check_outcome(silent, path) == ["validate: exit 2 without an error diagnostic"]
    raw = Outcome(["expand", path], 2, "", f"error[OPD002]: a\x1bb\n --> {path}:1:1\n")
    assert check_outcome(raw, path) == ["expand: unescaped character '\\x1b' in the diagnostics"]
    ok = Outcome(["expand", path], 2, "", f"error[OPD002]: invalid YAML: x\n --> {path}:3:7\n")
    assert check_outcome(ok, path) == []


# --- property tests -------------------------------------------------------------------

@settings(max_examples=budget(60, 200))
@given(inp=mutated_documents(), commands=command_pairs())
def test_mutated_deploy_configs_never_crash(inp: FuzzInput, commands: list[list[str]], fuzz_dir: Path) -> None:
    problems, _ = run_input(inp, fuzz_dir, commands)
    assert problems == []


@settings(max_examples=budget(30, 100))
@given(inp=generated_documents(), commands=command_pairs())
def test_generated_deploy_documents_never_crash(inp: FuzzInput, commands: list[list[str]], fuzz_dir: Path) -> None:
    problems, _ = run_input(inp, fuzz_dir, commands)
    assert problems == []


@settings(max_examples=budget(10, 25))
@given(inp=fuzz_inputs())
def test_expand_to_a_file_never_leaves_partial_output(inp: FuzzInput, fuzz_dir: Path) -> None:
    """Whatever the input, ``-o`` gives either the complete output or nothing."""
    import shutil
    import tempfile

    sub = Path(tempfile.mkdtemp(dir=fuzz_dir))
    try:
        src, out = sub / inp.name, sub / "out.yaml"
        src.write_bytes(inp.data)
        o = cli(["expand", "-q", str(src), "-o", str(out)])
        assert o.rc in (0, 2), o.err
        if o.rc == 0:
            assert out.read_text(encoding="utf-8").startswith("# yaml-language-server: $schema=")
            assert sorted(p.name for p in sub.iterdir()) == sorted({inp.name, "out.yaml"})
        else:
            assert sorted(p.name for p in sub.iterdir()) == [inp.name]
        assert src.read_bytes() == inp.data
    finally:
        shutil.rmtree(sub, ignore_errors=True)


# --- hostile YAML ----------------------------------------------------------------------

def _assert_hostile(h: Hostile, o: Outcome, path: Path) -> None:
    assert o.rc == 2, o.err
    d = first_error(o)
    assert d.code == h.code
    assert h.message in d.message
    if h.where is None:
        assert (d.file, d.line) == (str(path), None)
    else:
        assert f"{d.line}:{d.column}" == h.where
        assert d.file == str(path)
    if h.related is not None:
        assert f"= note: first defined here: {path}:{h.related}" in o.err
    assert "Traceback" not in o.err and "OPD000" not in o.err


FAST_HOSTILE = [h for h in HOSTILE if not h.slow]


@pytest.mark.parametrize("h", FAST_HOSTILE, ids=[h.name for h in FAST_HOSTILE])
@pytest.mark.parametrize("command", ["expand", "validate"])
def test_hostile_input_gives_its_exact_diagnostic(h: Hostile, command: str, tmp_path: Path) -> None:
    path = tmp_path / "hostile.yaml"
    path.write_bytes(h.build())
    _assert_hostile(h, cli([command, str(path)]), path)


def test_node_limit_is_checked_while_composing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(omni_io, "MAX_NODES", 50)
    path = tmp_path / "many.yaml"
    path.write_text("stages: []\nx: [" + "1, " * 60 + "1]\n")
    o = cli(["validate", str(path)])
    assert o.rc == 2
    d = first_error(o)
    assert (d.code, d.message, d.line, d.column) == ("OPD002", "document has more than 50 YAML nodes", 2, 140)


def diag_codes(stderr: str) -> list[str]:
    """``severity[CODE]`` of every diagnostic header line in ``stderr``."""
    return re.findall(r"^(?:error|warning|info)\[OPD\d+\]", stderr, flags=re.M)


def test_node_limit_applies_to_the_input_not_to_expands_own_output(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # was: an input under the limit failed with OPD002 located in "<file> (expanded)",
    # because the split output (345 nodes for the preset's 231) was re-read with the limit
    monkeypatch.setattr(omni_io, "MAX_NODES", 300)
    src = tmp_path / "qwen3_omni_moe.yaml"
    src.write_text(PRESET_TEXT)
    o = cli(["expand", "-q", str(src)])
    assert (o.rc, diag_codes(o.err)) == (0, [])  # nothing (OPD704: the compat layer covers the Talker)
    monkeypatch.setattr(omni_io, "MAX_NODES", 200)
    d = first_error(cli(["expand", "-q", str(src)]))
    assert (d.code, d.message, d.file) == ("OPD002", "document has more than 200 YAML nodes", str(src))


def test_input_over_the_size_limit_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    with open(path, "wb") as f:  # sparse: 50 MB on disk costs nothing
        f.truncate(50 * 1024 * 1024)
    o = cli(["expand", str(path)])
    assert o.rc == 2
    assert o.err.startswith(f"error[OPD001]: file is larger than {omni_io.MAX_INPUT_BYTES} bytes; larger inputs are refused\n")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")
def test_endless_input_is_cut_at_the_size_limit() -> None:
    o = cli(["validate", "/dev/zero"])
    assert o.rc == 2
    assert first_error(o).code == "OPD001"
    assert "file is larger than 1048576 bytes" in o.err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes")
def test_piped_input_is_read_only_up_to_the_limit(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    written = []

    def feed() -> None:
        try:
            with open(fifo, "wb") as f:
                for _ in range(64):  # 4 MiB in 64 KiB writes; stops when the reader closes
                    f.write(b"#" * 65535 + b"\n")
                    written.append(1)
        except BrokenPipeError:
            pass

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    o = cli(["validate", str(fifo)])
    t.join(timeout=30)
    assert o.rc == 2 and first_error(o).code == "OPD001"
    assert len(written) < 64  # the reader stopped early


def test_duplicate_key_cites_both_locations_in_text_and_json(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n    devices: \"0\"\n    tensor_parallel_size: 1\n"
                    "    devices: \"1\"\n")
    o = cli(["validate", str(path)])
    assert o.rc == 2
    assert o.err.splitlines()[:2] == ['error[OPD003]: duplicate key "devices" (YAML requires unique mapping keys)',
                                      f" --> {path}:6:5"]
    assert f"  = note: first defined here: {path}:4:5" in o.err
    from omni_pd.diagnostics import OmniPdError

    with pytest.raises(OmniPdError) as e:
        omni_io.load_file(path)
    d = e.value.diagnostic.to_dict()
    assert (d["location"]["line"], d["location"]["column"]) == (6, 5)
    assert [(r["line"], r["column"], r["label"]) for r in d["related"]] == [(4, 5, "first defined here")]


def test_control_characters_from_the_input_are_escaped_in_diagnostics(tmp_path: Path) -> None:
    path = tmp_path / "esc.yaml"
    path.write_text('pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n    tensor_parallel_size: "\\e[2J\\u2028x"\n')
    o = cli(["validate", str(path)])
    assert o.rc == 1
    assert "error[OPD101]: `tensor_parallel_size` must be an integer, found '\\x1b[2J\\u2028x'" in o.out
    assert "\x1b" not in o.out and "\u2028" not in o.out


# --- the same through a real process: no traceback on stderr ---------------------------

SUBPROCESS_CASES = [("billion_laughs", "expand"), ("deep_flow_lists_100k", "validate"),
                    ("sequence_as_key", "expand"), ("impossible_date", "validate")]


@pytest.mark.parametrize("name,command", SUBPROCESS_CASES)
def test_hostile_input_in_a_subprocess_has_no_traceback(name: str, command: str, tmp_path: Path) -> None:
    h = hostile(name)
    path = tmp_path / "hostile.yaml"
    path.write_bytes(h.build())
    # one process per case: each costs about a second of interpreter start and imports
    r = subprocess.run([sys.executable, "-m", "omni_pd.cli", command, str(path)], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env={**os.environ, "OMNI_PD_DEBUG": ""})
    assert "Traceback" not in r.stderr
    _assert_hostile(h, Outcome([command, str(path)], r.returncode, r.stdout, r.stderr), path)


def test_piped_stdin_over_the_limit_in_a_subprocess(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "omni_pd.cli", "validate", "/dev/stdin"],
                       input=b"stages: []\n" + b"x: 1\n" * 300_000, capture_output=True, timeout=120, cwd=tmp_path)
    err = r.stderr.decode()
    assert r.returncode == 2 and "Traceback" not in err
    assert err.startswith("error[OPD001]: file is larger than 1048576 bytes")


def test_valid_input_in_a_subprocess_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "qwen3_omni_moe.yaml"
    path.write_text(PRESET_TEXT.replace("max_num_seqs: 64", "max_num_seqs: 32", 1))
    r = subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", "-q", str(path)], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)
    assert (r.returncode, diag_codes(r.stderr)) == (0, [])  # nothing (OPD704: the compat layer covers the Talker)
    assert "max_num_seqs: 32" in r.stdout


# --- files: atomic output, input never overwritten -------------------------------------

def test_failed_expand_leaves_no_output_and_no_temp_file(tmp_path: Path) -> None:
    src = tmp_path / "qwen3_omni_moe.yaml"
    src.write_text(PRESET_TEXT.replace("max_num_seqs: 64", "max_num_seqs: [", 1))
    o = cli(["expand", str(src), "-o", str(tmp_path / "out.yaml")])
    assert o.rc == 2 and first_error(o).code == "OPD002"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qwen3_omni_moe.yaml"]


def test_failed_expand_keeps_an_existing_output_file(tmp_path: Path) -> None:
    src, out = tmp_path / "qwen3_omni_moe.yaml", tmp_path / "out.yaml"
    src.write_text(PRESET_TEXT.replace("    devices: \"0\"\n", "    devices: \"0\"\n    tensor_parallel_size: 0\n", 1))
    out.write_text("previous\n")
    o = cli(["expand", str(src), "-o", str(out)])
    assert o.rc == 2
    d = first_error(o)
    assert (d.code, d.message) == ("OPD101", "`tensor_parallel_size` must be a positive integer, found 0")
    assert out.read_text() == "previous\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.yaml", "qwen3_omni_moe.yaml"]


def test_expand_refuses_to_overwrite_its_input_even_through_a_symlink(tmp_path: Path) -> None:
    src = tmp_path / "qwen3_omni_moe.yaml"
    src.write_text(PRESET_TEXT)
    link = tmp_path / "link.yaml"
    link.symlink_to(src)
    for target in (src, link):
        o = cli(["expand", str(src), "-o", str(target)])
        assert o.rc == 2
        d = first_error(o)
        assert (d.code, d.message, d.file) == ("OPD005", "refusing to overwrite the input file", str(target))
    assert src.read_text() == PRESET_TEXT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.yaml", "qwen3_omni_moe.yaml"]


def test_unwritable_output_is_a_diagnostic_and_leaves_no_temp_file(tmp_path: Path) -> None:
    src = tmp_path / "qwen3_omni_moe.yaml"
    src.write_text(PRESET_TEXT)
    (tmp_path / "out.yaml").mkdir()  # os.replace onto a directory fails
    o = cli(["expand", "-q", str(src), "-o", str(tmp_path / "out.yaml")])
    assert o.rc == 2
    d = first_error(o)
    assert d.code == "OPD005" and d.message.startswith("cannot write output: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.yaml", "qwen3_omni_moe.yaml"]
    assert list((tmp_path / "out.yaml").iterdir()) == []


def test_successful_expand_replaces_the_output_atomically(tmp_path: Path) -> None:
    src, out = tmp_path / "qwen3_omni_moe.yaml", tmp_path / "out.yaml"
    src.write_text(PRESET_TEXT)
    out.write_text("previous\n")
    out.chmod(0o600)
    o = cli(["expand", "-q", str(src), "-o", str(out)])
    assert o.rc == 0, o.err
    assert out.read_text().startswith("# yaml-language-server: $schema=")
    assert out.stat().st_mode & 0o777 == 0o600  # the mode of the file it replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.yaml", "qwen3_omni_moe.yaml"]


# --- regressions: one per crash the fuzzing found ---------------------------------------

def _preset_with(tmp_path: Path, old: str, new: str, name: str = "qwen3_omni_moe.yaml") -> Path:
    assert old in PRESET_TEXT
    path = tmp_path / name
    path.write_text(PRESET_TEXT.replace(old, new, 1))
    return path


THINKER = "  - stage_id: 0   # thinker\n"


@pytest.mark.parametrize("text,where,message", [
    # was: exit 3, TypeError: unhashable type: 'list' (parse.to_plain)
    ("stages:\n  - stage_id: 0\n? [a, b]\n: 1\n", "3:3", "invalid YAML: a mapping key must be a scalar, found a sequence"),
    # was: exit 3, TypeError: unhashable type: 'CommentedSeq' (inside ruamel.yaml)
    ("stages:\n  - stage_id: 0\n? {a: [1]}\n: 1\n", "3:3", "invalid YAML: a mapping key must be a scalar, found a mapping"),
    # was: exit 3, ValueError: day is out of range for month (ruamel's timestamp constructor)
    ("stages: []\nx: 2001-02-30\n", "2:4",
     "invalid YAML: cannot read `2001-02-30` as !!timestamp (day is out of range for month)"),
    # was: exit 3, IndexError: string index out of range
    ("stages: []\nx: !!int 0x\n", "2:4", "invalid YAML: cannot read `0x` as !!int (string index out of range)"),
    ("stages: []\nx: 0x_\n", "2:4", "invalid YAML: cannot read `0x_` as !!int (string index out of range)"),
    # was: exit 3, KeyError: 'maybe'
    ("stages: []\nx: !!bool maybe\n", "2:4", "invalid YAML: cannot read `maybe` as !!bool ('maybe')"),
    # was: OPD002 with no position ("unacceptable character #x0000")
    ("stages: []\nx: a\x00b\n", "2:5", "invalid YAML: character U+0000 is not allowed in YAML"),
])
@pytest.mark.parametrize("command", ["expand", "validate"])
def test_regression_loader_errors_are_located_opd002(text: str, where: str, message: str, command: str,
                                                     tmp_path: Path) -> None:
    path = tmp_path / "in.yaml"
    path.write_text(text)
    o = cli([command, str(path)])
    assert o.rc == 2
    d = first_error(o)
    assert (d.code, d.message, f"{d.line}:{d.column}", d.file) == ("OPD002", message, where, str(path))


@pytest.mark.parametrize("text,message,where", [
    # was: OPD000 in rule OPD203 (AttributeError: 'str' object has no attribute 'keys')
    ("pipeline: qwen3_omni_moe\nconnectors: abc\nstages:\n  - stage_id: 0\n",
     "`connectors` must be a mapping, found 'abc'", "2:13"),
    # was: OPD000 in rule OPD103 (TypeError: unhashable type: 'dict')
    ("pipeline: qwen3_omni_moe\nplatforms:\n  - {a: 1}\nstages:\n  - stage_id: 0\n",
     "`platforms` must be a mapping, found a list", "3:3"),
])
def test_regression_rules_survive_ill_typed_sections(text: str, message: str, where: str, tmp_path: Path) -> None:
    path = tmp_path / "in.yaml"
    path.write_text(text)
    o = cli(["validate", str(path)])
    assert o.rc == 1
    errors = [d for d in read_diagnostics(o.out) if d.severity == "error"]
    assert [(d.code, d.message, f"{d.line}:{d.column}") for d in errors] == [("OPD101", message, where)]


def test_regression_platform_overlay_that_is_not_a_mapping(tmp_path: Path) -> None:
    # was: OPD000 in rule OPD104 (AttributeError: 'str' object has no attribute 'get') with --platform npu
    path = tmp_path / "in.yaml"
    path.write_text("pipeline: qwen3_omni_moe\nplatforms: {npu: abc}\nstages:\n  - stage_id: 0\n")
    o = cli(["validate", "--platform", "npu", str(path)])
    assert o.rc == 1
    errors = [d for d in read_diagnostics(o.out) if d.severity == "error"]
    assert [(d.code, d.message, d.line, d.column) for d in errors] == [
        ("OPD101", "`npu` must be a mapping, found 'abc'", 2, 18)]


def test_regression_zero_tensor_parallel_size(tmp_path: Path) -> None:
    # was: expand exit 0 with TP 0 written out; validate OPD000 (ZeroDivisionError in OPD306/OPD603)
    path = _preset_with(tmp_path, THINKER, THINKER + "    tensor_parallel_size: 0\n")
    o = cli(["expand", "-q", str(path)])
    assert o.rc == 2 and o.out == ""
    d = first_error(o)
    assert (d.code, d.message, d.line, d.column) == (
        "OPD101", "`tensor_parallel_size` must be a positive integer, found 0", 18, 27)
    pd = tmp_path / "pd.yaml"
    pd.write_text("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
                  "  - {stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2, kv_transfer_config: "
                  "{kv_connector: MooncakeConnectorV1, kv_role: kv_producer}}\n"
                  "  - {stage_id: 1, devices: \"2\", tensor_parallel_size: 0, kv_transfer_config: "
                  "{kv_connector: MooncakeConnectorV1, kv_role: kv_consumer}}\n")
    o = cli(["validate", str(pd)])
    assert o.rc == 1 and "OPD000" not in o.out
    assert ("OPD101", "`tensor_parallel_size` must be a positive integer, found 0", 5, 55) in [
        (d.code, d.message, d.line, d.column) for d in read_diagnostics(o.out)]


def test_regression_huge_tensor_parallel_size_in_validate(tmp_path: Path) -> None:
    # was: validate never returned (OPD401's help built a 10**23-entry device list)
    path = _preset_with(tmp_path, THINKER, THINKER + "    tensor_parallel_size: 99999999999999999999999\n")
    o = cli(["validate", str(path)])
    assert o.rc == 1
    d = next(d for d in read_diagnostics(o.out) if d.code == "OPD401")
    assert d.message == ("stage 0: tensor_parallel_size 99999999999999999999999 x pipeline_parallel_size 1 x "
                         "data_parallel_size 1 = 99999999999999999999999 devices, but devices has 1 entry")
    assert (d.line, d.column) == (25, 14)
    assert "= help: list 99999999999999999999999 devices here, or lower the parallel sizes" in o.out


def test_regression_huge_engine_args_tensor_parallel_size_in_expand(tmp_path: Path) -> None:
    # was: exit 3, MemoryError (split_devices built range(10**14) for a Thinker without devices)
    path = _preset_with(tmp_path, '    devices: "0"\n', "    engine_args: {tensor_parallel_size: 99999999999999}\n")
    o = cli(["expand", "-q", str(path)])
    assert o.rc == 2
    d = first_error(o)
    assert (d.code, d.message, d.line, d.column) == (
        "OPD805", "cannot place prefill and decode: TP x PP x DP = 99999999999999 devices per engine, "
                  "more than the 4096 omni-pd places", 24, 41)


def test_regression_huge_tp_option(tmp_path: Path) -> None:
    # was: exit 3, MemoryError; the number comes from the command line, so no file position
    o = cli(["expand", "-q", "--tp", "9999999999999"])
    assert o.rc == 2
    assert o.err.splitlines() == [
        "error[OPD805]: cannot place prefill and decode: TP x PP x DP = 9999999999999 devices per engine, "
        "more than the 4096 omni-pd places", "  = help: parallel sizes must be at least 1 and fit the host's devices"]


def test_regression_huge_top_level_data_parallel_size(tmp_path: Path) -> None:
    # found by the fuzzer: an OPD805 with no position (the size came from the top level)
    path = tmp_path / "qwen3_omni_moe.yaml"
    # (one stage: `stages: []` is OPD007 since validate and expand share that gate)
    path.write_text("stages:\n  - stage_id: 0\npipeline: qwen3_omni_moe\ndata_parallel_size: 1180591620717411303423\n")
    d = first_error(cli(["expand", str(path)]))
    assert (d.code, d.line, d.column) == ("OPD805", 4, 21)


def test_regression_unknown_connector_from_the_file_is_located(tmp_path: Path) -> None:
    # found by the fuzzer: OPD804 had no position when the connector came from the file
    path = tmp_path / "qwen3_omni_moe.yaml"
    path.write_text("stages:\n  - stage_id: 0\n    engine_args: {kv_transfer_config: {kv_connector: MultiConnector}}\n")
    d = first_error(cli(["expand", str(path)]))
    assert (d.code, d.message, d.line, d.column) == ("OPD804", "no connector contract for `MultiConnector`", 3, 54)


def test_regression_malformed_devices_are_located_in_validate(tmp_path: Path) -> None:
    # was: validate's OPD101 for devices "a,b" had no position (raised by topology.resolve)
    path = _preset_with(tmp_path, 'devices: "0"', 'devices: "a,b"')
    o = cli(["validate", "--all-platforms", str(path)])
    assert o.rc == 1
    d = next(d for d in read_diagnostics(o.out) if d.code == "OPD101")
    assert (d.message, d.line, d.column) == (
        "invalid value for `devices`: devices must be comma-separated device indices like \"0,1\", found 'a,b'", 24, 14)


def test_regression_non_utf8_byte_has_a_column(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"stages: []\nx: caf\xe9\n")
    d = first_error(cli(["validate", str(path)]))
    assert (d.code, d.message, d.line, d.column) == ("OPD001", "not UTF-8 text (invalid byte 0xe9)", 2, 7)


def test_a_malformed_overlay_devices_value_is_located_at_the_overlay() -> None:
    """Found by the fuzzer in CI: an overlay's devices that is not a device list (here a
    YAML binary, b'hello') was an OPD101 without a location under --all-platforms."""
    from omni_pd.check.validate import ValidateOptions, validate_text

    text = ("pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n    devices: \"0\"\n  - stage_id: 1\n    devices: \"1\"\n"
            "    gpu_memory_utilization: 0.4\n  - stage_id: 2\n    devices: \"1\"\n    gpu_memory_utilization: 0.4\n"
            "platforms:\n  npu:\n    stages:\n      - stage_id: 2\n        devices: \"2\"\n"
            "      - stage_id: 0\n        devices: !!binary aGVsbG8=\n")
    res = validate_text(text, "f.yaml", ValidateOptions(all_platforms=True))
    [d] = [d for d in res.diagnostics if d.code == "OPD101" and "devices" in d.message]
    assert (d.location.line, d.location.column) == (17, 18)
