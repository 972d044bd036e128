"""``omni-pd pipelines`` and ``launch --dry-run`` say the same about how launch serves a
pipeline (issue 24, "one truth, shown in both"). Before: ``pipelines`` listed
``qwen3_omni_moe_thinker_only_pd`` under runtime ``vllm-omni`` only, while launch runs it
as plain ``vllm serve`` engines behind omni-pd's router (``launch_runtime: vllm``,
presets/pipelines/qwen3_omni_moe_thinker_only.yaml). Both now read
``Pipeline.launch_form`` (omni_pd/compile/pipelines.py)."""

from __future__ import annotations

import re

import pytest

from omni_pd.cli import main
from omni_pd.compile.pipelines import load_catalogue


def _listing(capsys) -> dict[str, tuple[str, ...]]:
    assert main(["pipelines"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert re.split(r"  +", lines[0]) == ["pipeline", "runtime", "launch", "stages"]
    return {cells[0]: tuple(cells) for cells in (tuple(re.split(r"  +", ln)) for ln in lines[1:])}


@pytest.mark.parametrize("base,pipeline,row,header", [
    ("qwen3_omni_moe_thinker_only", "qwen3_omni_moe_thinker_only_pd",
     ("qwen3_omni_moe_thinker_only_pd", "vllm-omni", "vllm serve per engine + router",
      "0:thinker/prefill -> 1:thinker/decode"),
     "# launch plan: qwen3_omni_moe_thinker_only_pd (vllm serve per engine + router), MooncakeConnector, "
     "entrypoint http://127.0.0.1:8000"),
    ("qwen3_omni_moe", "qwen3_omni_moe_pd",
     ("qwen3_omni_moe_pd", "vllm-omni", "vllm serve --omni",
      "0:thinker/prefill -> 1:thinker/decode -> 2:talker -> 3:code2wav"),
     "# launch plan: qwen3_omni_moe_pd (vllm serve --omni), MooncakeConnector, entrypoint http://127.0.0.1:8000"),
])
def test_the_listing_row_and_the_dry_run_header_agree(tmp_path, capsys, base, pipeline, row, header):
    assert _listing(capsys)[pipeline] == row
    out = tmp_path / "pd.yaml"
    assert main(["expand", "--pipeline", base, "-q", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["launch", str(out), "--model", "m", "--dry-run", "--vllm", "/nonexistent/vllm"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == header
    assert f"({row[2]})" in first


def test_qwen2_5_thinker_only_pd_is_listed_as_launch_serves_it_and_unsplit_pipelines_have_no_launch(capsys):
    rows = _listing(capsys)
    assert rows["qwen2_5_omni_thinker_only_pd"][1:3] == ("vllm-omni", "vllm serve per engine + router")
    assert rows["qwen3_omni_moe_thinker_only"][1:3] == ("vllm-omni", "-")  # launch wants it expanded first
    assert rows["llm"][1:3] == ("vllm", "-")
    cat = load_catalogue()
    assert {n: cat.get(n).launch_form for n in ("llm_pd", "qwen2_5_omni_pd", "llm")} == {
        "llm_pd": "vllm serve per engine + router", "qwen2_5_omni_pd": "vllm serve --omni", "llm": None}
