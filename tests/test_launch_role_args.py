"""``launch --prefill-engine-arg/--decode-engine-arg`` (issue 36 item 10): a `vllm serve` flag for
one side of the pair. vllm-omni's own PD recipe runs prefill and decode with different
``max_num_seqs`` (16 and 64); ``--engine-arg`` reaches every engine, these reach one role."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.diagnostics import OmniPdError
from omni_pd.io import parse_text
from omni_pd.launch.plan import LaunchOptions, plan_document
from omni_pd.resources import preset_path

ROOT = Path(__file__).resolve().parents[1]


def _doc(src: Path, **kw):
    res = expand_document(parse_text(src.read_text(), src.name), ExpandOptions(connector="NixlConnector"), **kw)
    return parse_text(res.text, "pd.yaml", own_output=True)


def test_each_side_gets_its_own_flags_after_the_shared_ones():
    doc = _doc(ROOT / "tests" / "fixtures" / "llm.yaml", pipeline="llm")
    opts = LaunchOptions(model="M", extra_args=("--seed=1",),
                         role_args=(("prefill", "--max-num-seqs=16"), ("decode", "--max-num-seqs=64"),
                                    ("decode", "--enforce-eager")))
    plan = plan_document(doc, "pd.yaml", opts).plan
    argv = {p.name: p.argv for p in plan.processes if p.role in ("prefill", "decode")}
    assert argv["prefill-0"][-2:] == ("--seed=1", "--max-num-seqs=16")
    assert argv["decode-0"][-3:] == ("--seed=1", "--max-num-seqs=64", "--enforce-eager")
    assert "--max-num-seqs=64" not in argv["prefill-0"] and "--max-num-seqs=16" not in argv["decode-0"]
    router = next(p for p in plan.processes if p.role == "router")
    assert not any("max-num-seqs" in a for a in router.argv)


def test_the_vllm_omni_runtime_refuses_them_and_says_where_the_setting_goes():
    src = preset_path("qwen3_omni_moe")
    doc = parse_text(expand_document(parse_text(src.read_text(), src.name), ExpandOptions()).text, "pd.yaml",
                     own_output=True)
    with pytest.raises(OmniPdError) as e:
        plan_document(doc, "pd.yaml", LaunchOptions(model="M", role_args=(("decode", "--max-num-seqs=64"),)))
    d = e.value.diagnostic
    assert d.code == "OPD006" and "one `vllm serve --omni` command line" in d.message
    assert "--prefill-set KEY=VALUE --decode-set KEY=VALUE" in d.help
