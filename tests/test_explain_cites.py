"""Every repository path ``omni-pd explain CODE`` cites exists (issue 24, "also left": explain
cited a checklist file that is not in the repository; f04bbac replaced those citations with
upstream source paths, and tests/test_polish.py keeps private notes out).

tests/test_polish.py checks file names, but passes any token in a sentence that names an
upstream project, so a repository path beside one (``presets/targets/vllm_ascend.yaml``
in a vllm-ascend sentence) could point at nothing unnoticed. Here a token that starts with
one of this repository's top-level folders (or is README.md / pyproject.toml) must exist,
unless the words right before it attribute it to an upstream project ("vllm-omni
`docs/features/pd_disaggregation.md`"). Checked over the explain text of every code and
over the message, help and notes of every rule example's diagnostics (tests/golden/rules/examples.json).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from omni_pd.check.codes import explainable
from omni_pd.check.explain import explain_text

ROOT = Path(__file__).resolve().parents[1]
#: this repository's top-level folders a citation can start with
TOP = ("omni_pd", "presets", "docs", "tests", "schemas", "bench", ".ci")
_PATH = re.compile(r"(?<![\w/.-])((?:%s)/[\w./-]*[\w/]|README\.md|pyproject\.toml)" % "|".join(map(re.escape, TOP)))
#: the words right before a path that make it an upstream project's (its repository's layout)
_UPSTREAM_BEFORE = re.compile(r"(?:vLLM|vllm-omni|vllm-ascend|LMCache|Mooncake)(?:\s+[\d.]+\w*)?\s*`?\s*$")


def cited_repo_paths(text: str) -> list[str]:
    """Repository paths ``text`` cites, in order (a trailing ``.`` of the sentence dropped),
    without the ones attributed to an upstream project by the words just before them."""
    out = []
    for m in _PATH.finditer(text):
        if _UPSTREAM_BEFORE.search(text[max(0, m.start() - 40):m.start()]):
            continue
        out.append(m.group(1).rstrip("."))
    return out


def test_the_extractor_reads_repo_paths_and_leaves_upstream_ones() -> None:
    text = ("Facts: presets/targets/nixl_lease.yaml (and why). Sources: vllm-omni `docs/features/pd.md`; "
            "vllm-ascend 0.23.0.post1 docs/source/tutorials/features/\nx.md; vLLM docs/features/e.md, see "
            "docs/upstream/README.md. Not a path: omni_pdx/a.py, a/docs/b.md; README.md and pyproject.toml.")
    assert cited_repo_paths(text) == ["presets/targets/nixl_lease.yaml", "docs/upstream/README.md", "README.md",
                                      "pyproject.toml"]


def test_every_repo_path_explain_cites_exists() -> None:
    missing = {f"{code}: {p}" for code, entry in explainable().items()
               for p in cited_repo_paths(explain_text(entry)) if not (ROOT / p).exists()}
    assert missing == set()


def test_explain_cites_repo_paths_at_all() -> None:
    # the check above is not vacuous: explain cites the target data, modules, folders and docs
    cited = {p for entry in explainable().values() for p in cited_repo_paths(explain_text(entry))}
    assert {"presets/targets/nixl_lease.yaml", "presets/targets/vllm_omni_stage_keys.yaml", "omni_pd/cli_validate.py",
            "presets/pipelines/", "omni_pd/compile/ec_connectors/", "docs/migrate.md", "pyproject.toml"} <= cited


def test_every_repo_path_a_rule_example_diagnostic_cites_exists() -> None:
    golden = json.loads((ROOT / "tests" / "golden" / "rules" / "examples.json").read_text())
    missing = {f"{name}: {p}" for name, diags in golden.items() for d in diags
               for text in [d["message"], d.get("help") or "", *d.get("notes", [])]
               for p in cited_repo_paths(text) if not (ROOT / p).exists()}
    assert missing == set()
