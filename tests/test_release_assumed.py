"""A finding that depends on a release the user did not give says which release it assumed
(issue 35: "a finding that depends on a release the user did not give says which release it
assumed, and how to say another").

Every rule example judged for vLLM 0.30 (omni-pd's default target) whose finding names "vLLM
0.30" is run again without ``--vllm-version``: the same finding must then say "(assumed: no
--vllm-version given; pass --vllm-version X.Y)", and with the release given it must not.
"""

from __future__ import annotations

import pytest

from omni_pd.check.rules import registry
from omni_pd.check.validate import options_from_example, validate_text

ASSUMED = "(assumed: no --vllm-version given; pass --vllm-version X.Y)"


def _runs() -> list:
    out = []
    for code, r in sorted(registry().items()):
        runs = [("fails", r.fail, r.example_context)]
        runs += [(e.name, e.yaml, e.context or r.example_context) for e in r.examples]
        out += [pytest.param(code, text, ctx, id=f"{code} {name}") for name, text, ctx in runs
                if ctx and ctx.get("vllm_version") == "0.30"]
    return out


def _messages(code: str, text: str, ctx: dict) -> list[str]:
    return [d.message for d in validate_text(text, "pd.yaml", options_from_example(ctx)).diagnostics if d.code == code]


@pytest.mark.parametrize("code,text,ctx", _runs())
def test_a_release_dependent_finding_says_the_release_it_assumed(code, text, ctx):
    given = _messages(code, text, ctx)
    assumed = _messages(code, text, {k: v for k, v in ctx.items() if k != "vllm_version"})
    assert all(ASSUMED not in m for m in given)
    named = [m for m in given if "vLLM 0.30" in m]
    # the same findings (0.30 is the default), each that names the release now saying it was assumed
    assert len(assumed) == len(given)
    assert [m.replace(" " + ASSUMED, "") for m in assumed] == given
    assert sum(ASSUMED in m for m in assumed) >= len(named)


def test_the_sweep_covers_release_dependent_findings():
    """The parametrisation is not empty: enough 0.30 examples name their release to mean something."""
    named = sum(any("vLLM 0.30" in m for m in _messages(*p.values)) for p in _runs())
    assert named >= 20
