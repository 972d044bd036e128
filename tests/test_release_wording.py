"""Messages name the release whose behaviour they state (issue 24, "also left": with
``--vllm-version 0.24`` messages said "vllm-omni 0.24" for what vLLM 0.24 does, and a vLLM
minor with no vllm-omni release, 0.25, was printed as "vllm-omni 0.25").

``--vllm-version`` is vLLM's minor; a vllm-omni fact is named by
``versions.runtime_release`` (the vllm-omni release running on it), a fact of vLLM's own
code (its MooncakeConnector reading ``VLLM_MOONCAKE_BOOTSTRAP_PORT``) by vLLM's version.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.compile.targets import target
from omni_pd.compile.versions import bootstrap_reader

ROOT = Path(__file__).resolve().parents[1]
LEGACY = ROOT / "tests" / "fixtures" / "legacy_seed_pd_recipe.yaml"


@pytest.mark.parametrize(("key", "runtime", "version", "said"), [
    ("env", "vllm-omni", "0.24", "vLLM 0.24"),
    ("env", "vllm-omni", "0.25", "vLLM 0.25"),
    ("env", "vllm", "0.30", "vLLM 0.30"),
    ("kv_connector_extra_config.bootstrap_port", "vllm-omni", "0.30", "vllm-omni 0.30"),
    ("kv_connector_extra_config.bootstrap_port", "vllm-omni", "0.31",
     "vllm-omni 0.30 (the newest release before vLLM 0.31)"),
])
def test_bootstrap_reader_names_vllm_for_the_env_and_the_runtime_for_a_key(key, runtime, version, said) -> None:
    assert bootstrap_reader(key, runtime, target(version)) == said


@pytest.mark.parametrize(("version", "release"), [
    ("0.24", "vllm-omni 0.24"),
    ("0.25", "vllm-omni 0.24 (the newest release before vLLM 0.25)"),
    ("0.13", "vllm-omni (no release for vLLM 0.13; the first is 0.14)"),
])
def test_opd102_names_the_vllm_omni_release_that_runs_on_the_target(version: str, release: str) -> None:
    res = validate_text("stage_args:\n  - stage_id: 0\n    engine_input_source: []\n", "t.yaml",
                        ValidateOptions(vllm_version=version))
    assert [d.message for d in res.diagnostics if d.code == "OPD102"] == [
        f"legacy `stage_args` file: no schema defaults are applied on {release} (an omitted key is missing, not "
        "defaulted); vllm-omni 0.28 and later refuse the schema"]


def _bootstrap_notes(version: str) -> list[str]:
    from omni_pd.compile.migrate import migrate_text
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.io import parse_text

    _, m = migrate_text(parse_text(LEGACY.read_text(), LEGACY.name), target(version), load_catalogue(), None)
    return [n.message for n in m.notes if "bootstrap" in n.message]


def test_migrate_says_vllm_reads_the_bootstrap_env_before_vllm_omni_0_30() -> None:
    assert _bootstrap_notes("0.24") == [
        "stage 0: `mooncake_bootstrap_port: 25201` -> env VLLM_MOONCAKE_BOOTSTRAP_PORT (what vLLM 0.24 reads for "
        "the prefill's bootstrap port)",
        "stage 1: `mooncake_bootstrap_port` dropped: a kv_consumer binds no bootstrap server (only the prefill "
        "side's port is read; vLLM 0.24)"]


def test_migrate_says_vllm_omni_0_30_reads_its_bootstrap_key() -> None:
    assert _bootstrap_notes("0.30") == [
        "stage 0: `mooncake_bootstrap_port: 25201` -> kv_connector_extra_config.bootstrap_port and env "
        "VLLM_MOONCAKE_BOOTSTRAP_PORT (what vllm-omni 0.30 reads for the prefill's bootstrap port)",
        "stage 1: `mooncake_bootstrap_port` dropped: a kv_consumer binds no bootstrap server (only the prefill "
        "side's port is read; vllm-omni 0.30)"]

