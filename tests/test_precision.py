"""Precision: `validate` over every correct config the project knows (issue 22).

A validator that users put in pre-commit and CI must be trusted on correct input first.
Each corpus below is a set of configs meant to be right; validate must report no error
and no warning on them, except the findings listed in :data:`ALLOWED`, each with the
reason the config's own runtime justifies it. The corpora:

* the 110 deploy configs vllm-omni==0.30.0 ships (``vllm_omni/deploy/*.yaml``, the wheel
  fetched with pip by the session fixture ``omni_wheel_deploy_dir`` in conftest.py),
  validated with ``--all-platforms`` next to their ``base_config`` files;
* every ``x-fix`` of every case (``../shared/cases/BR-*.yaml`` when present,
  ``tests/cases/TC-*.yaml``) in its case context (tests/test_cases.py's harness);
* every expand golden (``tests/golden/**/*.yaml``, :data:`NOT_CONFIGS` and Kubernetes
  manifests excepted), a two-host one with each inventory of :data:`INVENTORIES`;
* the outputs of the ``omni-pd expand`` examples of README.md and docs/*.md, validated as
  docs/validate.md validates ``pd.yaml`` (``--all-platforms``), with the example's ``--vllm-version``;
* the expand outputs of the property generator's configs (tests/test_properties.py
  ``cases``), a fixed number of examples.

A finding here is a false alarm until shown otherwise: fix the rule (with its own test),
or add a row to ALLOWED with the runtime fact that justifies it.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from omni_pd.check.validate import ValidateOptions, validate_document
from omni_pd.diagnostics import Severity
from omni_pd.io import load_file, parse_text

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"

#: (corpus, file or case id, code) -> why the config's own runtime justifies the finding.
#: The one table of findings allowed on correct configs.
ALLOWED: dict[tuple[str, str, str], str] = {
    ("wheel", "minicpmo_4_5_8x4090_stage1_replicas.yaml", "OPD404"):
        "vllm-omni labels it an experimental validation profile: its Stage 1 replica on GPU 5 (0.8) shares the "
        "GPU with the base file's Stage 2 (0.9); vLLM's start-up memory check refuses the second engine",
    ("wheel", "qwen3_tts_forced_aligner.yaml", "OPD007"):
        "not a deploy config: vllm-omni reads it with --forced-aligner-config (a warning that says so)",
    ("case", "BR-05", "OPD106"):
        "BR-05's x-fix keeps the case's global --tensor-parallel-size 4 (x-cli), which vllm-omni broadcasts to "
        "every stage; the fix is illustrative for DEV-MEM-SUM only",
    ("case", "BR-05", "OPD401"):
        "the same broadcast TP 4 against the Talker/Code2Wav single devices (the x-fix does not drop x-cli)",
    ("wheel", "ming_flash_omni.yaml", "OPD405"):
        "a true finding on the shipped file: vllm-omni#4653 reports this very layout (stage 0 on 0,1,2,3, stage 1 on 3) "
        "stuck in acquire_device_locks() for stage_init_timeout; vllm-omni 0.30.0 is assumed without the fix #7328",
    ("wheel", "step_audio_2.yaml", "OPD405"):
        "the #4653/#4894 shape (stage 0 on 0,1, stage 1 on 1): overlapping, unequal device sets wait on the init lock "
        "on vllm-omni without #7328 (0.30.0 assumed without it)",
    ("wheel", "step_audio_2_async_chunk.yaml", "OPD405"): "the same layout as step_audio_2.yaml",
    ("case", "BR-05", "OPD405"):
        "BR-05's x-fix is illustrative for DEV-MEM-SUM only; its Thinker on 0,1,2,3 and Talker/Code2Wav on 3 is the "
        "ming_flash_omni layout of vllm-omni#4653, a real init-lock wait before #7328",
    ("property", "*", "OPD404"):
        "the generator draws devices and gpu_memory_utilization without fitting them (its properties are about "
        "expand): stages sharing a GPU above 1.0 are refused by vLLM's start-up memory check",
    ("property", "*", "OPD111"):
        "the generator adds made-up engine keys (custom_knob, ...) to test that expand keeps them; vllm-omni 0.30 "
        "refuses a stage key it has no place for",
    ("property", "*", "OPD103"): "the same made-up keys where the target reports them as unknown keys",
    ("property", "*", "OPD401"):
        "the generator draws device lists longer than TP x DP for the Talker/Code2Wav (expand keeps them as written)",
}

#: golden files that are no deploy config meant to be right, with why
NOT_CONFIGS = {
    "render_scripts_two_hosts/placement.yaml": "the placement `omni-pd render` resolved (hosts and placement: an "
                                               "inventory): validates placement_llm_nixl_two_hosts.yaml below",
    "render_scripts_2p1d_two_hosts/placement.yaml": "the placement `omni-pd render` resolved for the 2P1D "
                                                    "scripts golden (an inventory, not a deploy config)",
    "render_scripts_tp_across_nodes/placement.yaml": "the placement `omni-pd render` resolved for the TP-across-"
                                                      "nodes scripts golden (an inventory, not a deploy config)",
    "migrate_seed_vs_expand.yaml": "a comparison fixture of `omni-pd migrate` (stage-key paths), not a deploy config",
    "migrate_seed_pd_recipe.yaml": "`omni-pd migrate` keeps the legacy seed recipe as written (Talker and Code2Wav "
                                   "on GPU 2 at vLLM's default 0.9 each): its findings are the recipe's",
}


def _inventories() -> dict[str, list[str]]:
    """Two-host goldens -> the inventories (YAML text) they are correct with: the one
    expand read (tests/test_placement.py), with the placement expand proposed where the
    inventory places nothing, and the placement render resolved from it."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_placement import OMNI_PROPOSED_PLACEMENT, OMNI_TWO_HOSTS, TWO_HOSTS
    from test_stage_edges import DECODE_ON_B

    return {
        "placement_llm_nixl_two_hosts.yaml": [
            TWO_HOSTS, (GOLDEN / "render_scripts_two_hosts" / "placement.yaml").read_text(encoding="utf-8")],
        "placement_qwen3_omni_mooncake_two_hosts.yaml": [OMNI_TWO_HOSTS + OMNI_PROPOSED_PLACEMENT],
        "placement_qwen3_omni_decode_on_b_nixl_edges.yaml": [DECODE_ON_B],
    }


#: golden -> inventories: correct only on the hosts they were expanded for (on one host
#: prefill and decode share devices)
INVENTORIES = _inventories()


def _inventory(text: str):
    from omni_pd.check.context import Inventory
    from omni_pd.compile.parse import to_plain

    return Inventory.from_dict(to_plain(parse_text(text, "hosts.yaml").tree))


def _kubernetes_manifest(path: Path) -> bool:
    """A file of Kubernetes objects (``render --target kubernetes``: top-level
    ``apiVersion`` and ``kind``, often several documents), not a deploy config; its own
    test is tests/test_render_kubernetes.py."""
    text = path.read_text(encoding="utf-8")
    return re.search(r"^apiVersion:", text, re.M) is not None and re.search(r"^kind:", text, re.M) is not None


def _bad(corpus: str, name: str, res) -> list[tuple[str, str, str]]:
    """Errors and warnings of ``res`` not in :data:`ALLOWED` for (corpus, name)."""
    out = []
    for d in res.diagnostics:
        if d.severity not in (Severity.ERROR, Severity.WARNING):
            continue
        if (corpus, name, d.code) in ALLOWED or (corpus, "*", d.code) in ALLOWED:
            continue
        out.append((d.code, d.severity.value, d.message))
    return out


# --- vllm-omni 0.30.0's shipped deploy configs ---------------------------------------------------

@pytest.mark.wheel
def test_every_shipped_vllm_omni_deploy_config_validates_clean(omni_wheel_deploy_dir: Path) -> None:
    files = sorted(omni_wheel_deploy_dir.glob("*.yaml"))
    assert len(files) == 110  # tests/test_wheel_configs.py WHEEL_DEPLOY_FILES
    bad = {p.name: b for p in files
           if (b := _bad("wheel", p.name, validate_document(load_file(p), ValidateOptions(all_platforms=True))))}
    assert bad == {}


# --- every x-fix of every case ----------------------------------------------------------------------

def _fix_runs() -> list:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_cases import CASES_DIR, OWN_CASES_DIR, _load

    paths = (sorted(CASES_DIR.glob("BR-*.yaml")) if CASES_DIR.is_dir() else []) + sorted(OWN_CASES_DIR.glob("TC-*.yaml"))
    return [pytest.param(p, id=p.stem) for p in paths if isinstance(_load(p).get("x-fix"), dict)]


@pytest.mark.parametrize("path", _fix_runs())
def test_every_case_fix_validates_clean(path: Path) -> None:
    from test_cases import _load, _merge_variant, _run_case

    tree = _load(path)
    res, _ = _run_case(_merge_variant(tree, tree["x-fix"]), path.name)
    assert _bad("case", str(tree.get("x-id", path.stem)), res) == []


# --- the expand goldens ------------------------------------------------------------------------------

def _goldens() -> list:
    return [pytest.param(p, id=str(p.relative_to(GOLDEN))) for p in sorted(GOLDEN.rglob("*.yaml"))
            if str(p.relative_to(GOLDEN)) not in NOT_CONFIGS and not _kubernetes_manifest(p)]


def test_the_golden_selection_keeps_the_deploy_configs() -> None:
    names = {str(p.values[0].relative_to(GOLDEN)) for p in _goldens()}
    assert set(INVENTORIES) <= names and "qwen3_omni_moe_pd.yaml" in names
    assert not any(n.startswith("render_k8s_") for n in names)
    assert len(list(GOLDEN.glob("render_k8s_*/*.yaml"))) >= 10


@pytest.mark.parametrize("path", _goldens())
def test_every_expand_golden_validates_clean(path: Path) -> None:
    name = str(path.relative_to(GOLDEN))
    for inv in INVENTORIES.get(name, [None]):
        opts = ValidateOptions(all_platforms=True, inventory=_inventory(inv) if inv else None)
        assert _bad("golden", name, validate_document(load_file(path), opts)) == []


# --- the expand examples of README.md and docs/*.md --------------------------------------------------------------------

#: README expand examples that demonstrate a refusal (the README prints the error after them)
REFUSED = {"tests/fixtures/llm.yaml --pipeline llm --connector MooncakeConnector --vllm-version 0.18 "
           "--prefill-tp 2 --decode-tp 1"}
#: README inputs that are the user's own file (nothing to expand here)
_USER_FILES = ("my_deploy.yaml", "qwen2_5_omni.yaml")


def readme_expand_args() -> list[list[str]]:
    """The arguments of every ``omni-pd expand`` line of the bash blocks of README.md and
    docs/*.md (continued lines joined, comments and pipes dropped, ``-o``/``-q`` removed),
    except the ones that read a user's file (:data:`_USER_FILES`)."""
    from docs_pages import fenced_blocks, page, page_names

    out: list[list[str]] = []
    for block in (b for name in page_names() for b in fenced_blocks(page(name), "bash")):
        for line in block.replace("\\\n", " ").splitlines():
            if "omni-pd expand" not in line:
                continue
            cmd = re.split(r"\s(?:\||&&)\s", line.split("omni-pd expand", 1)[1].split(" #")[0])[0]
            args = shlex.split(cmd)
            if any(u in args for u in _USER_FILES):
                continue
            clean: list[str] = []
            skip = False
            for a in args:
                if skip:
                    skip = False
                elif a in ("-o", "--output"):
                    skip = True
                elif a not in ("-q", "--quiet"):
                    clean.append(a)
            if clean not in out:
                out.append(clean)
    return out


def readme_files() -> dict[str, str]:
    """The example files of README.md and docs/*.md: each ```yaml block whose first line is
    ``# NAME.yaml`` (docs/launch.md's hosts.yaml)."""
    from docs_pages import fenced_blocks, page, page_names

    return {m.group(1): m.group(2) for name in page_names() for b in fenced_blocks(page(name), "yaml")
            if (m := re.match(r"# (\S+\.ya?ml)\n(.*)", b, re.S))}


def test_the_readme_expand_examples_are_read() -> None:
    args = readme_expand_args()
    assert [] in args and ["--tp", "2"] in args and len(args) >= 12, args


@pytest.mark.parametrize("args", readme_expand_args(), ids=lambda a: " ".join(a) or "preset")
def test_every_readme_expand_output_validates_clean(args: list[str], tmp_path: Path, monkeypatch) -> None:
    from omni_pd.cli import main

    monkeypatch.chdir(ROOT)
    inv = None
    if "--inventory" in args:  # the README's hosts.yaml, as the README validates with it
        i = args.index("--inventory") + 1
        path = tmp_path / args[i]
        path.write_text(readme_files()[args[i]], encoding="utf-8")
        args = [*args[:i], str(path), *args[i + 1:]]
        inv = _inventory(path.read_text(encoding="utf-8"))
    out = tmp_path / "pd.yaml"
    code = main(["expand", *args, "-q", "-o", str(out)])
    if " ".join(args) in REFUSED:  # the README shows the refusal (its next line is the error)
        assert code == 2 and not out.exists()
        return
    assert code in (0, None)
    version = args[args.index("--vllm-version") + 1] if "--vllm-version" in args else None
    res = validate_document(load_file(out), ValidateOptions(all_platforms=True, vllm_version=version, inventory=inv))
    assert _bad("readme", " ".join(args), res) == []


# --- the property generator's configs -----------------------------------------------------------------

@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
          phases=(Phase.explicit, Phase.generate))
@given(case=__import__("test_properties").cases())
def test_the_property_generators_expand_outputs_validate_clean(case) -> None:
    from omni_pd.diagnostics import OmniPdError
    from test_properties import expand

    try:
        res = expand(case)
    except OmniPdError:
        return  # expand refuses this input (its own finding): no output to validate
    doc = parse_text(res.text, "generated_pd.yaml")
    got = validate_document(doc, ValidateOptions(all_platforms=True, vllm_version=case.version))
    assert _bad("property", "*", got) == [], case
