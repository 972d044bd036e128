"""Carets and device labels (issue 24, item 10).

* ``devices: "2,3,4,5"`` was underlined ``^^``: the caret stopped at the first ``,``
  inside the quotes. A quoted scalar is now underlined whole, quotes included (as
  ``"4"`` always was), and a block-context plain ``2,3`` likewise.
* A memory finding (OPD404) named ``physical GPU 4 ... TP rank 0`` for entry 4 of a TP 2
  stage on ``"2,3,4,5"``: vLLM's workers use the first TP x PP x DP entries only.
* Under ``CUDA_VISIBLE_DEVICES=4,5`` logical device 4 was read as physical GPU 4.
"""

from __future__ import annotations

import os
from pathlib import Path

from omni_pd.cli import main
from omni_pd.diagnostics import Diagnostic, Location, Severity, render_text


def _validate(tmp_path: Path, capsys, text: str, *args: str) -> tuple[int, str]:
    (tmp_path / "d.yaml").write_text(text)
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc = main(["validate", *args, "d.yaml"])
    finally:
        os.chdir(old)
    return rc, capsys.readouterr().out


def _block(out: str, code: str) -> list[str]:
    """The rendered lines of the first ``code`` finding, up to its blank line."""
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if f"[{code}]" in ln)
    end = next((i for i in range(start, len(lines)) if not lines[i] or lines[i].startswith("d.yaml:")), len(lines))
    return lines[start:end]


# --- carets ---------------------------------------------------------------------------------------

def test_a_quoted_device_list_is_underlined_whole(tmp_path, capsys) -> None:
    text = "stages:\n  - stage_id: 0\n    devices: \"2,3,4,5\"\n    tensor_parallel_size: 2\n"
    rc, out = _validate(tmp_path, capsys, text, "--pipeline", "llm")
    assert rc == 1
    assert _block(out, "OPD401") == [
        "error[OPD401]: stage 0: tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 1 = 2 "
        "devices, but devices has 4 entries",
        " --> d.yaml:3:14",
        "  |",
        "3 |     devices: \"2,3,4,5\"",
        "  |              ^^^^^^^^^",
        "  = help: list 2 devices here, e.g. devices: \"0,1\"",
    ]


def _caret(src: str, col: int) -> str:
    d = Diagnostic(code="OPD000", severity=Severity.ERROR, message="m", location=Location(file="f", line=1, column=col))
    return render_text([d], lambda f, n: src).splitlines()[4]


def test_caret_spans_of_quoted_plain_and_flow_scalars() -> None:
    # single quotes with the '' escape, double quotes with \" and a space inside
    assert _caret("devices: 'a''b,c'  # x", 10) == "  |          ^^^^^^^^"
    assert _caret('name: "a \\" b"', 7) == "  |       ^^^^^^^^"
    # block context: a plain 2,3 is one scalar; inside a flow mapping the comma ends it
    assert _caret("devices: 2,3", 10) == "  |          ^^^"
    assert _caret("- {stage_id: 0, devices: 2}", 14) == "  |              ^"
    assert _caret("- {stage_id: 0, devices: \"0,1\"}", 26) == "  |                          ^^^^^"
    # a key is still underlined up to its colon
    assert _caret("    devices: \"0\"", 5) == "  |     ^^^^^^^"
