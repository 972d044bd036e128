"""``validate --fix``/``--diff`` (issue 36 item 11): the edits findings carry and their application.

Only findings whose help names one certain replacement carry an edit: a misspelt stage or
top-level key whose meant key is not set (OPD103/OPD105 family of omni_pd/check/rules/schema.py),
reversed ``kv_role``s (OPD302); applying them clears those findings and leaves every other
byte of the file (comments, quotes, order) as it was.
"""

from __future__ import annotations

from omni_pd.check.fix import apply_edits, edits_of, unified_diff
from omni_pd.check.validate import validate_text
from omni_pd.diagnostics import Edit

PD = """\
# my PD pair (comment kept)
pipeline: llm_pd
async_chunk: false
stages:
  - stage_id: 0  # prefill
    max_model_len: 1024
    dtype: float32
    devices: "0"
    env: {VLLM_NIXL_SIDE_CHANNEL_HOST: "127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT: "5600"}
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_producer
      engine_id: llm-prefill
  - stage_id: 1  # decode
    max_model_len: 1024
    dtype: float32
    devices: "1"
    env: {VLLM_NIXL_SIDE_CHANNEL_HOST: "127.0.0.1", VLLM_NIXL_SIDE_CHANNEL_PORT: "5601"}
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_consumer
      engine_id: llm-decode
edges:
  - {from: 0, to: 1}
"""


def findings(text: str) -> list:
    return validate_text(text, "pd.yaml").diagnostics


def codes(text: str) -> list[str]:
    return sorted(d.code for d in findings(text) if d.severity.value == "error")


def test_the_clean_file_has_no_errors_and_no_edits():
    assert codes(PD) == []
    assert edits_of(findings(PD)) == []


def test_reversed_roles_and_a_stage_key_typo_are_fixed_and_nothing_else_moves():
    broken = (PD.replace("kv_role: kv_producer", "kv_role: KV_A").replace("kv_role: kv_consumer", "kv_role: kv_producer")
              .replace("kv_role: KV_A", "kv_role: kv_consumer").replace("    max_model_len: 1024\n    dtype: float32\n"
                                                                        "    devices: \"1\"",
                                                                        "    max_model_len: 1024\n    dtyp: float32\n"
                                                                        "    devices: \"1\"", 1))
    assert broken.count("dtyp:") == 1 and codes(broken)
    edits = edits_of(findings(broken))
    assert [e.describe() for e in edits] == [
        "12:16: `kv_consumer` -> `kv_producer`", "16:5: `dtyp` -> `dtype`", "21:16: `kv_producer` -> `kv_consumer`"]
    res = apply_edits(broken, edits)
    assert res.text == PD and res.skipped == ()
    assert codes(res.text) == []
    assert unified_diff("pd.yaml", broken, res.text).splitlines()[:3] == ["--- a/pd.yaml", "+++ b/pd.yaml", "@@ -9,16 +9,16 @@"]


def test_a_top_level_typo_is_renamed_but_not_when_the_meant_key_is_set():
    typo = PD.replace("async_chunk: false", "async_chnk: false")
    [e] = edits_of(findings(typo))
    assert (e.line, e.column, e.old, e.new) == (3, 1, "async_chnk", "async_chunk")
    assert apply_edits(typo, [e]).text == PD
    both = PD.replace("async_chunk: false", "async_chunk: false\nasync_chnk: false")
    assert [d.code for d in findings(both) if d.message.startswith("unknown top-level key")]
    assert edits_of(findings(both)) == []  # renaming would make a duplicate key: left for the user


def test_an_edit_whose_text_moved_is_skipped_with_the_reason():
    res = apply_edits(PD, [Edit(12, 16, "kv_consumer", "kv_producer"), Edit(99, 1, "a", "b")])
    assert res.text == PD and res.applied == ()
    assert [why for _e, why in res.skipped] == ["`kv_consumer` is not at 12:16", "line 99 is not in the file"]


def test_quoted_values_keep_their_quotes_and_overlaps_are_refused():
    text = 'a: "kv_consumer"\n'
    res = apply_edits(text, [Edit(1, 4, "kv_consumer", "kv_producer"), Edit(1, 5, "kv_consumer", "z")])
    assert res.text == 'a: "kv_producer"\n'
    assert [why for _e, why in res.skipped] == ["overlaps another fix"]
    assert apply_edits("k: vv\r\n", [Edit(1, 4, "vv", "w")]).text == "k: w\r\n"


# --- the command line: validate --fix / --diff --------------------------------------------------

import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

OMNI_PD = Path(sys.executable).with_name("omni-pd")
BROKEN = PD.replace("    dtype: float32\n    devices: \"1\"", "    dtyp: float32\n    devices: \"1\"", 1).replace(
    "async_chunk: false", "async_chnk: false")


def omni_pd(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(OMNI_PD), *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"NO_COLOR": "1", "COLUMNS": "100", "PATH": "/usr/bin:/bin"})


def test_diff_prints_the_fixes_writes_nothing_and_exits_1(tmp_path):
    (tmp_path / "pd.yaml").write_text(BROKEN)
    p = omni_pd("validate", "pd.yaml", "--diff", cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    assert p.stdout == ("--- a/pd.yaml\n+++ b/pd.yaml\n@@ -1,6 +1,6 @@\n # my PD pair (comment kept)\n"
                        " pipeline: llm_pd\n-async_chnk: false\n+async_chunk: false\n stages:\n"
                        "   - stage_id: 0  # prefill\n     max_model_len: 1024\n@@ -13,7 +13,7 @@\n"
                        "       engine_id: llm-prefill\n   - stage_id: 1  # decode\n     max_model_len: 1024\n"
                        "-    dtyp: float32\n+    dtype: float32\n     devices: \"1\"\n"
                        "     env: {VLLM_NIXL_SIDE_CHANNEL_HOST: \"127.0.0.1\", VLLM_NIXL_SIDE_CHANNEL_PORT: \"5601\"}\n"
                        "     kv_transfer_config:\n")
    assert (tmp_path / "pd.yaml").read_text() == BROKEN
    (tmp_path / "ok.yaml").write_text(PD)
    assert omni_pd("validate", "ok.yaml", "--diff", cwd=tmp_path).returncode == 0


def test_fix_rewrites_the_file_and_reports_what_is_left(tmp_path):
    (tmp_path / "pd.yaml").write_text(BROKEN)
    p = omni_pd("validate", "pd.yaml", "--fix", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "pd.yaml").read_text() == PD
    assert p.stderr == "pd.yaml: fixed 2 findings (3:1: `async_chnk` -> `async_chunk`, 16:5: `dtyp` -> `dtype`)\n"
    assert p.stdout == "pd.yaml: ok (0 errors, 0 warnings, 0 info)\n"


def test_fix_refuses_stdin_and_the_two_together(tmp_path):
    (tmp_path / "pd.yaml").write_text(BROKEN)
    assert omni_pd("validate", "-", "--fix", cwd=tmp_path).returncode == 2
    assert omni_pd("validate", "pd.yaml", "--fix", "--diff", cwd=tmp_path).returncode == 2
    assert (tmp_path / "pd.yaml").read_text() == BROKEN
