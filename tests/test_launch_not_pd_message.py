"""``omni-pd launch`` on a three-stage file without ``pipeline:`` (OPD966) says the file names
no pipeline and how to expand it, instead of printing Python's ``None`` as a pipeline name.

Found walking the README as a new user (``launch my_deploy.yaml`` before ``expand``).
"""

from __future__ import annotations

from tests.test_cli import ROOT, run_cli


def test_not_pd_without_pipeline_key_says_so(tmp_path, capsys):
    (tmp_path / "my_deploy.yaml").write_text((ROOT / "presets" / "qwen3_omni_moe.yaml").read_text())
    rc, out, err = run_cli(["launch", "my_deploy.yaml", "--model", "M", "--dry-run"], capsys, cwd=tmp_path)
    assert rc == 2
    # validate's findings and verdict first, as `omni-pd validate` prints them (issue 24 item 3), on
    # stderr under --dry-run (stdout is for the plan), then the refusal
    assert out == ""
    assert err.startswith("info[OPD207]: no `pipeline:` key and none can be inferred")
    found, refusal = err.split("my_deploy.yaml: ok (0 errors, 0 warnings, 1 info)\n")
    head, help_ = refusal.splitlines()
    assert head == "error[OPD966]: my_deploy.yaml is not a PD config (it names no `pipeline:`)"
    assert help_.startswith("  = help: compile it first: `omni-pd expand ")
    assert help_.endswith("my_deploy.yaml --pipeline NAME -o pd.yaml` (NAME from `omni-pd pipelines`), "
                          "then launch pd.yaml")


def test_not_pd_with_a_pipeline_names_it(tmp_path, capsys):
    rc, _, err = run_cli(["launch", str(ROOT / "tests" / "fixtures" / "llm.yaml"), "--model", "M", "--dry-run"],
                         capsys, cwd=tmp_path)
    assert rc == 2
    assert err.startswith("error[OPD966]: ")
    assert "llm.yaml is not a PD config (pipeline `llm`)\n  = help: compile it first: `omni-pd expand " in err
