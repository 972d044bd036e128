"""The editor schema (``omni-pd schema``, schemas/omni-pd-deploy.schema.json) against validate.

Issue 24 item 7: the schema said ``additionalProperties: true`` everywhere and took any
string for ``kv_role`` and ``kv_connector``, so a JSON Schema validator found nothing in a
broken file. Held here, with real validators (the ``jsonschema`` library and the
``check-jsonschema`` CLI as a subprocess):

* no correct config is refused: every deploy config omni-pd ships (goldens, presets,
  fixtures) and every ``vllm_omni/deploy/*.yaml`` of the vllm-omni 0.30.0 wheel validates
  with zero errors against the schema of its vLLM target;
* a broken file whose mistake a schema can express (wrong kv_role, unknown connector, port
  out of range, TP 0, unknown top-level key or platform) gets a schema error at the key
  that is wrong, and omni-pd's validate the matching rule on the same line;
* over omni-pd's own example files (every rule's failing, passing and extra examples) and
  the cases (tests/cases, ../shared/cases when present), the schema reports nothing
  validate does not, and misses none of validate's findings of those kinds.
"""

from __future__ import annotations

import copy
import io
import json
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from ruamel.yaml import YAML

from omni_pd.check.rules import registry
from omni_pd.check.validate import ValidateOptions, options_from_example, validate_text
from omni_pd.compile.model import json_schema
from omni_pd.compile.parse import to_plain

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "schemas" / "omni-pd-deploy.schema.json"
GOLDEN = ROOT / "tests" / "golden"
CJS = Path(sys.executable).with_name("check-jsonschema")


def _rt() -> YAML:
    y = YAML(typ="rt")
    y.width = 4096
    return y


def _load(text: str) -> Any:
    return _rt().load(text)


def _dump(tree: Any) -> str:
    buf = io.StringIO()
    _rt().dump(tree, buf)
    return buf.getvalue()


@lru_cache(maxsize=None)
def _validator(version: str | None) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json_schema(version))


def _line(tree: Any, path: list) -> int:
    """1-based line of the key (or list item) at ``path`` in a round-trip tree; the
    deepest one that exists (the file's first line for the root)."""
    node, line = tree, 1
    for k in path:
        try:
            line = (node.lc.item(k) if isinstance(node, list) else node.lc.key(k))[0] + 1
            node = node[k]
        except (KeyError, IndexError, TypeError, AttributeError):
            break
    return line


def key_paths(err: jsonschema.ValidationError) -> list[tuple]:
    """Where ``err`` points in the document: its instance path, or for an unknown key
    (``additionalProperties``, ``propertyNames``), which JSON Schema reports at the
    mapping that holds it, the path of each offending key."""
    path = tuple(err.absolute_path)
    if "propertyNames" in err.relative_schema_path:  # the name's own error (enum), reported at the mapping
        return [path + (err.instance,)]
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        known = err.schema.get("properties", {})
        pats = err.schema.get("patternProperties", {})
        return [path + (k,) for k in err.instance
                if k not in known and not any(re.search(p, str(k)) for p in pats)]
    return [path]


def schema_findings(tree: Any, version: str | None) -> list[tuple[tuple, int, str]]:
    """``(path, line, message)`` of every error of ``tree`` against the schema of ``version``."""
    return [(p, _line(tree, list(p)), e.message)
            for e in _validator(version).iter_errors(to_plain(tree)) for p in key_paths(e)]


# --- the schema's facts ---------------------------------------------------------------------------

def test_published_schema_is_the_generated_one_and_a_valid_2020_12_schema() -> None:
    published = json.loads(SCHEMA.read_text())
    assert published == json_schema()
    jsonschema.Draft202012Validator.check_schema(published)
    assert published["title"] == "vllm-omni deploy config (omni-pd, vLLM 0.30)"


def test_enums_ranges_and_closed_levels_are_the_facts_validate_uses() -> None:
    from omni_pd.compile import ascend
    from omni_pd.compile.targets import target
    from omni_pd.compile.topology import PLATFORMS
    from omni_pd.compile.tp_pairs import ASCEND_CONNECTORS

    s = json_schema()
    kv = s["$defs"]["KVTransferConfig"]
    assert kv["properties"]["kv_role"]["enum"] == ["kv_producer", "kv_consumer", "kv_both", None]
    names = kv["else"]["properties"]["kv_connector"]["enum"]
    assert set(names) == target("0.30").connectors() | ASCEND_CONNECTORS | ascend.registered() | {None}
    assert "NixlConnector" in names and "MooncakeConnectorV1" in names
    assert "P2pNcclConnector" not in names and "PyNcclConnector" not in names  # removed in 0.24; never V1
    assert "P2pNcclConnector" in json_schema("0.22")["$defs"]["KVTransferConfig"]["else"]["properties"]["kv_connector"]["enum"]
    assert kv["additionalProperties"] is False and "kv_ip" in kv["properties"]
    kv33 = json_schema("0.33")["$defs"]["KVTransferConfig"]
    assert "kv_ip" not in kv33["properties"] and "kv_buffer_size" not in kv33["properties"]  # removed in 0.32
    assert json_schema("0.13")["$defs"]["KVTransferConfig"]["additionalProperties"] is True  # forbid from 0.18
    assert s["properties"]["platforms"]["propertyNames"]["enum"] == list(PLATFORMS)
    assert s["additionalProperties"] is False and list(s["patternProperties"]) == ["^x-"]
    st = s["$defs"]["StageDeploy"]
    assert st.get("additionalProperties", True) is True  # engine arguments pass through
    assert st["properties"]["tensor_parallel_size"] == {"type": ["integer", "null"], "minimum": 1,
                                                       "title": "Tensor Parallel Size", "default": None}
    gmu = st["properties"]["gpu_memory_utilization"]
    assert (gmu["exclusiveMinimum"], gmu["maximum"]) == (0, 1) and "vllm/config/cache.py" in gmu["description"]
    assert s["$defs"]["ParallelConfig"].get("additionalProperties", True) is True


@pytest.mark.parametrize("value, ok", [
    (1, True), (65535, True), ("8100", True), (" 08100 ", True), (0, False), (65536, False), ("70000", False),
    ("0", False), ("port", False), (-1, False), (None, True),
])
def test_kv_port_range(value, ok) -> None:
    doc = {"stages": [{"stage_id": 0, "kv_transfer_config": {"kv_connector": "NixlConnector",
                                                              "kv_role": "kv_producer", "kv_port": value}}]}
    errs = list(_validator(None).iter_errors(doc))
    assert (not errs) == ok, [e.message for e in errs]


@pytest.mark.parametrize("value, ok", [(0.9, True), (1, True), (1.0, True), (0, False), (1.01, False), (-0.5, False)])
def test_gpu_memory_utilization_range(value, ok) -> None:
    errs = list(_validator(None).iter_errors({"stages": [{"stage_id": 0, "gpu_memory_utilization": value}]}))
    assert (not errs) == ok


def test_out_of_tree_connector_with_module_path_is_any_name() -> None:
    kv = {"kv_connector": "MyConnector", "kv_role": "kv_producer"}
    doc = {"stages": [{"stage_id": 0, "kv_transfer_config": kv}]}
    [err] = list(_validator(None).iter_errors(doc))
    assert list(err.absolute_path) == ["stages", 0, "kv_transfer_config", "kv_connector"]
    kv["kv_connector_module_path"] = "my_pkg.connector"
    assert list(_validator(None).iter_errors(doc)) == []


def test_base_config_overlay_may_leave_out_a_connector_name() -> None:
    conn = {"connectors": {"shm": {"extra": {"decode_batch_max_size": 2}}}}
    assert [e.message for e in _validator(None).iter_errors(dict(conn))] == ["'name' is a required property"]
    assert list(_validator(None).iter_errors(dict(conn, base_config="base.yaml"))) == []


# --- no correct config is refused ---------------------------------------------------------------

_VERSION = re.compile(r"^#.*\bvLLM (\d+\.\d+)\b", re.M)


def _deploy_documents() -> list:
    """Every deploy config omni-pd ships: the goldens (the deploy.yaml of each rendered
    ConfigMap too), the top-level presets and the fixtures. Legacy ``stage_args`` files
    (the inputs of ``migrate``, refused by vllm-omni 0.28+: OPD102) and pipeline
    definitions (presets/pipelines/, OPD007) are not deploy configs."""
    y = YAML(typ="safe")
    out = []
    paths = sorted(GOLDEN.rglob("*.yaml")) + sorted((ROOT / "presets").glob("*.yaml")) + sorted(
        (ROOT / "tests" / "fixtures").rglob("*.yaml"))
    for p in paths:
        texts = [p.read_text()]
        for d in y.load_all(texts[0]):
            if isinstance(d, dict) and d.get("kind") == "ConfigMap" and "deploy.yaml" in (d.get("data") or {}):
                texts = [d["data"]["deploy.yaml"]]
        for t in texts:
            docs = [d for d in y.load_all(t)]
            if len(docs) == 1 and isinstance(docs[0], dict) and "stages" in docs[0] and "stage_args" not in docs[0]:
                m = _VERSION.search(t)
                out.append(pytest.param(t, m.group(1) if m else None, id=str(p.relative_to(ROOT))))
    return out


DEPLOY_DOCUMENTS = _deploy_documents()


def test_the_shipped_set_is_what_it_should_be() -> None:
    ids = {p.id for p in DEPLOY_DOCUMENTS}
    assert len(ids) >= 20
    assert {"presets/qwen3_omni_moe.yaml", "tests/golden/qwen3_omni_moe_pd.yaml",
            "tests/golden/render_k8s_2p1d/configmap.yaml", "tests/fixtures/llm.yaml",
            "tests/golden/encoder/llm_1e1p1d_mooncake_v024.yaml"} <= ids
    assert dict((p.id, p.values[1]) for p in DEPLOY_DOCUMENTS)["tests/golden/encoder/llm_1e1p1d_mooncake_v024.yaml"] == "0.24"


@pytest.mark.parametrize(("text", "version"), DEPLOY_DOCUMENTS)
def test_every_shipped_deploy_config_validates(text: str, version: str | None) -> None:
    assert schema_findings(_load(text), version) == []


@pytest.mark.wheel
def test_every_deploy_file_of_the_vllm_omni_wheel_validates(omni_wheel_deploy_dir: Path) -> None:
    from omni_pd.check.inputs import not_a_deploy_config
    from omni_pd.io import load_file

    files = [f for f in sorted(omni_wheel_deploy_dir.glob("*.yaml")) if not_a_deploy_config(load_file(f)) is None]
    assert len(files) == 109  # 110 files; qwen3_tts_forced_aligner.yaml is stage settings, not a deploy config
    bad = {f.name: found for f in files if (found := schema_findings(_load(f.read_text()), None))}
    assert bad == {}
    if not CJS.exists():
        pytest.skip("check-jsonschema is not installed (pip install -e '.[test]'): checked with jsonschema only")
    r = subprocess.run([str(CJS), "--schemafile", str(SCHEMA), *map(str, files)], capture_output=True, text=True)
    assert (r.returncode, r.stdout.strip()) == (0, "ok -- validation done"), r.stdout + r.stderr


# --- broken files: a schema error at the key, and validate's rule on the same line ----------------

def _one_edit(golden: str, edit) -> str:
    tree = _load((GOLDEN / golden).read_text())
    edit(tree)
    return _dump(tree)


def _set(*path_value):
    *path, value = path_value

    def edit(tree):
        node = tree
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return edit


#: (id, where it comes from, the file, validate's options, omni-pd's code, the wrong key's path
#: (a list: every wrong key), what check-jsonschema prints for the first: "<json path>: <message fragment>")
BROKEN = [
    ("readme-tp-two", "docs/expand.md: the OPD101 example (`my.yaml:3:27`, tensor_parallel_size: two)",
     "stages:\n  - stage_id: 0\n    tensor_parallel_size: two\n", {}, "OPD101",
     ("stages", 0, "tensor_parallel_size"), "$.stages[0].tensor_parallel_size: 'two' is not of type"),
    ("rule-OPD601", "OPD601's failing example (PyNcclConnector, a V0 name)", registry()["OPD601"].fail, {},
     "OPD601", [("stages", i, "kv_transfer_config", "kv_connector") for i in (0, 1)],
     "$.stages[0].kv_transfer_config.kv_connector: 'PyNcclConnector' is not one of"),
    ("rule-OPD504", "OPD504's failing example (VLLM_NIXL_SIDE_CHANNEL_PORT \"70000\")", registry()["OPD504"].fail, {},
     "OPD504", ("stages", 0, "env", "VLLM_NIXL_SIDE_CHANNEL_PORT"),
     "$.stages[0].env.VLLM_NIXL_SIDE_CHANNEL_PORT: '70000' does not match"),
    ("rule-OPD103", "OPD103's failing example (top-level `pipelne`)", registry()["OPD103"].fail, {},
     "OPD103", ("pipelne",), "$: 'pipelne' does not match any of the regexes"),
    ("rule-OPD103-platform", "OPD103's unknown-platform example (`cuda2`)",
     next(e.yaml for e in registry()["OPD103"].examples if e.name == "unknown platform name"), {},
     "OPD103", ("platforms", "cuda2"), "$.platforms: 'cuda2' is not one of ['cuda', 'rocm', 'npu', 'xpu', 'musa']"),
    ("golden-kv-role", "the PD golden with decode's kv_role `consumer`",
     _one_edit("qwen3_omni_moe_pd.yaml", _set("stages", 1, "kv_transfer_config", "kv_role", "consumer")), {},
     "OPD302", ("stages", 1, "kv_transfer_config", "kv_role"),
     "$.stages[1].kv_transfer_config.kv_role: 'consumer' is not one of ['kv_producer', 'kv_consumer', 'kv_both', None]"),
    ("golden-connector-typo", "the PD golden with prefill's connector `MooncakeConector`",
     _one_edit("qwen3_omni_moe_pd.yaml", _set("stages", 0, "kv_transfer_config", "kv_connector", "MooncakeConector")),
     {}, "OPD601", ("stages", 0, "kv_transfer_config", "kv_connector"),
     "$.stages[0].kv_transfer_config.kv_connector: 'MooncakeConector' is not one of"),
    ("golden-kv-port", "the NIXL PD golden with decode's kv_port 70000",
     _one_edit("qwen3_omni_moe_pd_nixl.yaml", _set("stages", 1, "kv_transfer_config", "kv_port", 70000)), {},
     "OPD504", ("stages", 1, "kv_transfer_config", "kv_port"),
     "$.stages[1].kv_transfer_config.kv_port: 70000 is greater than the maximum of 65535"),
    ("golden-tp-0", "the PD golden with prefill's tensor_parallel_size 0",
     _one_edit("qwen3_omni_moe_pd.yaml", _set("stages", 0, "tensor_parallel_size", 0)), {},
     "OPD101", ("stages", 0, "tensor_parallel_size"),
     "$.stages[0].tensor_parallel_size: 0 is less than the minimum of 1"),
    ("golden-top-level-key", "the PD golden with a top-level `async_chunks: false`",
     _one_edit("qwen3_omni_moe_pd.yaml", lambda t: t.insert(1, "async_chunks", False)), {},
     "OPD103", ("async_chunks",), "$: 'async_chunks' does not match any of the regexes"),
    ("golden-ec-role", "the E->P->D golden with the encoder's ec_role `ec_produce`",
     _one_edit("encoder/qwen3_omni_thinker_1e1p1d.yaml", _set("stages", 0, "ec_transfer_config", "ec_role", "ec_produce")),
     {}, "OPD614", ("stages", 0, "ec_transfer_config", "ec_role"),
     "$.stages[0].ec_transfer_config.ec_role: 'ec_produce' is not one of ['ec_producer', 'ec_consumer', 'ec_both', None]"),
    ("golden-kv-key", "the NIXL PD golden with `kv_rol: kv_producer` in prefill's kv_transfer_config",
     _one_edit("qwen3_omni_moe_pd_nixl.yaml", _set("stages", 0, "kv_transfer_config", "kv_rol", "kv_producer")), {},
     "OPD609", ("stages", 0, "kv_transfer_config", "kv_rol"),
     "$.stages[0].kv_transfer_config: Additional properties are not allowed ('kv_rol' was unexpected)"),
    # a misspelt stage key of a catalogued pipeline (the new-user walkthrough's first-hour typo): vllm-omni
    # refuses it ("no structured config owner"), validate says OPD103, and the editor now says so too
    ("golden-stage-key", "the PD golden with decode's `gpu_memory_utilisation: 0.9` (a British spelling)",
     _one_edit("qwen3_omni_moe_pd.yaml", _set("stages", 1, "gpu_memory_utilisation", 0.9)), {},
     "OPD103", ("stages", 1, "gpu_memory_utilisation"),
     "$.stages[1]: 'gpu_memory_utilisation' does not match any of the regexes: '^x-'"),
]


@pytest.fixture(scope="module")
def check_jsonschema_output(tmp_path_factory) -> dict[str, tuple[int, str]]:
    """check-jsonschema's exit status and its lines for each BROKEN file (one run for all:
    each error line starts with ``<file>::``)."""
    if not CJS.exists():
        return None  # the test checks the jsonschema library and validate, then skips this part
    d = tmp_path_factory.mktemp("broken")
    files = []
    for bid, _, text, *_ in BROKEN:
        files.append(d / f"{bid}.yaml")
        files[-1].write_text(text)
    r = subprocess.run([str(CJS), "--schemafile", str(SCHEMA), *map(str, files)], capture_output=True, text=True)
    lines = [ln.strip().replace(f"{d}/", "") for ln in (r.stdout + r.stderr).splitlines()]
    return {b[0]: (r.returncode, "\n".join(ln for ln in lines if ln.startswith(f"{b[0]}.yaml::"))) for b in BROKEN}


@pytest.mark.parametrize(("bid", "source", "text", "ctx", "code", "path", "printed"), BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_file_gets_a_schema_error_at_the_key_and_validate_the_rule_on_its_line(
        bid, source, text, ctx, code, path, printed, check_jsonschema_output) -> None:
    paths = path if isinstance(path, list) else [path]
    tree = _load(text)
    found = schema_findings(tree, None)
    assert [p for p, _, _ in found] == paths, found  # exactly these errors, nothing else
    res = validate_text(text, f"{bid}.yaml", options_from_example(ctx))
    # validate's rule on each wrong key's line (it may say more: OPD614 also names the consumer left without a producer)
    assert {_line(tree, list(p)) for p in paths} <= {d.location.line for d in res.diagnostics if d.code == code}, \
        res.diagnostics
    if check_jsonschema_output is None:
        pytest.skip("check-jsonschema is not installed (pip install -e '.[test]'): checked with jsonschema only")
    rc, out = check_jsonschema_output[bid]
    assert rc == 1 and f"{bid}.yaml::{printed}" in out, out


def test_a_correct_file_passes_check_jsonschema(tmp_path) -> None:
    if not CJS.exists():
        pytest.skip("check-jsonschema is not installed (pip install -e '.[test]')")
    f = tmp_path / "pd.yaml"
    f.write_text((GOLDEN / "qwen3_omni_moe_pd_nixl.yaml").read_text())
    r = subprocess.run([str(CJS), "--schemafile", str(SCHEMA), str(f)], capture_output=True, text=True)
    assert (r.returncode, r.stdout.strip()) == (0, "ok -- validation done"), r.stdout + r.stderr


# --- over every example file and case: the schema and validate agree ----------------------------

def schema_expressible(d) -> bool:
    """A validate finding a JSON Schema states as well: a connector name the target does not
    register (not a vllm-ascend name on the wrong platform: the schema cannot know the
    platform), a role outside vLLM's KVRole or ec_roles, a port out of 1..65535, a kv_transfer_config
    key the target refuses, an unknown top-level key or platform name."""
    m = d.message
    return ((d.code == "OPD601" and "vllm-ascend" not in m) or (d.code == "OPD302" and "unsupported kv_role" in m)
            or (d.code == "OPD504" and "is not a port" in m) or d.code == "OPD609"
            or (d.code == "OPD614" and "unsupported ec_role" in m)
            or (d.code == "OPD103" and ("top-level" in m or "unknown platform" in m)))


#: the codes :func:`schema_expressible` picks findings of
EXPRESSIBLE_CODES = frozenset({"OPD601", "OPD302", "OPD504", "OPD609", "OPD614", "OPD103"})


def _agree(text: str, opts: ValidateOptions, name: str, *, always: bool = True) -> list[str]:
    """What the schema and validate disagree on in ``text``: a schema error on a line where
    validate reports nothing, or a schema-expressible validate finding with no schema error
    on its line. ``always`` False: validate runs only when the schema finds something (the
    first half of the check only)."""
    try:
        tree = _load(text)
    except Exception:  # unreadable YAML: validate's OPD001, nothing for a schema
        return []
    if not isinstance(tree, dict) or "stage_args" in tree:
        return []
    found = schema_findings(tree, opts.vllm_version)
    if not found and not always:
        return []
    res = validate_text(text, name, opts)
    if any(d.code == "OPD007" for d in res.diagnostics):  # not a deploy config
        return []
    said = {d.location.line for d in res.diagnostics if d.location is not None}
    lines = {ln for _, ln, _ in found}
    out = [f"{name}: schema only: {p} {msg}" for p, ln, msg in found if ln not in said]
    out += [f"{name}: validate only: {d.code} line {d.location.line} {d.message}" for d in res.diagnostics
            if schema_expressible(d) and d.location is not None and d.location.line not in lines
            and d.severity.name == "ERROR"]
    return out


def test_schema_and_validate_agree_on_every_rule_example() -> None:
    """Every example of every rule: a schema error only where validate reports something;
    the examples of the rules a schema can express: each such validate error has a schema
    error on its line (validate runs on the others only when the schema finds something)."""
    off, n, flagged = [], 0, 0
    for code, r in sorted(registry().items()):
        runs = [("fail", r.fail, r.example_context),
                ("pass", r.passing, r.pass_context if r.pass_context is not None else r.example_context)]
        runs += [(ex.name, ex.yaml, ex.context or r.example_context) for ex in r.examples]
        for name, text, ctx in runs:
            n += 1
            off += _agree(text, options_from_example(ctx), f"{code} {name}", always=code in EXPRESSIBLE_CODES)
            tree = _load(text)
            flagged += bool(schema_findings(tree, ctx.get("vllm_version"))) if isinstance(tree, dict) else 0
    assert off == []
    assert n > 200 and flagged >= 5  # the schema finds something in the examples, and only where validate does


def _case_runs() -> list:
    sys.path.insert(0, str(Path(__file__).parent))
    from test_cases import _load as load_case, _merge_variant, _runs  # the case harness (tests/test_cases.py)

    out = []
    for p in _runs():
        cid, which, path, variant = p.values
        if isinstance(variant, tuple):  # list-style connector swaps: their harness rewrites the file
            continue
        out.append(pytest.param(path, variant, id=p.id))
    return out, load_case, _merge_variant


CASE_RUNS, _load_case, _merge_case_variant = _case_runs()


@pytest.mark.parametrize(("path", "variant"), CASE_RUNS)
def test_schema_and_validate_agree_on_the_cases(path: Path, variant) -> None:
    from test_cases import _strip_x, context_of

    tree = _load_case(path)
    if variant:
        tree = _merge_case_variant(tree, tree[variant])
    opts = context_of(to_plain(tree))
    text = _dump(_strip_x(copy.deepcopy(tree)))
    assert _agree(text, opts, path.name) == []


# --- `omni-pd schema --vllm-version` -------------------------------------------------------------

def test_schema_command_writes_the_schema_of_the_target(tmp_path, capsys) -> None:
    from test_cli import run_cli  # tests/test_cli.py: main() in-process, (exit code, stdout, stderr)

    out = tmp_path / "s.json"
    assert run_cli(["schema", "--vllm-version", "0.22", "-o", str(out)], capsys) == (0, "", f"wrote {out}\n")
    assert json.loads(out.read_text()) == json_schema("0.22")
    rc, stdout, err = run_cli(["schema", "--vllm-version", "0.9"], capsys)
    assert (rc, stdout) == (2, "") and err.startswith("error[OPD006]: --vllm-version 0.9: omni-pd has no facts for vLLM 0.9")


def test_the_one_deliberate_difference_a_quoted_number_is_underlined_but_validates() -> None:
    """docs/expand.md: the schema wants a value in its own YAML type; validate follows pydantic's
    lax mode (vLLM's and vllm-omni's configs coerce "16" to 16), so it accepts what the editor
    underlines. Pinned both ways, so neither side drifts silently."""
    text = 'pipeline: qwen3_omni_moe\nstages:\n  - stage_id: 0\n    devices: "0"\n    max_num_seqs: "16"\n'
    tree = _load(text)
    assert schema_findings(tree, None) == [(("stages", 0, "max_num_seqs"), 5, "'16' is not of type 'integer', 'null'")]
    assert [d.code for d in validate_text(text, "s.yaml", options_from_example({})).diagnostics
            if d.severity.value == "error"] == []
