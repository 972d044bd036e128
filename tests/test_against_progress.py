"""``validate --against-vllm-omni`` says what it is doing (issue 24, item 11).

It took 23-31 s with no output: vLLM and vllm-omni are imported in another interpreter,
then vllm-omni's resolver and PD checks run. Now the oracle announces each step on stderr
when asked (``--progress``), ``against_vllm_omni`` passes them to a callback as they
arrive, and the CLI shows them in a rich status line on a terminal (nothing changes in a
pipe or a CI log). vllm-omni is not run here: a stand-in interpreter speaks the oracle's
protocol (its step words are the oracle's own ``STEP_WORDS``), and the real oracle's
``--progress`` is checked up to where it needs vllm-omni.
"""

from __future__ import annotations

import io
import json
import stat
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from omni_pd.cli import main
from omni_pd.cli_validate import _status
from omni_pd.upstream.against import STARTING, against_vllm_omni
from omni_pd.upstream.vllm_oracle import STEP_WORDS

PD = """\
pipeline: qwen3_omni_moe_pd
async_chunk: false
stages:
  - {stage_id: 0, devices: "0", env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "5600"},
     kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}}
  - {stage_id: 1, devices: "1", env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "5610"},
     kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}
"""

#: an interpreter that answers `-m omni_pd.upstream.vllm_oracle ... FILE [--progress]` as the
#: oracle does: steps on stderr (only with --progress), a header and one verdict on stdout
FAKE = '''\
#!{python}
import json, sys
from omni_pd.upstream.vllm_oracle import STEP_WORDS
args = sys.argv[1:]
talk = "--progress" in args
with open({log!r}, "a") as f:
    f.write(json.dumps(args) + "\\n")
def say(t):
    if talk:
        print("omni-pd-oracle: " + t, file=sys.stderr, flush=True)
say("importing vLLM and vllm-omni, loading their plugins (omni-pd's registers the *_pd pipelines)")
print("some vLLM log line on stderr", file=sys.stderr)
print(json.dumps({{"vllm_omni": "0.30.0", "standins": [], "pd_pipelines": [], "compat": []}}), flush=True)
say("vllm-omni 0.30.0 imported; checking " + (args[-2] if talk else args[-1]))
for step in ("load", "resolve", "pd-detect", "pd-validate"):
    say(STEP_WORDS[step])
print(json.dumps({{"file": args[-2] if talk else args[-1], "step": "done", "verdict": "valid",
                  "pipeline": "qwen3_omni_moe_pd", "deploy_stage_ids": [0, 1],
                  "stages": [[0, True, False, [], 1, "kv_producer", "NixlConnector"],
                             [1, False, True, [0], 1, "kv_consumer", "NixlConnector"]],
                  "pair": [0, 1], "detect_on_typed": [0, 1], "detect_raw": [0, 1]}}), flush=True)
'''


def _fake(tmp_path: Path) -> tuple[Path, Path]:
    py, log = tmp_path / "fake-python", tmp_path / "calls.jsonl"
    py.write_text(FAKE.format(python=sys.executable, log=str(log)))
    py.chmod(py.stat().st_mode | stat.S_IXUSR)
    return py, log


def test_progress_hears_every_step_in_order(tmp_path):
    py, log = _fake(tmp_path)
    f = tmp_path / "pd.yaml"
    f.write_text(PD)
    heard: list[str] = []
    [d] = against_vllm_omni(f, python=str(py), pipeline="qwen3_omni_moe_pd", progress=heard.append)
    assert heard == [
        STARTING.format(py=py),
        "importing vLLM and vllm-omni, loading their plugins (omni-pd's registers the *_pd pipelines)",
        f"vllm-omni 0.30.0 imported; checking {f}",
        STEP_WORDS["load"], STEP_WORDS["resolve"], STEP_WORDS["pd-detect"], STEP_WORDS["pd-validate"],
    ]
    assert d.code == "OPD950"
    assert d.message == ("vllm-omni 0.30.0 accepts the file: pipeline `qwen3_omni_moe_pd`, stages 0 prefill, "
                         "1 decode; PD pair 0 -> 1 passes its PD validation")
    assert json.loads(log.read_text().splitlines()[-1])[-1] == "--progress"


def test_without_a_listener_the_oracle_is_not_asked_to_talk(tmp_path):
    py, log = _fake(tmp_path)
    f = tmp_path / "pd.yaml"
    f.write_text(PD)
    [d] = against_vllm_omni(f, python=str(py), pipeline="qwen3_omni_moe_pd")
    assert d.code == "OPD950"
    assert "--progress" not in json.loads(log.read_text())


def test_the_real_oracle_announces_its_first_step_before_it_needs_vllm_omni(tmp_path):
    """Where vllm-omni is missing the oracle still said what it was doing first, then fails (exit 3)."""
    p = subprocess.run([sys.executable, "-m", "omni_pd.upstream.vllm_oracle", "--progress", str(tmp_path / "x.yaml")],
                       capture_output=True, text=True, timeout=300)
    first = p.stderr.splitlines()[0]
    assert first == ("omni-pd-oracle: importing vLLM and vllm-omni, loading their plugins "
                     "(omni-pd's registers the *_pd pipelines)")
    if p.returncode == 3:  # the dev venv: no vllm-omni
        assert "error" in json.loads(p.stdout.splitlines()[0])


def test_status_line_on_a_terminal_shows_title_and_step():
    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=200, color_system=None)
    with _status("pd.yaml: asking vllm-omni", console) as say:
        say(STEP_WORDS["resolve"])
    shown = buf.getvalue()  # the terminal stream: frames of the spinner line, then it is erased
    assert "pd.yaml: asking vllm-omni: resolving the pipeline (vllm_omni.config.resolver.resolve_omni_config)" in shown
    assert shown.endswith("\x1b[2K")  # transient: the line is cleared when the check is done


def test_off_a_terminal_nothing_is_printed(capsys):
    with _status("pd.yaml: asking vllm-omni") as say:
        assert say is None
    assert capsys.readouterr() == ("", "")


def test_validate_output_in_a_pipe_is_unchanged(tmp_path, capsys):
    py, _ = _fake(tmp_path)
    f = tmp_path / "pd.yaml"
    f.write_text(PD)
    rc = main(["validate", str(f), "--against-vllm-omni", "--vllm-omni-python", str(py)])
    out, err = capsys.readouterr()
    assert rc == 0
    assert "info[OPD950]: vllm-omni 0.30.0 accepts the file" in out
    assert "omni-pd-oracle" not in out + err and "asking vllm-omni" not in out + err
