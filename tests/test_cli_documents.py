"""The CLI keeps no documents between commands (issue 16: the ``_DOCS`` cache written by
``expand``/``graph``/``diff`` and read as a fallback line source by every later error in
the process). A diagnostic's source line comes from the documents its own command
loaded, passed explicitly, else from the file as it is on disk now."""

from __future__ import annotations

from pathlib import Path

import omni_pd.cli as cli
from omni_pd.cli import main

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"


def test_two_commands_in_one_process_do_not_see_each_others_documents(tmp_path, capsys):
    """``expand`` loads a.yaml; the file is rewritten with a YAML error on line 5; a later
    ``validate`` in the same process must show line 5 of the file as it is now, not of
    the document ``expand`` had loaded."""
    f = tmp_path / "a.yaml"
    f.write_text(LLM.read_text(), encoding="utf-8")
    assert main(["expand", str(f), "--pipeline", "llm", "-o", str(tmp_path / "pd.yaml")]) == 0
    assert LLM.read_text().splitlines()[4] == "    enforce_eager: true"  # what the stale document holds
    f.write_text("# rewritten\nstages:\n  - stage_id: 0\n    max_model_len: [1024\n    dtype: float32\n",
                 encoding="utf-8")
    capsys.readouterr()
    assert main(["validate", str(f)]) == 2
    err = capsys.readouterr().err
    assert err == ("error[OPD002]: invalid YAML: unclosed `[`: the flow list opened here is not closed "
                   "before the key `dtype` at line 5\n"
                   f" --> {f}:4:20\n"
                   "  |\n"
                   "4 |     max_model_len: [1024\n"
                   "  |                    ^ this `[` is never closed\n"
                   f"  = note: expected `,` or `]` before this: {f}:5:10\n"
                   "  = help: close it with `]` at the end of line 4, or write the list in block style\n")


def test_the_cli_module_holds_no_document_cache():
    assert not hasattr(cli, "_DOCS")


def test_diff_of_stdin_shows_the_stdin_documents_line(tmp_path, capsys, monkeypatch):
    """The one document not on disk: ``diff BEFORE -`` reads AFTER from stdin; its error
    is shown with stdin's own line, passed explicitly (there is no file to fall back to)."""
    import io
    import sys

    f = tmp_path / "a.yaml"
    f.write_text(LLM.read_text(), encoding="utf-8")
    stdin_text = "stages:\n  - stage_id: 0\n    max_model_len: 1024\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin_text.encode())))
    assert main(["diff", str(f), "-", "--pipeline", "llm"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error[OPD008]: <stdin> is not a prefill/decode split: ")
    assert " --> <stdin>:1:1\n  |\n1 | stages:\n" in err
