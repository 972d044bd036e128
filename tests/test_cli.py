"""The command line users of linters and config tools expect (issue 13): ``--version``,
``validate`` over many files and directories, option values checked where they are
parsed, ``explain`` for every emitted code, ``graph``, shell completion, ``--help``."""

from __future__ import annotations

import io
import os
import sys
import tomllib
from pathlib import Path

import pytest

from omni_pd.cli import main

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"

#: a single-stage LLM config with one located type error (exit 1)
BAD = "stages:\n  - stage_id: 0\n    tensor_parallel_size: two\n"
BAD_DIAG = ("error[OPD101]: `tensor_parallel_size` must be an integer, found 'two'\n"
            " --> {name}:3:27\n"
            "  |\n"
            "3 |     tensor_parallel_size: two\n"
            "  |                           ^^^\n"
            "  = help: write an integer for `tensor_parallel_size`\n")
#: clean single-stage LLM config (no diagnostics at all)
CLEAN = (FIX / "llm.yaml").read_text()


def run_cli(args, capsys, cwd: Path = ROOT, stdin: bytes | None = None, monkeypatch=None):
    old = os.getcwd()
    os.chdir(cwd)
    saved = sys.stdin
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    try:
        rc = main(args)
    finally:
        sys.stdin = saved
        os.chdir(old)
    out, err = capsys.readouterr()
    return rc, out, err


# --- 1. --version -----------------------------------------------------------------------

def test_version_names_omni_pd_and_the_targets_from_data(capsys):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    rc, out, err = run_cli(["--version"], capsys)
    assert rc == 0 and err == ""
    # 0.30 / 0.11..0.34: presets/targets/vllm.yaml; vllm-omni 0.30: presets/targets/vllm_omni_stage_keys.yaml
    assert out == (f"omni-pd {project}\n"
                   "targets vLLM 0.30 (--vllm-version 0.11 to 0.34), vllm-omni 0.30\n")


def test_version_follows_the_target_data(capsys, monkeypatch):
    from omni_pd.compile import versions

    monkeypatch.setattr(versions, "_vllm_facts",
                        lambda: {"default_version": "0.31", "known_versions": {"first": "0.13", "last": "0.35"}})
    monkeypatch.setattr(versions, "default_vllm_omni_version", lambda: "0.31")
    rc, out, _ = run_cli(["--version"], capsys)
    assert rc == 0
    assert out.splitlines()[1] == "targets vLLM 0.31 (--vllm-version 0.13 to 0.35), vllm-omni 0.31"


# --- 2. validate on many files ---------------------------------------------------------

@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    (tmp_path / "configs" / "sub").mkdir(parents=True)
    (tmp_path / "configs" / "a.yaml").write_text(CLEAN)
    (tmp_path / "configs" / "sub" / "b.yml").write_text(BAD)
    (tmp_path / "configs" / "notes.txt").write_text("not yaml: [")
    (tmp_path / "configs" / ".hidden").mkdir()
    (tmp_path / "configs" / ".hidden" / "c.yaml").write_text("not: [closed")
    return tmp_path


def test_validate_walks_directories_and_prints_one_summary(tree, capsys):
    rc, out, err = run_cli(["validate", "--pipeline", "llm", "configs"], capsys, cwd=tree)
    assert rc == 1
    assert err == ""
    assert out == "configs/a.yaml: ok (0 errors, 0 warnings, 0 info)\n" + \
        BAD_DIAG.format(name="configs/sub/b.yml") + "\n" + \
        "configs/sub/b.yml: FAILED (1 error, 0 warnings, 0 info)\n" + \
        "validate: 2 files, 1 ok, 1 failed (1 error, 0 warnings, 0 info)\n"


def test_validate_worst_exit_status_wins_and_stdin_is_dash(tree, capsys):
    rc, out, err = run_cli(["validate", "--pipeline", "llm", "configs/a.yaml", "-", "missing.yaml"],
                           capsys, cwd=tree, stdin=BAD.encode())
    assert rc == 2  # unreadable (2) beats errors found (1)
    assert out == "configs/a.yaml: ok (0 errors, 0 warnings, 0 info)\n" + \
        BAD_DIAG.format(name="<stdin>") + "\n" + "<stdin>: FAILED (1 error, 0 warnings, 0 info)\n" + \
        "missing.yaml: unreadable (1 error, 0 warnings, 0 info)\n" + \
        "validate: 3 files, 1 ok, 1 failed, 1 unreadable (2 errors, 0 warnings, 0 info)\n"
    assert err == ("error[OPD001]: file not found\n"
                   " --> missing.yaml\n"
                   "  = help: check the path\n\n")


def test_validate_single_file_keeps_its_verdict_line(tree, capsys):
    rc, out, _ = run_cli(["validate", "--pipeline", "llm", "-"], capsys, cwd=tree, stdin=CLEAN.encode())
    assert (rc, out) == (0, "<stdin>: ok (0 errors, 0 warnings, 0 info)\n")


def test_validate_many_files_json_holds_every_file(tree, capsys):
    import json

    rc, out, _ = run_cli(["validate", "--pipeline", "llm", "--format", "json", "configs", "missing.yaml"],
                         capsys, cwd=tree)
    assert rc == 2
    got = [(d["code"], d["location"]["file"], d["location"]["line"]) for d in json.loads(out)]
    assert got == [("OPD101", "configs/sub/b.yml", 3), ("OPD001", "missing.yaml", None)]


def test_validate_empty_directory_is_bad_input(tree, capsys):
    (tree / "empty").mkdir()
    rc, out, err = run_cli(["validate", "--pipeline", "llm", "empty", "configs/a.yaml"], capsys, cwd=tree)
    assert rc == 2
    assert out == ("configs/a.yaml: ok (0 errors, 0 warnings, 0 info)\n"
                   "validate: 1 file, 1 ok, 0 failed (1 error, 0 warnings, 0 info)\n")
    assert err == ("error[OPD001]: directory holds no *.yaml or *.yml file\n"
                   " --> empty\n"
                   "  = help: give deploy files or a directory that contains them\n\n")


def test_collect_inputs_order_repeats_and_hidden(tree):
    from omni_pd.check.inputs import collect_inputs

    got = collect_inputs([str(tree / "configs"), str(tree / "configs" / "a.yaml"), "-",
                          str(tree / "configs" / "notes.txt")])
    rel = [p if p == "-" else os.path.relpath(p, tree) for p in got.paths]
    assert rel == ["configs/a.yaml", "configs/sub/b.yml", "-", "configs/notes.txt"]
    assert got.problems == ()


def test_expand_takes_one_file(capsys):
    rc, out, err = run_cli(["expand", "tests/fixtures/llm.yaml", "presets/qwen3_omni_moe.yaml"], capsys)
    assert rc == 2 and out == ""
    assert err == ("Usage: omni-pd expand [OPTIONS] [input]\n"
                   "Try 'omni-pd expand --help' for help.\n\n"
                   "Error: Got unexpected extra argument(s) (presets/qwen3_omni_moe.yaml)\n")


# --- 3. explain: every emitted code -----------------------------------------------------

def emitted_codes() -> dict[str, set[str]]:
    """Every ``"OPDnnn"`` string constant in omni_pd/ (docstrings and prose excluded:
    only a whole constant counts), with the files that hold it; the catalogue itself
    (omni_pd/check/codes.py) does not count."""
    import ast
    import re

    found: dict[str, set[str]] = {}
    for p in sorted((ROOT / "omni_pd").rglob("*.py")):
        if p == ROOT / "omni_pd" / "check" / "codes.py":
            continue
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"OPD\d{3}", node.value):
                found.setdefault(node.value, set()).add(str(p.relative_to(ROOT)))
    return found


def test_every_emitted_code_is_explainable_and_listed(capsys):
    from omni_pd.check.codes import CODES, explainable

    emitted = emitted_codes()
    known = explainable()
    missing = {c: sorted(f) for c, f in emitted.items() if c not in known}
    assert missing == {}, "give these codes an entry in omni_pd/check/codes.py (or a rule)"
    # the catalogue holds nothing stale either
    assert sorted(c.code for c in CODES if c.code not in emitted) == []
    # the codes outside the rule engine the issue names are among them
    assert {"OPD000", "OPD001", "OPD006", "OPD801", "OPD805", "OPD901", "OPD950", "OPD952",
            "OPD960", "OPD966"} <= set(emitted)
    assert main(["rules"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert sorted(listed) == sorted(known) and len(listed) == len(set(listed))
    for code in sorted(emitted):
        assert main(["explain", code]) == 0
        out = capsys.readouterr().out
        assert out.startswith(f"{code} {known[code].name} (") and "``" not in out


def test_explain_catalogued_code_exact(capsys):
    assert main(["explain", "opd952"]) == 0
    assert capsys.readouterr().out == (
        "OPD952 vllm-omni-unavailable (error, against)\n\n"
        "vllm-omni cannot be run\n\n"
        "`validate --against-vllm-omni` found no interpreter with vllm-omni and omni-pd\n"
        "importable (this one, `--vllm-omni-python` or `$OMNI_PD_ORACLE_PYTHON`), or it\n"
        "failed to start. The help says how to install it.\n\n"
        "Emitted by: omni_pd/upstream/against.py against_vllm_omni()\n\n"
        "Exit status: 2\n")


def test_explain_rule_doc_is_dedented_and_literals_rendered(capsys):
    from omni_pd.check.rules import get

    rule = get("OPD304")
    assert "\n    " in rule.doc and "``kv_connector``" in rule.doc  # the raw docstring: indented, reST
    assert main(["explain", "OPD304"]) == 0
    out = capsys.readouterr().out
    doc = out.split("\n\n")[2]
    assert doc.startswith("`kv_connector` must be set and equal on both sides")
    assert all(not line.startswith(" ") for line in doc.splitlines())
    assert "\nFails:\n\n    pipeline: qwen3_omni_moe_pd\n" in out


def test_explain_on_a_terminal_uses_rich_markup():
    from rich.console import Console

    from omni_pd.check.codes import lookup
    from omni_pd.check.explain import print_rich, rich_literals

    assert rich_literals("set ``kv_role: [a]`` here") == "set [bold cyan]kv_role: \\[a][/] here"
    buf = io.StringIO()
    print_rich(lookup("OPD304"), Console(file=buf, force_terminal=True, color_system="standard", width=100))
    text = buf.getvalue()
    assert "\x1b[1;36mkv_connector\x1b[0m must be set" in text and "``" not in text


def test_explain_unknown_code_suggests(capsys):
    assert main(["explain", "OPD9666"]) == 2
    assert capsys.readouterr().err == ("error[OPD006]: unknown code or rule name `OPD9666`\n"
                                       "  = help: did you mean OPD966 (not-pd)? `omni-pd rules` lists them\n")


# --- 4. option values checked where they are parsed; expand checks its own output ------

@pytest.mark.parametrize("args, message, help", [
    (["--connector", "NixlConnector", "--kv-buffer-device", "gpu"],
     "--kv-buffer-device gpu: NixlConnector with vLLM 0.30 on cuda accepts cuda or cpu",
     "pass --kv-buffer-device cuda (or cpu for host staging)"),
    (["--connector", "NixlConnector", "--kv-buffer-device", "cpu", "--vllm-version", "0.11"],
     "--kv-buffer-device cpu: NixlConnector with vLLM 0.11 on cuda accepts cuda",
     "pass --kv-buffer-device cuda"),
    (["--kv-buffer-device", "banana"],
     "--kv-buffer-device banana: vLLM's KVTransferConfig (vllm/config/kv_transfer.py) accepts cuda, cpu or xpu",
     "pass --kv-buffer-device cuda"),
    (["--vllm-version", "9.9"],
     "--vllm-version 9.9: omni-pd has no facts for vLLM 9.9; known versions: 0.11 to 0.34 (presets/targets/vllm.yaml)",
     "give a vLLM major.minor from 0.11 to 0.34"),
    (["--vllm-version", "latest"],
     "--vllm-version latest: not a vLLM version: 'latest' (expected MAJOR.MINOR, e.g. 0.30)",
     "give a vLLM major.minor from 0.11 to 0.34"),
    (["--kv-host", "bad_host!"],
     "--kv-host 'bad_host!': not an IP address or host name",
     "pass --kv-host with an address the other engine can reach, e.g. 10.0.0.1 or host-a"),
    (["--mooncake-protocol", "udp"],
     "--mooncake-protocol udp: the Mooncake Transfer Engine protocols are rdma or tcp",
     "pass --mooncake-protocol tcp (no RDMA NIC) or rdma"),
    (["--connector", "nixl", "--mooncake-protocol", "tcp"],
     "--mooncake-protocol tcp: it configures MooncakeConnector, not NixlConnector",
     "drop --mooncake-protocol, or pass --connector MooncakeConnector"),
])
def test_expand_refuses_option_values_nothing_accepts(tmp_path, capsys, args, message, help, monkeypatch):
    # vLLM 0.11 has no vllm-omni: OPD704 would refuse the Talker first (tests/test_talker_pd.py); here the option
    monkeypatch.setattr("omni_pd.compile.talker_pd.gap", lambda *a: None)
    out_file = tmp_path / "pd.yaml"
    rc, out, err = run_cli(["expand", "-o", str(out_file), *args], capsys)
    assert (rc, out) == (2, "")
    assert err == f"error[OPD006]: {message}\n  = help: {help}\n"
    assert not out_file.exists()


def test_validate_refuses_an_unknown_vllm_version(capsys):
    rc, out, err = run_cli(["validate", "tests/fixtures/llm.yaml", "--vllm-version", "0.5"], capsys)
    assert (rc, out) == (2, "")
    assert err.startswith("error[OPD006]: --vllm-version 0.5: omni-pd has no facts for vLLM 0.5;")


@pytest.mark.parametrize("args", [["--connector", "NixlConnector", "--kv-buffer-device", "cpu"],
                                  ["--kv-buffer-device", "cuda", "--vllm-version", "0.33"],
                                  ["--kv-host", "10.0.0.7"], ["--kv-host", "host-a.cluster"]])
def test_expand_accepts_good_option_values(capsys, args):
    rc, out, err = run_cli(["expand", "-q", *args], capsys)
    assert rc == 0, err
    assert out.startswith("# yaml-language-server: $schema=")


def test_mooncake_protocol_reaches_both_sides_transfer_engines(capsys):
    """vLLM's MooncakeConnectorWorker reads ``kv_connector_extra_config.mooncake_protocol``
    on prefill and decode alike (default rdma): both sides get it, prefill's bootstrap port
    stays, and the output validates (expand's own check)."""
    from ruamel.yaml import YAML

    rc, out, err = run_cli(["expand", "-q", "--mooncake-protocol", "tcp", "--port-base", "19570"], capsys)
    assert rc == 0, err
    stages = YAML(typ="safe").load(out)["stages"]
    extra = [s["kv_transfer_config"].get("kv_connector_extra_config") for s in stages if "kv_transfer_config" in s]
    assert extra == [{"bootstrap_port": 19570, "mooncake_protocol": "tcp"}, {"mooncake_protocol": "tcp"}]


def test_mooncake_protocol_on_a_file_whose_thinker_names_nixl_is_refused(tmp_path, capsys):
    """No --connector: the connector is the Thinker's own, known only once the file is read."""
    src = tmp_path / "nixl.yaml"
    text = (FIX / "qwen3_omni_moe_cpu.yaml").read_text()
    head = "  - stage_id: 0   # thinker\n"
    assert head in text
    src.write_text(text.replace(head, head + "    kv_transfer_config:\n      kv_connector: NixlConnector\n"
                                "      kv_buffer_device: cpu\n", 1))
    rc, out, err = run_cli(["expand", "-q", str(src)], capsys)
    assert rc == 0, err  # the file expands over its own NIXL
    rc, out, err = run_cli(["expand", "-q", "--mooncake-protocol", "tcp", str(src)], capsys)
    assert (rc, out) == (2, "")
    assert err == ("error[OPD006]: --mooncake-protocol tcp: it configures MooncakeConnector, not NixlConnector\n"
                   "  = help: drop --mooncake-protocol, or pass --connector MooncakeConnector\n")


def test_expand_output_that_validate_rejects_is_a_bug_and_not_written(tmp_path, capsys, monkeypatch):
    """Fault injection: let `--kv-buffer-device gpu` through the option check; the
    output then carries OPD611 and expand must refuse to write it (exit 3)."""
    from omni_pd import cli_options

    monkeypatch.setattr(cli_options, "kv_buffer_device", lambda value, *a, **k: value)
    out_file = tmp_path / "pd.yaml"
    rc, out, err = run_cli(["expand", "-q", "--connector", "NixlConnector", "--kv-buffer-device", "gpu",
                            "-o", str(out_file)], capsys)
    assert (rc, out) == (3, "")
    assert not out_file.exists()
    assert err.count("error[OPD611]: stage 0: NixlConnector on cuda with vLLM 0.30 (assumed: no --vllm-version "
                     "given; pass --vllm-version X.Y) accepts kv_buffer_device cuda or cpu, not gpu") == 1
    assert f" --> {out_file} (not written):" in err
    assert err.endswith("error[OPD000]: internal error: expand produced a config its own validate rejects (OPD611)\n"
                        "  = help: this is a bug in omni-pd (nothing was written); please report it with the "
                        "input and options\n")


def test_a_stage_key_of_the_pipeline_expand_chose_is_the_inputs_error_not_an_expand_bug(tmp_path, capsys):
    """A file without `pipeline:` whose one stage expand splits as the plain-vLLM `llm` pipeline: a
    stage key there becomes a `vllm serve` flag (OPD107), which the input has under the pipeline
    expand chose. Found by tests/test_fuzz.py (`'<<': null`): it was OPD000, exit 3."""
    src = tmp_path / "one.yaml"
    src.write_text("stages:\n  - stage_id: 0\n    '<<': null\n")
    out_file = tmp_path / "pd.yaml"
    rc, out, err = run_cli(["expand", "-q", str(src), "-o", str(out_file)], capsys)
    assert (rc, out) == (2, "")
    assert not out_file.exists()
    assert err.startswith("error[OPD107]: stage 0: `<<` becomes `--<<` on this engine's `vllm serve` command line")
    assert f" --> {src}:3:5\n" in err and "OPD000" not in err
    assert err.endswith(f"expand: {src} already has these errors (`omni-pd validate {src} --pipeline llm`); "
                        "fix them first, nothing was written\n")


def test_expand_refuses_input_errors_it_would_carry_over(tmp_path, capsys):
    src = tmp_path / "qwen3_omni_moe.yaml"  # vllm-omni's file name: the pipeline is known
    src.write_text((ROOT / "presets" / "qwen3_omni_moe.yaml").read_text()
                   .replace("gpu_memory_utilization: 0.6", "gpu_memory_utilization: 0.95"))
    out_file = tmp_path / "pd.yaml"
    rc, out, err = run_cli(["expand", "-q", str(src), "-o", str(out_file)], capsys, cwd=tmp_path)
    assert (rc, out) == (2, "")
    assert not out_file.exists()
    assert err.startswith("error[OPD404]: physical GPU 1: 0.95 (stage 1) + 0.1 (stage 2) = 1.05 > 1.0\n"
                          f"  --> {src}:49:29\n")
    assert err.endswith(f"expand: {src} already has these errors (`omni-pd validate {src}`); "
                        "fix them first, nothing was written\n")


def test_expand_a_pipeline_file_says_what_it_looks_like(tmp_path, capsys):
    out_file = tmp_path / "pd.yaml"
    rc, out, err = run_cli(["expand", "presets/pipelines/qwen3_omni_moe.yaml", "-o", str(out_file)], capsys)
    assert (rc, out) == (2, "")
    assert not out_file.exists()
    assert err == (
        "error[OPD007]: not a deploy config: this looks like an omni-pd pipeline definition (the stage graph, "
        "like presets/pipelines/*.yaml: stages with role/execution_type/input_sources), not deploy settings\n"
        " --> presets/pipelines/qwen3_omni_moe.yaml:1:1\n"
        "  |\n"
        "1 | # Qwen3-Omni-MoE: the frozen three-stage pipeline vllm-omni registers as\n"
        "  | ^\n"
        "  = help: expand takes a vllm-omni deploy config (a `stages:` list of per-stage engine settings, "
        "like presets/qwen3_omni_moe.yaml); nothing was written\n")


@pytest.mark.parametrize("tree, looks_like", [
    ({"hosts": {"a": {}}, "placement": {"all": "a"}}, "a launch inventory (hosts and placement; give it to `validate --inventory`)"),
    ({"model_type": "qwen3_omni_moe"}, "a Hugging Face config.json (give it to `validate --model-info`)"),
    ({"$schema": "x", "properties": {}}, "a JSON Schema"),
    ({"default_version": "0.30"}, "omni-pd target facts (presets/targets/*.yaml)"),
    ({"a": 1, "b": 2}, "a YAML mapping without `stages:` (top-level keys: a, b)"),
    ({"stages": [{"stage_id": 0, "devices": "0"}]}, None),
    ({"stage_args": []}, None),
])
def test_describe_input(tree, looks_like):
    from omni_pd.check.inputs import describe

    assert describe(tree) == looks_like


# --- 5. option files: the error names the option and says what the file is ---------------

@pytest.mark.parametrize("option, help", [
    ("--inventory", "--inventory takes a YAML file of hosts and stage placement "
                    "(docs/validate.md, Inventory and model facts)"),
    ("--model-info", "--model-info takes the model's Hugging Face config.json (the file next to the weights, "
                     "e.g. <model dir>/config.json; docs/validate.md, Inventory and model facts)"),
])
def test_missing_option_file_names_the_option(tmp_path, capsys, option, help):
    rc, out, err = run_cli(["validate", "tests/fixtures/llm.yaml", option, "hosts.yaml"], capsys, cwd=tmp_path)
    assert (rc, out) == (2, "")
    assert err == f"error[OPD001]: {option} hosts.yaml: file not found\n --> hosts.yaml\n  = help: {help}\n"


def test_model_info_that_is_not_a_config_json(tmp_path, capsys):
    (tmp_path / "config.json").write_text("[1, 2]\n")
    rc, _, err = run_cli(["validate", str(FIX / "llm.yaml"), "--model-info", "config.json"], capsys, cwd=tmp_path)
    assert rc == 2
    assert err.startswith("error[OPD004]: --model-info config.json: expected a mapping at the top level, found a list\n")
    (tmp_path / "config.json").write_text('{"num_key_value_heads": "four"}\n')
    rc, _, err = run_cli(["validate", str(FIX / "llm.yaml"), "--model-info", "config.json"], capsys, cwd=tmp_path)
    assert rc == 2
    assert err.startswith("error[OPD006]: --model-info config.json: not a usable config.json "
                          "(invalid literal for int() with base 10: 'four')\n")


def test_docs_config_json_fragment_is_read(tmp_path, capsys):
    """docs/validate.md, "Inventory and model facts": its config.json fragment is what --model-info reads."""
    import json

    from docs_pages import fenced_blocks, page, section
    from omni_pd.check.context import ModelInfo

    [frag] = fenced_blocks(section(page("docs/validate.md"), "## Inventory and model facts"), "json")
    info = ModelInfo.from_config_json(json.loads(frag))
    assert (info.model_type, info.num_kv_heads, info.attention) == ("qwen3_omni_moe", 4, "GQA")
    assert info.subconfigs == frozenset({"thinker_config", "talker_config", "code2wav_config"})
    (tmp_path / "config.json").write_text(frag)
    rc, out, _ = run_cli(["validate", "--model-info", str(tmp_path / "config.json"), "-q"], capsys)
    assert rc == 0 and "error[" not in out  # the sub-configs match the preset's stages: no OPD206


# --- issue item 10: skip reasons are short and name no path outside the project -----------

def test_skip_reason_policy():
    from skip_policy import MAX_REASON, reason_problems

    assert reason_problems("OMNI_PD_OFFLINE=1 and no vllm_omni-0.30.0-*.whl in .cache/wheels", ROOT) == []
    assert reason_problems(f"cached in {ROOT}/.cache/wheels; /dev/zero missing", ROOT) == []
    assert reason_problems("shared cases folder /work/shared/cases is absent", ROOT) == [
        "skip reason names a path outside the project: /work/shared/cases"]
    assert reason_problems("x" * (MAX_REASON + 1), ROOT) == [
        f"skip reason is {MAX_REASON + 1} characters (at most {MAX_REASON})"]


def test_a_long_skip_reason_fails_the_run(tmp_path):
    """The conftest hooks (tests/skip_policy.py) loaded as a plugin into a separate pytest run."""
    import subprocess

    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "def test_ok():\n    pytest.skip('vLLM is not installed')\n"
        "def test_long():\n    pytest.skip('x' * 300)\n"
        "def test_path():\n    pytest.skip('no model in /home/someone/models')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tests"))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "skip_policy", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_x.py")],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout
    assert "2 failed, 1 skipped" in proc.stdout
    assert "skip reason is 300 characters (at most 200)" in proc.stdout
    assert "skip reason names a path outside the project: /home/someone/models" in proc.stdout


# --- 6. graph --------------------------------------------------------------------------

GRAPH_GOLDEN = ROOT / "tests" / "golden" / "graph"


@pytest.fixture()
def expanded_preset(tmp_path: Path) -> Path:
    """`omni-pd expand` of the bundled preset (defaults: MooncakeConnector, vLLM 0.30)."""
    from omni_pd.compile.expand import expand_document
    from omni_pd.io import load_file
    from omni_pd.resources import preset_path

    out = tmp_path / "qwen3_omni_moe_pd.yaml"
    out.write_text(expand_document(load_file(preset_path("qwen3_omni_moe")), schema_ref="s.json").text)
    return out


@pytest.mark.parametrize("fmt, suffix", [("mermaid", "mmd"), ("dot", "dot"), ("tree", "txt")])
def test_graph_of_the_expanded_preset_golden(expanded_preset, capsys, fmt, suffix):
    rc, out, err = run_cli(["graph", str(expanded_preset), "--format", fmt], capsys)
    assert (rc, err) == (0, "")
    golden = GRAPH_GOLDEN / f"qwen3_omni_moe_pd.{suffix}"
    if os.environ.get("OMNI_PD_REGEN") == "1":
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(out)
    assert out == golden.read_text()


def test_graph_xpyd_nixl_tp2(tmp_path, capsys):
    from omni_pd.compile.expand import expand_document
    from omni_pd.compile.passes.pd_split import ExpandOptions
    from omni_pd.io import load_file
    from omni_pd.resources import preset_path

    text = expand_document(load_file(preset_path("qwen3_omni_moe")),
                           ExpandOptions(connector="NixlConnector", kv_buffer_device="cpu", tp=2)).text
    text = text.replace('    devices: "0,1"\n', '    devices: "0,1"\n    num_replicas: 2\n', 1)
    text = text.replace('    devices: "2,3"\n', '    devices: "2,3"\n    num_replicas: 3\n', 1)
    f = tmp_path / "xpyd.yaml"
    f.write_text(text)
    rc, out, _ = run_cli(["graph", str(f)], capsys)
    assert rc == 0
    assert out.splitlines()[:10] == [
        "qwen3_omni_moe_pd (vllm-omni runtime, base platform)",
        "├── stage 0: thinker prefill",
        "│   ├── devices 0,1, TP 2, 2 replicas",
        "│   ├── NixlConnector kv_producer, engine_id omni-thinker-prefill",
        "│   ├── ports 5600 NIXL side channel; 5600 NIXL side channel (replica 1)",
        "│   └── => stage 1 (KV NixlConnector transfer)",
        "├── stage 1: thinker decode",
        "│   ├── devices 2,3, TP 2, 3 replicas",
        "│   ├── NixlConnector kv_consumer, engine_id omni-thinker-decode",
        "│   ├── ports 5601 NIXL side channel; 5601 NIXL side channel (replica 1); "
        "5601 NIXL side channel (replica 2)"]


def test_graph_epd_encoder_cache_edge(tmp_path, capsys):
    f = tmp_path / "epd.yaml"
    f.write_text("async_chunk: false\nstages:\n"
                 '  - {stage_id: 0, devices: "0", mm_encoder_only: true, '
                 "ec_transfer_config: {ec_connector: ECCPUConnector, ec_role: ec_producer}}\n"
                 '  - {stage_id: 1, devices: "1", ec_transfer_config: {ec_connector: ECCPUConnector, ec_role: ec_consumer}}\n')
    rc, out, _ = run_cli(["graph", str(f), "--format", "mermaid"], capsys)
    assert rc == 0
    assert out == ("%% <linear chain> (vllm-omni runtime, base platform)\n"
                   "flowchart LR\n"
                   '  s0["stage 0: stage (encoder only)<br/>devices 0, TP 1<br/>EC ECCPUConnector ec_producer"]\n'
                   '  s1["stage 1: stage<br/>devices 1, TP 1<br/>EC ECCPUConnector ec_consumer<br/>outputs text"]\n'
                   '  s0 == "EC ECCPUConnector" ==> s1\n')


def test_graph_on_a_terminal_is_a_rich_tree(expanded_preset, monkeypatch, capsys):
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    buf = Tty()
    monkeypatch.setattr(sys, "stdout", buf)
    assert main(["graph", str(expanded_preset)]) == 0
    text = buf.getvalue()
    assert "\x1b[1m" in text  # bold stage titles: rich rendered it
    assert "├── " in text and "stage 0: thinker prefill" in text


def test_graph_quotes_are_escaped():
    from omni_pd.compile.graph import GraphStage, StageGraph, to_dot, to_mermaid

    s = GraphStage(0, 'a"b<c>', None, "0", 1, 1, 1, 1, None, None, None, ())
    g = StageGraph('p"q', "vllm", None, (s,), ())
    assert 's0 [label="stage 0: a\\"b<c>\\ndevices 0, TP 1"];' in to_dot(g)
    assert 's0["stage 0: a&quot;b&lt;c&gt;<br/>devices 0, TP 1"]' in to_mermaid(g)


# --- 7. pre-commit hook, run by pre-commit itself ----------------------------------------

def _precommit() -> list[str]:
    import importlib.util

    if importlib.util.find_spec("pre_commit") is None:
        pytest.skip("pre-commit (test extra) is not installed")
    return [sys.executable, "-m", "pre_commit"]


def _sample_repo(root: Path) -> Path:
    import subprocess

    repo = root / "sample"
    (repo / "deploy").mkdir(parents=True)
    (repo / "deploy" / "llm.yaml").write_text(CLEAN)
    (repo / "deploy" / "broken.yaml").write_text(BAD)
    (repo / "notes.yml").write_text("- not a deploy config\n")  # outside the hook's files:
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "sample"], check=True)
    return repo


def _hook_env(root: Path) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    return dict(os.environ, PRE_COMMIT_HOME=str(root / "pre-commit-home"),
                PATH=bindir + os.pathsep + os.environ.get("PATH", ""))


def test_precommit_runs_the_hook_definition(tmp_path):
    """pre-commit runs our .pre-commit-hooks.yaml entry (as a local hook, so no
    environment is built) on a sample repository: one process for every file, the
    commit fails on an error and passes once it is fixed."""
    import subprocess

    from ruamel.yaml import YAML

    cmd = _precommit()
    hooks = YAML(typ="safe", pure=True).load((ROOT / ".pre-commit-hooks.yaml").read_text())
    assert [h["id"] for h in hooks] == ["omni-pd-validate"]
    hook = dict(hooks[0], language="system", files="^deploy/")  # the installed omni-pd, scoped as documented
    repo = _sample_repo(tmp_path)
    import json

    (repo / ".pre-commit-config.yaml").write_text(json.dumps({"repos": [{"repo": "local", "hooks": [hook]}]}))
    env = _hook_env(tmp_path)
    run = [*cmd, "run", "--all-files", "--color", "never"]
    proc = subprocess.run(run, cwd=repo, capture_output=True, text=True, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "omni-pd validate" in proc.stdout and "Failed" in proc.stdout
    assert BAD_DIAG.format(name="deploy/broken.yaml") in proc.stdout
    assert "validate: 2 files, 1 ok, 1 failed (1 error, 0 warnings, 0 info)" in proc.stdout
    assert "notes.yml" not in proc.stdout
    (repo / "deploy" / "broken.yaml").write_text(BAD.replace("two", "2"))
    proc = subprocess.run(run, cwd=repo, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Passed" in proc.stdout


@pytest.mark.skipif(os.environ.get("OMNI_PD_PRECOMMIT_TRY_REPO") != "1",
                    reason="set OMNI_PD_PRECOMMIT_TRY_REPO=1 (pre-commit installs omni-pd from PyPI deps, ~1 min)")
def test_precommit_try_repo_installs_and_runs_the_hook(tmp_path):
    """`pre-commit try-repo` on this checkout: pre-commit builds the hook's own Python
    environment (pip install of the project, dependencies from PyPI) and runs it."""
    import subprocess

    cmd = _precommit()
    repo = _sample_repo(tmp_path)
    proc = subprocess.run([*cmd, "try-repo", str(ROOT), "omni-pd-validate", "--files", "deploy/llm.yaml",
                           "deploy/broken.yaml", "--color", "never"],
                          cwd=repo, capture_output=True, text=True, env=_hook_env(tmp_path), timeout=900)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert BAD_DIAG.format(name="deploy/broken.yaml") in proc.stdout
    assert "validate: 2 files, 1 ok, 1 failed (1 error, 0 warnings, 0 info)" in proc.stdout


# --- 8. shell completion (typer's own) and full summaries in --help ----------------------

def _omni_pd_exe() -> str:
    import shutil

    exe = shutil.which("omni-pd", path=str(Path(sys.executable).parent)) or shutil.which("omni-pd")
    if exe is None:
        pytest.skip("the omni-pd console script is not installed (pip install -e .)")
    return exe


def test_bash_completion_script_completes_commands_and_options(tmp_path):
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("no bash")
    exe = _omni_pd_exe()
    script = (f'source <("{exe}" --show-completion)\n'
              f'omni-pd() {{ "{exe}" "$@"; }}\n'  # the completion calls the program by its name
              "complete_at() { COMP_WORDS=(\"$@\"); COMP_CWORD=$(( $# - 1 )); _omni_pd_completion omni-pd; "
              'echo "${COMPREPLY[*]}"; }\n'
              "complete_at omni-pd va\n"
              "complete_at omni-pd expand --kv-b\n"
              "complete_at omni-pd graph --for\n")
    env = dict(os.environ, PATH=str(Path(exe).parent) + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["validate", "--kv-buffer-device", "--format"]


def test_install_completion_writes_the_bash_script(tmp_path):
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("no bash")
    exe = _omni_pd_exe()
    env = dict(os.environ, HOME=str(tmp_path))
    # two commands, so bash does not exec the last one: typer detects the shell from the parent process
    proc = subprocess.run(["bash", "-c", f'"{exe}" --install-completion; exit $?'],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "bash completion installed in" in proc.stdout
    installed = (tmp_path / ".bash_completions" / "omni-pd.sh").read_text()
    assert "_OMNI_PD_COMPLETE=complete_bash" in installed
    assert "source " in (tmp_path / ".bashrc").read_text()


def test_help_lists_full_command_summaries(capsys):
    import typer

    from omni_pd.cli import app

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    got: dict[str, str] = {}
    for line in out.split("Commands:\n", 1)[1].splitlines():  # click wraps at 78 columns
        if line.startswith("  ") and not line.startswith("   "):
            name, _, text = line.strip().partition(" ")
            got[name] = text.strip()
        elif line.strip():
            got[name] += ("" if got[name].endswith("-") else " ") + line.strip()
    want = {}
    for info in app.registered_commands:
        name = info.name or info.callback.__name__.removesuffix("_cmd")
        want[name] = " ".join(info.callback.__doc__.strip().split("\n\n")[0].split())
    assert got == want
    assert not any(v.endswith("...") for v in got.values())
    assert got["validate"] == "Check deploy configs for every PD invariant; exit 0 clean, 1 errors, 2 unreadable input."
    assert isinstance(app, typer.Typer)


# --- issue item 7: .ci/oracle_venv.sh reuses what is there and says what it does ----------

def test_oracle_venv_script_reuses_the_editable_install():
    import subprocess

    venv = ROOT / ".cache" / "oracle" / "venv030"
    if not (venv / ".oracle-base").is_file():
        pytest.skip("the oracle venv is not built here (bash .ci/oracle_venv.sh)")
    run = lambda: subprocess.run(["bash", str(ROOT / ".ci" / "oracle_venv.sh")],  # noqa: E731
                                 capture_output=True, text=True, cwd="/", timeout=1800)
    first = run()  # installs omni-pd only when the stamp is missing or pyproject.toml changed
    assert first.returncode == 0, first.stderr
    second = run()
    assert second.returncode == 0, second.stderr
    assert second.stdout == f"{venv}/bin/python\n"
    assert second.stderr == ("oracle venv: reusing .cache/oracle/venv030 "
                             "(omni-pd editable install of this checkout is up to date)\n")
    import hashlib

    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    assert (venv / ".omni-pd-editable").read_text() == f"{digest} {ROOT}\n"


# --- issue item 4: expand's output reads as if written by hand --------------------------

def test_flow_style_stage_labels_go_after_the_mapping(tmp_path, capsys):
    src = tmp_path / "flow.yaml"
    src.write_text("pipeline: qwen3_omni_moe\n"
                   "stages:\n"
                   '  - {stage_id: 0, devices: "0"}  # the thinker\n'
                   "  # the talker and code2wav share a device\n"
                   '  - {stage_id: 1, devices: "1", gpu_memory_utilization: 0.5}\n'
                   '  - {stage_id: 2, devices: "1", gpu_memory_utilization: 0.3}\n')
    rc, out, err = run_cli(["expand", "-q", str(src), "--connector", "NixlConnector"], capsys)
    assert rc == 0, err
    stages = out.split("stages:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split("}  # ", 1)[-1] if "}  # " in line else line for line in stages] == [
        "thinker prefill (KV producer), split from stage 0; the thinker",
        "thinker decode (KV consumer), split from stage 0",
        "  # the talker and code2wav share a device",
        "talker (was stage 1)",
        "code2wav (was stage 2)"]
    assert all(line.startswith("  - {stage_id: ") for line in stages if not line.lstrip().startswith("#"))
    from omni_pd.io import parse_text

    parse_text(out, "out.yaml")  # still valid YAML


def test_input_notes_are_marked_as_the_inputs(tmp_path, capsys):
    from omni_pd.compile.emit import INPUT_NOTES

    rc, out, _ = run_cli(["expand", "-q"], capsys)
    assert rc == 0
    lines = out.splitlines()
    assert lines[3] == f"# {INPUT_NOTES}"
    assert lines[4] == "# Qwen3-Omni-MoE (Qwen/Qwen3-Omni-30B-A3B-Instruct), three stages:"
    bare = tmp_path / "llm.yaml"  # no comment of its own: nothing to introduce
    bare.write_text("".join(l for l in CLEAN.splitlines(True) if not l.startswith("#")))
    rc, out, _ = run_cli(["expand", "-q", str(bare), "--pipeline", "llm"], capsys)
    assert rc == 0
    assert out.splitlines()[3] == "pipeline: llm_pd"


# --- omni-pd diff: what expand changed, stage by stage ------------------------------------

def test_diff_of_the_expanded_preset(expanded_preset, capsys):
    rc, out, err = run_cli(["diff", "presets/qwen3_omni_moe.yaml", str(expanded_preset)], capsys)
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    # the preset streams and keeps streaming under PD: no async_chunk change, no 0 -> 1 stage edge
    assert lines[:4] == ["--- presets/qwen3_omni_moe.yaml", f"+++ {expanded_preset}",
                         '+ pipeline: "qwen3_omni_moe_pd"', '+ edges: [{"from": 1, "to": 2}, {"from": 2, "to": 3}]']
    blocks = out.split("\nstage ")[1:]
    assert [b.splitlines()[0] for b in blocks] == [
        "0 thinker prefill (from input stage 0 thinker)", "1 thinker decode (from input stage 0 thinker)",
        "2 talker (from input stage 1 talker)", "3 code2wav (from input stage 2 code2wav)"]
    assert blocks[1].splitlines()[1:] == [
        '  + kv_transfer_config.kv_connector: "MooncakeConnector"',
        '  + kv_transfer_config.engine_id: "omni-thinker-decode"',
        '  + kv_transfer_config.kv_role: "kv_consumer"',
        '  + kv_transfer_config.kv_ip: "127.0.0.1"',
        '  ~ devices: "0" -> "1"']
    assert blocks[3].splitlines()[1:] == [
        '  ~ devices: "1" -> "2"',
        '  + input_connectors.from_stage_2: "connector_of_shared_memory"',
        '  - input_connectors.from_stage_1: "connector_of_shared_memory"']


def test_diff_json_and_stdin(expanded_preset, capsys):
    import json

    rc, out, _ = run_cli(["diff", "presets/qwen3_omni_moe.yaml", "-", "--format", "json"], capsys,
                         stdin=expanded_preset.read_bytes())
    assert rc == 0
    data = json.loads(out)
    assert [r.get("stage_id") for r in data] == [None, 0, 1, 2, 3]
    assert [r.get("from") for r in data[1:]] == [0, 0, 1, 2]
    assert {"kind": "~", "key": "devices", "before": "1", "after": "2"} in data[3]["changes"]


def test_diff_refuses_a_second_file_that_is_not_a_split(capsys):
    rc, out, err = run_cli(["diff", "presets/qwen3_omni_moe.yaml", "tests/fixtures/llm.yaml"], capsys)
    assert (rc, out) == (2, "")
    assert err.startswith("error[OPD008]: tests/fixtures/llm.yaml is not a prefill/decode split: it has no "
                          "prefill/decode pair with consecutive stage ids (not `omni-pd expand` output)\n")


def test_flatten_and_changes():
    from omni_pd.compile.diff import Change, changes, flatten

    assert flatten({"a": {"b": 1, "c": {}}, "d": [1]}) == {"a.b": 1, "a.c": {}, "d": [1]}
    assert changes({"x": 1, "y": 2, "z": None}, {"y": 3, "w": 4}) == (
        Change("~", "y", 2, 3), Change("+", "w", None, 4), Change("-", "x", 1, None))


def test_explain_says_which_runtime_a_rule_models_and_lists_its_examples(capsys):
    """`omni-pd explain` prints what Rule.explain() has: the Runtime line (OPD306 models
    vllm-omni's PD validator only) and the rule's further examples, one per line."""
    assert main(["explain", "OPD306"]) == 0
    out = capsys.readouterr().out
    assert out.split("\n\n")[2] == (
        "Runtime: vllm-omni only (`vllm serve --omni`; not checked for pipelines launched as plain "
        "`vllm serve` engines)")
    assert out.endswith(
        "More examples (each is a test):\n"
        "  passes: llm_pd under plain vllm serve: OPD603's table decides, not vllm-omni's validator\n"
        "  passes: thinker-only pipelines launch plain vllm serve engines too\n"
        "  fires: Qwen2.5-Omni PD under vllm-omni\n")
    assert main(["explain", "OPD304"]) == 0
    assert "Runtime:" not in capsys.readouterr().out  # a rule of both runtimes says none
