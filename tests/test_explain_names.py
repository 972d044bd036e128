"""``explain`` takes what ``rules`` prints, guesses only near misses, and ``-o`` names its
path (issue 24, "conventions").

``omni-pd rules`` prints ``OPD302  error  pd-kv-role ...``; ``explain pd-kv-role`` was
"unknown code" with a guess. Now a rule name (any case, ``_`` for ``-``) is explained like
its code, "did you mean" appears only for a near code or name, and ``schema -o`` /
``graph -o`` say which file they wrote; a path they cannot write is named in the error.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_pd.check.codes import explainable, lookup
from omni_pd.check.explain import explain_text, resolve
from omni_pd.cli import main
from omni_pd.resources import SCHEMA_FILENAME

ROOT = Path(__file__).resolve().parents[1]


def test_every_name_rules_prints_is_explained_as_its_code():
    entries = explainable()
    for code, e in entries.items():
        assert resolve(e.name, entries) == (e, None), code
        assert resolve(e.name.upper().replace("-", "_"), entries) == (e, None), code


def test_explain_by_name_prints_the_codes_text(capsys):
    assert main(["explain", "pd-kv-role"]) == 0
    by_name = capsys.readouterr().out
    assert by_name == explain_text(lookup("OPD302"))
    assert by_name.startswith("OPD302 pd-kv-role (error, pd_pair)\n")


@pytest.mark.parametrize("word, help", [
    ("OPD3O2", "did you mean OPD302 (pd-kv-role)? `omni-pd rules` lists them"),  # a letter O for a zero
    ("OPD320", "did you mean OPD302 (pd-kv-role)? `omni-pd rules` lists them"),  # two digits swapped
    ("pd-kv-rol", "did you mean OPD302 (pd-kv-role)? `omni-pd rules` lists them"),
    ("OPD999", "`omni-pd rules` lists them"),  # no code near: no guess
    ("OPD30", "`omni-pd rules` lists them"),  # nine codes one digit away: no guess
    ("hello", "`omni-pd rules` lists them"),
])
def test_unknown_word_guesses_only_a_near_code_or_name(capsys, word, help):
    assert main(["explain", word]) == 2
    assert capsys.readouterr().err == f"error[OPD006]: unknown code or rule name `{word}`\n  = help: {help}\n"


def test_schema_o_names_the_file_it_wrote(tmp_path, capsys):
    assert main(["schema", "-o", str(tmp_path)]) == 0
    assert capsys.readouterr().err == f"wrote {tmp_path / SCHEMA_FILENAME}\n"
    assert (tmp_path / SCHEMA_FILENAME).read_text().startswith("{")
    assert main(["schema", "-o", str(tmp_path / "s.json")]) == 0
    assert capsys.readouterr().err == f"wrote {tmp_path / 's.json'}\n"


def test_schema_o_names_the_path_it_could_not_write(tmp_path, capsys):
    target = tmp_path / "missing" / "s.json"
    assert main(["schema", "-o", str(target)]) == 2
    assert capsys.readouterr().err == (
        f"error[OPD005]: cannot write output: {target}: No such file or directory\n"
        f" --> {target}\n"
        f"  = help: the folder {target.parent} does not exist: create it first, or write somewhere else with -o\n")
    assert not (tmp_path / "missing").exists()


def test_graph_o_names_the_file_it_wrote(tmp_path, capsys):
    out = tmp_path / "g.txt"
    assert main(["graph", str(ROOT / "tests" / "golden" / "qwen3_omni_moe_pd.yaml"), "-o", str(out)]) == 0
    assert capsys.readouterr().err == f"wrote {out}\n"
    assert "prefill" in out.read_text()
