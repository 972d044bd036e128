"""The rule engine itself (omni_pd/check/rules/__init__.py): the ``@rule`` decorator, the
registry, ``Rule.explain``/``diag``, the Context helpers every rule reads (locating a key
in a stage entry or its platform overlay, effective parallel sizes and world size as
vllm-omni 0.30 computes them, CLI precedence) and ``run_rules`` (runtime filter, OPD000).

Issue 16: every rule test reaches these helpers, but only through whole rule messages; the
mutation run of bench/mutation.py showed which of their branches no test pins. Each test
here calls the helper with a real Context built by validate (``contexts``) and compares
literal values.

Upstream facts: vllm-omni 0.30.0 ``config/omni_config.py _build_parallel_config`` (a
stage's nested ``parallel_config`` over the flat keys; CLI parallel flags moved into the
nested block for diffusion stages only), ``OmniStageDiffusionParallelConfig.__post_init__``
(world = TP x PP x DP x PCP x SP x CFG, SP = allgather if > 1 else ulysses x ring; with
``use_hsdp`` and all those 1, HSDP replicate x shard).
"""

from __future__ import annotations

import pytest

import omni_pd.check.rules as R
from omni_pd.check.context import Inventory
from omni_pd.check.rules import Context, Example, Rule, get, registry, run_rules
from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.diagnostics import Diagnostic, Location, Severity


def contexts(monkeypatch, text: str, opts: ValidateOptions | None = None) -> list[Context]:
    """The Context(s) validate builds for ``text`` (one per platform), rules not run."""
    got: list[Context] = []
    monkeypatch.setattr(R, "run_rules", lambda ctx, rules=None: got.append(ctx) or [])
    validate_text(text, "t.yaml", opts)
    return got


def ctx_of(monkeypatch, text: str, opts: ValidateOptions | None = None) -> Context:
    (ctx,) = contexts(monkeypatch, text, opts)
    return ctx


def _noop(ctx, r):
    """Doc of the test rule.

    Second paragraph."""
    return []


# --- @rule, the registry, get ----------------------------------------------------------------------

def test_rule_decorator_declares_the_rule_and_returns_the_function_unchanged() -> None:
    ex = Example("one branch", "stages: []\n", True)
    ctx_in, pass_in = {"cli": {"tensor_parallel_size": 2}}, {"env": {}}
    n = len(R._DECLARED)
    try:
        assert R.rule("OPD998", "test-rule", Severity.WARNING, "a summary", fail="f: 1\n", passing="p: 1\n",
                      example_context=ctx_in, pass_context=pass_in, labels=("L-1",), examples=(ex,),
                      runtime="vllm")(_noop) is _noop
        assert len(R._DECLARED) == n + 1
        r = R._DECLARED[-1]
        assert (r.code, r.name, r.severity, r.summary, r.doc, r.fail, r.passing, r.check, r.example_context,
                r.pass_context, r.labels, r.examples, r.runtime) == (
            "OPD998", "test-rule", Severity.WARNING, "a summary", "Doc of the test rule.\n\n    Second paragraph.",
            "f: 1\n", "p: 1\n", _noop, ctx_in, pass_in, ("L-1",), (ex,), "vllm")
        # the rule keeps its own copies of the contexts
        assert r.example_context is not ctx_in and r.pass_context is not pass_in
        R.rule("OPD997", "bare", Severity.INFO, "s", fail="f", passing="p", examples=[ex])(lambda c, r: [])
        b = R._DECLARED[-1]
        assert (b.doc, b.example_context, b.pass_context, b.labels, b.examples, b.runtime) == ("", {}, None, (), (ex,),
                                                                                               None)
        assert isinstance(b.examples, tuple)
    finally:
        del R._DECLARED[n:]


def test_registry_is_sorted_by_code_and_get_normalises_the_code() -> None:
    reg = registry()
    assert list(reg) == sorted(reg) and len(reg) == len({id(r) for r in reg.values()})
    assert get(" opd401 ") is reg["OPD401"] and get("OPD401") is reg["OPD401"]
    assert get("OPD999") is None


@pytest.mark.parametrize(("code", "family"), [
    ("OPD101", "schema"), ("OPD206", "topology"), ("OPD301", "pd_pair"), ("OPD401", "devices"), ("OPD501", "ports"),
    ("OPD601", "capability"), ("OPD701", "runtime"), ("OPD801", "other"), ("OPD001", "other")])
def test_family_from_the_hundreds_digit(code, family) -> None:
    r = Rule(code=code, name="n", severity=Severity.ERROR, summary="s", doc="d", fail="f", passing="p", check=_noop)
    assert r.family == family


# --- Rule.explain, Rule.diag -----------------------------------------------------------------------

def _r(**kw) -> Rule:
    base = dict(code="OPD998", name="test-rule", severity=Severity.WARNING, summary="A summary.",
                doc="  The doc.\nSecond line.  ", fail="stages:\n  - stage_id: 0\n", passing="\nstages: []\n",
                check=_noop)
    return Rule(**{**base, **kw})


def test_explain_of_a_plain_rule() -> None:
    assert _r().explain() == (
        "OPD998 test-rule (warning, other)\n\nA summary.\n\nThe doc.\nSecond line.\n\nFails:\n\n"
        "    stages:\n      - stage_id: 0\n\nPasses:\n\n    stages: []\n")


def test_explain_with_runtime_contexts_and_examples() -> None:
    r = _r(runtime="vllm-omni", example_context={"cli": {"tensor_parallel_size": 2}, "platform": "npu"},
           pass_context={}, examples=(Example("fires here", "x", True), Example("passes there", "y", False)))
    assert r.explain() == (
        "OPD998 test-rule (warning, other)\n\nA summary.\n\n"
        "Runtime: vllm-omni only (`vllm serve --omni`; not checked for pipelines launched as plain `vllm serve` "
        "engines)\n\nThe doc.\nSecond line.\n\nFails:\n\n    stages:\n      - stage_id: 0\n\nPasses:\n\n"
        "    stages: []\n\n"
        "Context of the failing example: cli={'tensor_parallel_size': 2}, platform='npu'\n"
        "Context of the passing example: none\n\n"
        "More examples (each is a test):\n  fires: fires here\n  passes: passes there\n")
    two = _r(pass_context={"env": {"A": "1"}, "platform": "npu"}).explain()
    assert two.endswith("Context of the passing example: env={'A': '1'}, platform='npu'\n")
    plain = _r(runtime="vllm", pass_context={"env": {"A": "1"}}).explain()
    assert "\n\nRuntime: vllm only (plain `vllm serve` engines)\n\nThe doc." in plain
    assert plain.endswith("Passes:\n\n    stages: []\nContext of the passing example: env={'A': '1'}\n")


def test_diag_carries_the_code_severity_and_every_field() -> None:
    r = _r()
    loc = Location("t.yaml", 3, 5, ("stages", 0))
    rel = [Location("t.yaml", 4, 1, ("stages", 1), label="other")]
    d = r.diag("msg", loc, help="h", related=rel, notes=["n"], label="lbl", severity=Severity.ERROR)
    assert d == Diagnostic(code="OPD998", severity=Severity.ERROR, message="msg", location=loc, help="h",
                           related=rel, notes=["n"], label="lbl")
    assert d.related is not rel
    assert r.diag("m", None) == Diagnostic(code="OPD998", severity=Severity.WARNING, message="m", location=None,
                                           help=None, related=[], notes=[], label=None)


# --- Context: locating a key ----------------------------------------------------------------------

_LOC = """pipeline: qwen3_omni_moe
stages:
  - stage_id: 0
    devices: "0"
    runtime: {devices: "0"}
    engine_args: {max_model_len: 10, kv_transfer_config: {kv_connector: X}}
    kv_transfer_config: {kv_role: kv_producer}
  - {stage_id: 1, devices: "1", max_model_len: 8}
  - {stage_id: 2, devices: "1"}
platforms:
  npu:
    stages:
      - {stage_id: 1, engine_args: {max_model_len: 5}}
      - {stage_id: 2, runtime: {devices: "2"}, devices: "3"}
"""


def test_stage_path_prefers_runtime_then_engine_args_then_flat_keys(monkeypatch) -> None:
    ctx = ctx_of(monkeypatch, _LOC)
    n0, n1, _ = ctx.topology.stages
    assert ctx.stage_path(n0, "devices") == ("stages", 0, "runtime", "devices")
    assert ctx.stage_path(n0, "max_model_len") == ("stages", 0, "engine_args", "max_model_len")
    assert ctx.stage_path(n0, "kv_transfer_config", "kv_role") == ("stages", 0, "kv_transfer_config", "kv_role")
    assert ctx.stage_path(n0, "kv_transfer_config", "kv_connector") == (
        "stages", 0, "engine_args", "kv_transfer_config", "kv_connector")
    # no platform: the overlay is not looked at
    assert ctx.stage_path(n1, "max_model_len") == ("stages", 1, "max_model_len")


def test_stage_path_falls_back_to_the_nearest_existing_ancestor_then_the_stage(monkeypatch) -> None:
    ctx = ctx_of(monkeypatch, _LOC)
    n0, n1, _ = ctx.topology.stages
    assert ctx.stage_path(n0, "kv_transfer_config", "kv_connector_extra_config", "x") == (
        "stages", 0, "engine_args", "kv_transfer_config")
    assert ctx.stage_path(n1, "kv_transfer_config", "kv_connector_extra_config", "x") == ("stages", 1)
    assert ctx.stage_path(n0, "nothing") == ("stages", 0)


def test_stage_path_without_keys_is_the_stage_entry_itself(monkeypatch) -> None:
    # sloc(node) names the stage (OPD503's related "decode (stage 1) on b"): not its runtime: block
    ctx = ctx_of(monkeypatch, _LOC)
    n0 = ctx.topology.stages[0]
    assert ctx.stage_path(n0) == ("stages", 0)
    assert ctx.stage_path(n0, "runtime") == ("stages", 0, "runtime")
    assert (ctx.sloc(n0).line, ctx.sloc(n0).column) == (3, 5)


def test_stage_path_reads_the_platform_overlay_first(monkeypatch) -> None:
    ctx = ctx_of(monkeypatch, _LOC, ValidateOptions(platform="npu"))
    n0, n1, n2 = ctx.topology.stages
    assert ctx.stage_path(n1, "max_model_len") == ("platforms", "npu", "stages", 0, "engine_args", "max_model_len")
    assert ctx.stage_path(n2, "devices") == ("platforms", "npu", "stages", 1, "runtime", "devices")
    assert ctx.stage_path(n1, "devices") == ("stages", 1, "devices")  # the overlay entry does not set it
    assert ctx.stage_path(n0, "devices") == ("stages", 0, "runtime", "devices")  # no overlay entry for stage 0
    assert ctx.stage_path(n1) == ("stages", 1)  # no keys: the stage, not the overlay


def test_stage_path_overlay_flat_key_and_entries_that_are_not_mappings(monkeypatch) -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n"
            "platforms:\n  npu:\n    stages:\n      - {stage_id: 0}\n      - {stage_id: 1, devices: \"2\"}\n")
    ctx = ctx_of(monkeypatch, text, ValidateOptions(platform="npu"))
    assert ctx.stage_path(ctx.topology.stages[1], "devices") == ("platforms", "npu", "stages", 1, "devices")
    assert ctx.stage_path(ctx.topology.stages[0], "devices") == ("stages", 0, "devices")
    # an overlay whose stages is not a list (OPD101) is passed over, not a crash
    bad = ("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"0\"}\n"
           "platforms:\n  npu:\n    stages: {stage_id: 0, devices: \"1\"}\n")
    ctx = ctx_of(monkeypatch, bad, ValidateOptions(platform="npu"))
    assert ctx.stage_path(ctx.topology.stages[0], "devices") == ("stages", 0, "devices")


def test_two_overlay_entries_of_one_stage_both_apply_and_the_later_is_located(monkeypatch) -> None:
    # vllm-omni 0.30 _apply_platform_overrides applies each platforms.<p>.stages entry in file order;
    # omni-pd's topology kept only the last entry of a stage (devices "2" was lost)
    text = ("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n"
            "platforms:\n  npu:\n    stages:\n      - {stage_id: 1, devices: \"2\", max_model_len: 4}\n"
            "      - {stage_id: 1, max_model_len: 5}\n")
    ctx = ctx_of(monkeypatch, text, ValidateOptions(platform="npu"))
    n1 = ctx.topology.stages[1]
    assert (n1.devices, n1.settings["max_model_len"]) == ((2,), 5)
    assert ctx.stage_path(n1, "devices") == ("platforms", "npu", "stages", 0, "devices")
    assert ctx.stage_path(n1, "max_model_len") == ("platforms", "npu", "stages", 1, "max_model_len")


def test_stage_path_in_a_file_without_stages(monkeypatch) -> None:
    # validate stops at OPD007 for such a file; the helper is still defined for it
    monkeypatch.setattr("omni_pd.check.inputs.not_a_deploy_config", lambda doc, plain=None: None)
    ctx = ctx_of(monkeypatch, "pipeline: qwen3_omni_moe\nasync_chunk: true\n")
    n0 = ctx.topology.stages[0]
    assert (n0.index, ctx.stage_path(n0, "devices"), ctx.stage_path(n0)) == (None, (), ())
    assert (ctx.sloc(n0, "devices").line, ctx.sloc(n0, "devices").column) == (1, 1)


def test_stage_path_of_a_stage_without_an_entry(monkeypatch) -> None:
    ctx = ctx_of(monkeypatch, "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"0\"}\n")
    n2 = ctx.topology.stages[2]
    assert n2.index is None
    assert ctx.stage_path(n2, "devices") == ("stages",)
    assert ctx.stage_path(n2) == ("stages",)


def test_sloc_points_at_the_value_only_when_the_key_itself_was_found(monkeypatch) -> None:
    ctx = ctx_of(monkeypatch, _LOC)
    n0, n1, _ = ctx.topology.stages
    at = ctx.sloc(n1, "devices", value=True)
    assert (at.file, at.line, at.column, at.path, at.label) == ("t.yaml", 8, 28, ("stages", 1, "devices"), None)
    key = ctx.sloc(n1, "devices")
    assert (key.line, key.column) == (8, 19)
    # the key is missing: the stage entry, never "the value" of the stage
    miss = ctx.sloc(n1, "nothing", value=True, label="here")
    assert (miss.file, miss.line, miss.column, miss.path, miss.label) == ("t.yaml", 8, 5, ("stages", 1), "here")
    # an ancestor found for a nested key is not the value either
    anc = ctx.sloc(n0, "kv_transfer_config", "kv_connector_extra_config", "x", value=True)
    assert (anc.line, anc.column) == (6, 38)
    assert ctx.sloc(n0, value=True).column == 5


def test_loc_with_a_label_keeps_file_line_column_and_path(monkeypatch) -> None:
    ctx = ctx_of(monkeypatch, _LOC)
    plain = ctx.loc(("stages", 1, "devices"), value=True)
    lab = ctx.loc(("stages", 1, "devices"), value=True, label="lbl")
    assert (lab.file, lab.line, lab.column, lab.path, lab.label) == (plain.file, 8, 28, plain.path, "lbl")
    assert plain.label is None and ctx.loc(("stages", 1, "devices")).column == 19
    assert ctx.exists(("stages", 1, "devices")) and not ctx.exists(("stages", 1, "port"))


def test_raw_at_reads_the_plain_tree_with_a_default(monkeypatch) -> None:
    ctx = ctx_of(monkeypatch, _LOC)
    assert ctx.raw_at(("stages", 1, "max_model_len")) == 8
    assert ctx.raw_at(("stages", 1, "port")) is None
    assert ctx.raw_at(("stages", 1, "port"), 7) == 7


# --- Context: facts --------------------------------------------------------------------------------

def test_host_of_with_and_without_an_inventory(monkeypatch) -> None:
    text = "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n"
    ctx = ctx_of(monkeypatch, text)
    assert [ctx.host_of(n) for n in ctx.topology.stages] == ["localhost"] * 3
    inv = Inventory.from_dict({"hosts": {"a": {}, "b": {}}, "placement": {"all": "a", 1: "b"}})
    ctx = ctx_of(monkeypatch, text, ValidateOptions(inventory=inv))
    assert [ctx.host_of(n) for n in ctx.topology.stages] == ["a", "b", "a"]


def _sizes(p: dict) -> tuple:
    return tuple(p[k] for k in R.PARALLEL_SIZE_KEYS)


def test_parallel_of_an_llm_stage_nested_over_cli_over_flat(monkeypatch) -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n"
            "  - {stage_id: 0, tensor_parallel_size: 2, pipeline_parallel_size: 3, data_parallel_size: 2,"
            " prefill_context_parallel_size: 2, parallel_config: {tensor_parallel_size: 4}}\n"
            "  - {stage_id: 1, tensor_parallel_size: 2}\n")
    cli = {"tensor_parallel_size": 8, "pipeline_parallel_size": 5}
    ctx = ctx_of(monkeypatch, text, ValidateOptions(cli=cli))
    n0, n1, n2 = ctx.topology.stages
    # nested TP 4 wins over the CLI's 8 on an LLM stage; the CLI's PP 5 over the flat 3
    assert _sizes(ctx.parallel(n0)) == (4, 5, 2, 2, 1, 1, 1, 1, 1, 1)
    assert _sizes(ctx.parallel(n1)) == (8, 5, 1, 1, 1, 1, 1, 1, 1, 1)
    ctx = ctx_of(monkeypatch, text)
    assert _sizes(ctx.parallel(ctx.topology.stages[0])) == (4, 3, 2, 2, 1, 1, 1, 1, 1, 1)
    assert _sizes(ctx.parallel(ctx.topology.stages[1])) == (2, 1, 1, 1, 1, 1, 1, 1, 1, 1)


def test_parallel_reads_the_pipeline_wide_pp_and_dp_as_flat_keys(monkeypatch) -> None:
    text = ("pipeline: qwen3_omni_moe\npipeline_parallel_size: 2\ndata_parallel_size: 3\nstages:\n"
            "  - {stage_id: 0}\n  - {stage_id: 1, data_parallel_size: 1, pipeline_parallel_size: 4}\n")
    ctx = ctx_of(monkeypatch, text)
    n0, n1, _ = ctx.topology.stages
    assert _sizes(ctx.parallel(n0))[:3] == (1, 2, 3)
    assert _sizes(ctx.parallel(n1))[:3] == (1, 4, 1)
    assert ctx.world_size(n0) == (6, "TP 1 x PP 2 x DP 3")


def _diffusion(ctx: Context) -> Context:
    """``ctx`` with stage 0 of its pipeline a diffusion stage (no catalogued pipeline has one)."""
    import dataclasses

    pipe = ctx.topology.pipeline
    stages = (dataclasses.replace(pipe.stages[0], execution_type="Diffusion"),) + tuple(pipe.stages[1:])
    topo = dataclasses.replace(ctx.topology, pipeline=dataclasses.replace(pipe, stages=stages))
    return dataclasses.replace(ctx, topology=topo)


def test_a_diffusion_stage_of_the_pipeline_takes_the_cli_over_nested(monkeypatch) -> None:
    text = "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, parallel_config: {tensor_parallel_size: 4}}\n"
    ctx = _diffusion(ctx_of(monkeypatch, text, ValidateOptions(cli={"tensor_parallel_size": 8})))
    n0, n1, _ = ctx.topology.stages
    assert (ctx.is_diffusion(n0), ctx.is_diffusion(n1)) == (True, False)
    assert ctx.parallel(n0)["tensor_parallel_size"] == 8
    assert ctx.stage_kind_known(n0) is False and ctx.stage_kind_known(n1) is True


def test_without_a_topology_only_the_keys_decide(monkeypatch) -> None:
    ctx = ctx_of(monkeypatch, "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, cfg_parallel_size: 2}\n"
                              "  - {stage_id: 1}\n")
    n0, n1, _ = ctx.topology.stages
    bare = Context(doc=ctx.doc, config=None, topology=None, target=ctx.target)
    assert (bare.is_diffusion(n0), bare.is_diffusion(n1)) == (True, False)
    assert bare.stage_kind_known(n1) is False


def test_parallel_of_a_diffusion_stage_cli_over_nested_over_flat(monkeypatch) -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n"
            "  - {stage_id: 0, cfg_parallel_size: 2, ulysses_degree: 3, parallel_config: {tensor_parallel_size: 4,"
            " ring_degree: 2, ulysses_degree: 5}}\n")
    ctx = ctx_of(monkeypatch, text, ValidateOptions(cli={"tensor_parallel_size": 8}))
    n0 = ctx.topology.stages[0]
    assert ctx.is_diffusion(n0)
    p = ctx.parallel(n0)
    assert (p["tensor_parallel_size"], p["cfg_parallel_size"], p["ulysses_degree"], p["ring_degree"]) == (8, 2, 5, 2)
    # bad values count as 1
    bad = "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, parallel_config: {tensor_parallel_size: x}}\n"
    assert ctx_of(monkeypatch, bad).parallel(ctx_of(monkeypatch, bad).topology.stages[0])["tensor_parallel_size"] == 1


@pytest.mark.parametrize(("stage", "diffusion"), [
    ("{stage_id: 0}", False), ("{stage_id: 0, cfg_parallel_size: 1}", True),
    ("{stage_id: 0, parallel_config: {ulysses_degree: 1}}", True), ("{stage_id: 0, use_hsdp: false}", True),
    ("{stage_id: 0, parallel_config: {tensor_parallel_size: 2}}", False),
    ("{stage_id: 0, parallel_config: [ring_degree]}", False)])
def test_is_diffusion_from_diffusion_only_keys_flat_or_nested(monkeypatch, stage, diffusion) -> None:
    ctx = ctx_of(monkeypatch, "pipeline: qwen3_omni_moe\nstages:\n  - " + stage + "\n")
    assert ctx.is_diffusion(ctx.topology.stages[0]) is diffusion


@pytest.mark.parametrize(("stage", "world", "how"), [
    ("{stage_id: 0}", 1, "TP 1 x PP 1 x DP 1"),
    ("{stage_id: 0, tensor_parallel_size: 2, data_parallel_size: 3}", 6, "TP 2 x PP 1 x DP 3"),
    ("{stage_id: 0, prefill_context_parallel_size: 2, cfg_parallel_size: 2}", 4, "TP 1 x PP 1 x DP 1 x PCP 2 x CFG 2"),
    ("{stage_id: 0, parallel_config: {ulysses_degree: 2, ring_degree: 3}}", 6, "TP 1 x PP 1 x DP 1 x SP 6"),
    ("{stage_id: 0, parallel_config: {ulysses_degree: 2, ring_degree: 3, allgather_degree: 4}}", 4,
     "TP 1 x PP 1 x DP 1 x SP 4"),
    ("{stage_id: 0, parallel_config: {allgather_degree: 1, ulysses_degree: 2}}", 2, "TP 1 x PP 1 x DP 1 x SP 2"),
    ("{stage_id: 0, parallel_config: {use_hsdp: true, hsdp_replicate_size: 2, hsdp_shard_size: 3}}", 6, "HSDP 2 x 3"),
    ("{stage_id: 0, use_hsdp: true, hsdp_replicate_size: 2, hsdp_shard_size: 3}", 6, "HSDP 2 x 3"),
    ("{stage_id: 0, use_hsdp: true, parallel_config: {use_hsdp: false}, hsdp_shard_size: 3}", 1, "TP 1 x PP 1 x DP 1"),
    ("{stage_id: 0, parallel_config: {use_hsdp: true, hsdp_shard_size: 0}}", 1, "TP 1 x PP 1 x DP 1"),
    ("{stage_id: 0, use_hsdp: true, tensor_parallel_size: 2, hsdp_shard_size: 3}", 2, "TP 2 x PP 1 x DP 1"),
    # an explicit shard size of 1 is standalone HSDP too (data.py: world = replicate x shard when the rest is 1)
    ("{stage_id: 0, use_hsdp: true, hsdp_replicate_size: 2, hsdp_shard_size: 1}", 2, "HSDP 2 x 1"),
    # engine_args is untyped: a parallel_config that is not a mapping reaches the rules and is not the nested block
    ("{stage_id: 0, use_hsdp: true, hsdp_shard_size: 2, engine_args: {parallel_config: [a]}}", 2, "HSDP 1 x 2")])
def test_world_size_as_vllm_omni_computes_it(monkeypatch, stage, world, how) -> None:
    ctx = ctx_of(monkeypatch, "pipeline: qwen3_omni_moe\nstages:\n  - " + stage + "\n")
    assert ctx.world_size(ctx.topology.stages[0]) == (world, how)


def test_world_size_reads_use_hsdp_from_the_cli_first(monkeypatch) -> None:
    text = "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, parallel_config: {hsdp_replicate_size: 2, hsdp_shard_size: 2}}\n"
    ctx = ctx_of(monkeypatch, text, ValidateOptions(cli={"use_hsdp": True}))
    assert ctx.world_size(ctx.topology.stages[0]) == (4, "HSDP 2 x 2")


def test_stage_sizes_and_settings_with_cli_precedence(monkeypatch) -> None:
    text = ("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, tensor_parallel_size: 2, pipeline_parallel_size: 3,"
            " data_parallel_size: 4, max_model_len: 100}\n")
    ctx = ctx_of(monkeypatch, text)
    n = ctx.topology.stages[0]
    assert (ctx.stage_tp(n), ctx.stage_pp(n), ctx.stage_dp(n)) == (2, 3, 4)
    assert (ctx.setting(n, "max_model_len"), ctx.setting(n, "dtype"), ctx.setting(n, "dtype", "auto")) == (100, None,
                                                                                                          "auto")
    cli = {"tensor_parallel_size": 5, "pipeline_parallel_size": 6, "data_parallel_size": 7, "max_model_len": 9,
           "dtype": None}
    ctx = ctx_of(monkeypatch, text, ValidateOptions(cli=cli))
    n = ctx.topology.stages[0]
    assert (ctx.stage_tp(n), ctx.stage_pp(n), ctx.stage_dp(n)) == (5, 6, 7)
    assert (ctx.setting(n, "max_model_len"), ctx.setting(n, "dtype", "auto")) == (9, None)


def test_catalogue_kind_pair_and_launcher(monkeypatch) -> None:
    pd = ("pipeline: qwen3_omni_moe_thinker_only_pd\nasync_chunk: false\nstages:\n"
          "  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n")
    ctx = ctx_of(monkeypatch, pd)
    p, d = ctx.topology.stages
    assert ctx.catalogued and ctx.stage_kind_known(p)
    assert ctx.pd_pair == (p, d) and ctx.launcher == "vllm"
    three = ctx_of(monkeypatch, "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0}\n")
    assert three.launcher == "vllm-omni" and three.pd_pair is None and three.catalogued
    assert [three.stage_kind_known(n) for n in three.topology.stages] == [True, True, True]  # LLM_AR, LLM_GENERATION
    chain = ctx_of(monkeypatch, "stages:\n  - stage_id: 0\n  - stage_id: 1\n")
    assert not chain.catalogued and not chain.stage_kind_known(chain.topology.stages[0])
    none = Context(doc=None, config=None, topology=None, target=three.target)
    assert (none.pd_pair, none.launcher, none.catalogued) == (None, None, False)


# --- run_rules --------------------------------------------------------------------------------------

def test_run_rules_skips_rules_of_the_other_runtime_and_turns_a_crash_into_opd000(monkeypatch) -> None:
    real = ctx_of(monkeypatch, "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0}\n")
    monkeypatch.undo()
    said = lambda code: (lambda ctx, r: [r.diag(code, None)])  # noqa: E731

    def boom(ctx, r):
        raise KeyError("x")

    rules = [_r(code="OPD991", check=said("a")), _r(code="OPD992", check=said("b"), runtime="vllm"),
             _r(code="OPD993", check=said("c"), runtime="vllm-omni"), _r(code="OPD994", check=boom)]
    monkeypatch.delenv("OMNI_PD_DEBUG", raising=False)
    out = run_rules(real, rules)
    assert [(d.code, d.severity, d.message, d.help) for d in out] == [
        ("OPD991", Severity.WARNING, "a", None), ("OPD993", Severity.WARNING, "c", None),
        ("OPD000", Severity.ERROR, "internal error in rule OPD994: KeyError: 'x'",
         "this is a bug in omni-pd; rerun with OMNI_PD_DEBUG=1")]
    # no topology: every runtime's rules run
    bare = Context(doc=None, config=None, topology=None, target=real.target)
    assert [d.code for d in run_rules(bare, rules[:3])] == ["OPD991", "OPD992", "OPD993"]
    monkeypatch.setenv("OMNI_PD_DEBUG", "1")
    with pytest.raises(KeyError):
        run_rules(real, rules)


def test_run_rules_defaults_to_every_registered_rule(monkeypatch) -> None:
    seen: list[str] = []
    fake = {c: _r(code=c, check=lambda ctx, r: seen.append(r.code) or []) for c in ("OPD981", "OPD982")}
    monkeypatch.setattr(R, "registry", lambda: fake)
    bare = Context(doc=None, config=None, topology=None, target=None)
    assert run_rules(bare) == [] and seen == ["OPD981", "OPD982"]
