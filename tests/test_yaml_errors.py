"""YAML syntax errors in the diagnostic format (issue 24, "conventions").

ruamel.yaml's own words (``expected ',' or '}', but got '-'``, ``expected <block end>, but
found '?'``) name where its parser gave up, often a line after the mistake. Each broken
file here gets the exact OPD002 diagnostic ``validate`` prints: an unclosed ``{``/``[`` or
quote is shown at the line that opened it, with where parsing stopped as a note; bad
indentation names the keys that do not line up.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omni_pd.cli import main
from omni_pd.diagnostics import OmniPdError
from omni_pd.io import parse_text

CASES = {
    "unclosed_brace": ('pipeline: llm\nstages:\n  - {stage_id: 0, devices: "0"\n  - stage_id: 1\n', """\
error[OPD002]: invalid YAML: unclosed `{`: the flow mapping opened here is not closed before a list item `- ` at line 4
 --> f.yaml:3:5
  |
3 |   - {stage_id: 0, devices: "0"
  |     ^ this `{` is never closed
  = note: expected `,` or `}` before this: f.yaml:4:3
  = help: close it with `}` at the end of line 3, or write the mapping in block style
"""),
    "unclosed_bracket_at_eof": ("pipeline: llm\nstages: [\n  {stage_id: 0}\n", """\
error[OPD002]: invalid YAML: unclosed `[`: the flow list opened here is not closed before the end of the file at line 4
 --> f.yaml:2:9
  |
2 | stages: [
  |         ^ this `[` is never closed
  = note: expected `,` or `]` before this: f.yaml:4:1
  = help: close it with `]` at the end of line 3, or write the list in block style
"""),
    "unclosed_nested_brace": ('stages:\n  - stage_id: 0\n    env: {A: "1", B: "2"\n    devices: "0"\n', """\
error[OPD002]: invalid YAML: unclosed `{`: the flow mapping opened here is not closed before `devices` at line 4
 --> f.yaml:3:10
  |
3 |     env: {A: "1", B: "2"
  |          ^ this `{` is never closed
  = note: expected `,` or `}` before this: f.yaml:4:5
  = help: close it with `}` at the end of line 3, or write the mapping in block style
"""),
    "wrong_closer": ("stages:\n  - {stage_id: 0]\n", """\
error[OPD002]: invalid YAML: `]` cannot close the `{` opened at line 2, column 5
 --> f.yaml:2:17
  |
2 |   - {stage_id: 0]
  |                 ^ expected `,` or `}`
  = note: the flow mapping opened here: f.yaml:2:5
  = help: write `}` to close the mapping, or `[` where this one should open
"""),
    "unclosed_quote": ('pipeline: "llm\nstages:\n  - stage_id: 0\n', """\
error[OPD002]: invalid YAML: unclosed `"`: the quoted string opened here is never closed
 --> f.yaml:1:11
  |
1 | pipeline: "llm
  |           ^^^^ this quote is never closed
  = note: the end of the file is reached inside the string: f.yaml:4:1
  = help: add the closing `"` on line 1
"""),
    "key_outside_its_list_item": ('stages:\n  - stage_id: 0\n  devices: "0"\n', """\
error[OPD002]: invalid YAML: bad indentation: `devices` (column 3) is inside the list that starts at line 2 but is not an item of it
 --> f.yaml:3:3
  |
3 |   devices: "0"
  |   ^^^^^^^ neither a `- ` item nor a key of one
  = note: the list starts here: f.yaml:2:3
  = help: indent it to column 5 to make it a key of the item above, or start a new item with `- `
"""),
    "key_indented_too_far": ('pipeline: llm\nstages:\n  - stage_id: 0\n     devices: "0"\n', """\
error[OPD002]: invalid YAML: bad indentation: `devices` (column 6) is deeper than `stage_id` (line 3, column 5), so YAML reads it as more of line 3's value
 --> f.yaml:4:6
  |
4 |      devices: "0"
  |      ^^^^^^^ indented too far
  = note: `stage_id` is here: f.yaml:3:5
  = help: line `devices` up with `stage_id` at column 5
"""),
    "colon_in_plain_value": ("stages: []\nmodel: Qwen: Omni\n", """\
error[OPD002]: invalid YAML: a plain value cannot contain `: `
 --> f.yaml:2:12
  |
2 | model: Qwen: Omni
  |            ^ second `: ` on this line
  = help: quote the value: `model: "Qwen: Omni"`
"""),
    "tab_indent": ("pipeline: llm\n\tstages: []\n", """\
error[OPD002]: invalid YAML: a tab character: YAML indents with spaces only
 --> f.yaml:2:1
  |
2 | \\tstages: []
  | ^^^^^^^^ tab
  = help: replace the tab with spaces
"""),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_validate_prints_the_exact_diagnostic(tmp_path: Path, capsys, name: str):
    text, expected = CASES[name]
    (tmp_path / "f.yaml").write_text(text)
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc = main(["validate", "f.yaml"])
    finally:
        os.chdir(old)
    out = capsys.readouterr()
    assert rc == 2
    assert out.out == ""
    assert out.err == expected
    assert "expected <block end>" not in out.err and "but got" not in out.err


@pytest.mark.parametrize("name", sorted(CASES))
def test_both_loaders_give_the_same_diagnostic(name: str):
    """``comments=False`` (validate's fast path) and the round-trip loader (expand) agree."""
    text, _ = CASES[name]
    got = []
    for comments in (True, False):
        with pytest.raises(OmniPdError) as e:
            parse_text(text, "f.yaml", comments=comments)
        got.append((e.value.exit_code, e.value.diagnostic))
    assert got[0] == got[1]
    assert got[0][1].code == "OPD002"


def test_an_unrecognised_syntax_error_keeps_ruamels_words_and_both_marks():
    """A shape the translator does not know (an alias without a name) still reads as a
    located OPD002 in the parser's words, with where the construct began as a note."""
    with pytest.raises(OmniPdError) as e:
        parse_text("stages: []\nx: *\n", "f.yaml")
    d = e.value.diagnostic
    assert d.code == "OPD002" and d.message.startswith("invalid YAML: ")
    assert d.message == "invalid YAML: expected alphabetic or numeric character, but found '\\n'"
    assert (d.location.line, d.location.column) == (2, 5)
    assert [(r.line, r.column, r.label) for r in d.related] == [(2, 4, "while scanning an alias")]
