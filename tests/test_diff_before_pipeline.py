"""``omni-pd diff`` on a BEFORE file without ``pipeline:`` (docs/diff.md: ``omni-pd expand
my_deploy.yaml --pipeline qwen3_omni_moe -o pd.yaml && omni-pd diff my_deploy.yaml pd.yaml``).

Found walking the README as a new user: BEFORE fell back to a linear chain, so every
source stage was titled ``stage N stage`` instead of its role. AFTER names the split
pipeline, whose ``base`` is the pipeline BEFORE runs; an explicit ``--pipeline`` or a
BEFORE that says (or whose file name says) which pipeline it is still decides.
"""

from __future__ import annotations

from tests.test_cli import ROOT, run_cli

STAGES = ("stage 0 thinker prefill (from input stage 0 thinker)\n",
          "stage 1 thinker decode (from input stage 0 thinker)\n",
          "stage 2 talker (from input stage 1 talker)\n",
          "stage 3 code2wav (from input stage 2 code2wav)\n")


def _split(tmp_path, capsys):
    (tmp_path / "my_deploy.yaml").write_text((ROOT / "presets" / "qwen3_omni_moe.yaml").read_text())
    rc, _, _ = run_cli(["expand", "my_deploy.yaml", "--pipeline", "qwen3_omni_moe", "-q", "-o", "pd.yaml"],
                       capsys, cwd=tmp_path)
    assert rc == 0


def test_before_without_pipeline_key_takes_the_pipeline_after_was_split_from(tmp_path, capsys):
    _split(tmp_path, capsys)
    rc, out, err = run_cli(["diff", "my_deploy.yaml", "pd.yaml"], capsys, cwd=tmp_path)
    assert (rc, err) == (0, "")
    assert [ln + "\n" for ln in out.splitlines() if ln.startswith("stage ")] == list(STAGES)
    assert "~ pipeline (resolved)" not in out  # `+ pipeline` already says it


def test_explicit_pipeline_still_decides(tmp_path, capsys):
    _split(tmp_path, capsys)
    rc, out, _ = run_cli(["diff", "my_deploy.yaml", "pd.yaml", "--pipeline", "qwen3_omni_moe"], capsys, cwd=tmp_path)
    assert rc == 0
    assert [ln + "\n" for ln in out.splitlines() if ln.startswith("stage ")] == list(STAGES)
    # a --pipeline other than AFTER's base is the one BEFORE is read with (the same name as
    # the base above could not tell the option from the fallback)
    rc, out, _ = run_cli(["diff", "my_deploy.yaml", "pd.yaml", "--pipeline", "llm"], capsys, cwd=tmp_path)
    assert rc == 0
    assert [ln for ln in out.splitlines() if ln.startswith("stage ")] == [
        "stage 0 thinker prefill (from input stage 0 llm)", "stage 1 thinker decode (from input stage 0 llm)",
        "stage 2 talker (new)", "stage 3 code2wav (new)"]
