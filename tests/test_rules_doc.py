"""docs/rules.md is generated from the rule registry and codes.py (issue 24, "The README and
the test command"): regenerating it gives the committed file byte for byte, it holds every
code ``omni-pd rules`` prints with what ``omni-pd explain`` prints for it, and the generator
runs as the header says."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from omni_pd.check.codes import explainable
from omni_pd.check.explain import explain_text
from omni_pd.check.rules_doc import REGENERATE, anchor, main, markdown

ROOT = Path(__file__).resolve().parents[1]
RULES_MD = ROOT / "docs" / "rules.md"


def test_docs_rules_md_is_the_generated_text() -> None:
    assert RULES_MD.read_text(encoding="utf-8") == markdown(), f"docs/rules.md drifted: regenerate with `{REGENERATE}`"


def test_every_code_has_a_row_and_a_section_with_its_explain_text() -> None:
    text = RULES_MD.read_text(encoding="utf-8")
    entries = explainable()
    rows = re.findall(r"^\| \[(OPD\d{3})\]\(#([a-z0-9-]+)\) \| ([a-z0-9-]+) \| (error|warning|info) \|", text, re.M)
    assert [r[0] for r in rows] == list(entries)
    heads = re.findall(r"^## (OPD\d{3}) ([a-z0-9-]+)$", text, re.M)
    assert heads == [(c, e.name) for c, e in entries.items()]
    for code, link, name, severity in rows:
        e = entries[code]
        assert (name, severity, link) == (e.name, e.severity.value, anchor(e))
    # the section carries explain's paragraphs: summary and the first line of the doc, as explain prints them
    sec = text.split("## OPD304 pd-connector-mismatch\n", 1)[1].split("\n## ", 1)[0]
    plain = explain_text(entries["OPD304"])
    assert "prefill and decode use different (or no) KV connectors" in sec and plain.splitlines()[2] in sec
    assert "`kv_connector` must be set and equal on both sides: a NIXL producer and a" in sec
    assert "Fails:\n\n```yaml\npipeline: qwen3_omni_moe_pd\n" in sec and "Passes:\n\n```yaml\n" in sec
    launch = text.split("## OPD966 not-pd\n", 1)[1].split("\n## ", 1)[0]
    assert "Emitted by: omni_pd/launch/plan.py plan_document()" in launch and "Exit status: 2" in launch


def test_anchor_is_githubs_heading_slug() -> None:
    entries = explainable()
    assert anchor(entries["OPD304"]) == "opd304-pd-connector-mismatch"
    assert anchor(entries["OPD000"]) == "opd000-internal-error"


def test_prose_escapes_double_underscores_outside_code_only() -> None:
    text = markdown()
    assert "omni_pd/check/rules/\\_\\_init\\_\\_.py run_rules()" in text  # would render "init" bold
    assert "`NixlConnector.__init__`" in text  # code spans stay as they are


def test_generator_writes_the_file_named_by_dash_o(tmp_path) -> None:
    out = tmp_path / "rules.md"
    assert main(["-o", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == markdown()
    proc = subprocess.run([sys.executable, "-m", "omni_pd.check.rules_doc"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and proc.stdout == markdown()
    assert main(["-o", str(tmp_path / "missing" / "rules.md")]) == 2
