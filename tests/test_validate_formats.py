"""Linter conventions (issue 36 item 11): ``validate --format concise`` (one line per
finding, as ruff's concise output and yamllint's parsable), ``--format github`` (workflow
commands that annotate a CI log), and ``migrate`` exits 1 when what it wrote does not
validate."""

from __future__ import annotations

from pathlib import Path

from omni_pd.cli import main

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "tests" / "fixtures" / "legacy_seed_pd_recipe.yaml"
BAD = "stages:\n  - stage_id: 0\n    tensor_parallel_size: two\n"


def run(args: list[str], capsys) -> tuple[int, str, str]:
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


def test_concise_is_one_line_per_finding(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD)
    ok = tmp_path / "ok.yaml"
    ok.write_text((ROOT / "tests" / "fixtures" / "llm.yaml").read_text())
    rc, out, err = run(["validate", "--format", "concise", str(f), str(ok)], capsys)
    assert rc == 1
    assert out == f"{f}:3:27: error[OPD101] `tensor_parallel_size` must be an integer, found 'two'\n"
    assert err == ""


def test_github_annotates_the_ci_log(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text(BAD)
    rc, out, err = run(["validate", "--format", "github", str(f)], capsys)
    assert rc == 1
    assert out == (f"::error file={f},line=3,col=27,title=OPD101::`tensor_parallel_size` must be an integer, "
                   "found 'two'%0Ahelp: write an integer for `tensor_parallel_size`\n")


def test_github_escapes_and_maps_severities():
    from omni_pd.diagnostics import Diagnostic, Location, Severity, render_github

    diags = [Diagnostic(code="OPD403", severity=Severity.WARNING, message="50% shared, a:b",
                        location=Location(file="d,1:x.yaml", line=2, column=3)),
             Diagnostic(code="OPD901", severity=Severity.INFO, message="note", location=None)]
    assert render_github(diags) == ("::warning file=d%2C1%3Ax.yaml,line=2,col=3,title=OPD403::50%25 shared, a:b\n"
                                    "::notice title=OPD901::note\n")


def test_migrate_exits_1_when_what_it_wrote_does_not_validate(tmp_path, capsys):
    out = tmp_path / "migrated.yaml"
    rc, _, err = run(["migrate", str(SEED), "-q", "-o", str(out)], capsys)
    assert rc == 1
    assert out.exists()  # written, as the message says, for the user to fix
    assert f"{out}: validate finds 1 error, 1 warning (settings the input had):\n" in err
