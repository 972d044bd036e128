"""`omni-pd expand --encoder-split`: encoder disaggregation (E -> PD, E -> P -> D), exact values."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.cli import main
from omni_pd.compile.expand import expand_encoder_document
from omni_pd.compile.passes.encoder_split import EncoderOptions
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.compile.pipelines import derive_encoder, load_catalogue
from omni_pd.diagnostics import OmniPdError, Severity
from omni_pd.io import load_file, parse_text

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "encoder"
FIX = ROOT / "tests" / "fixtures"
THINKER = FIX / "qwen3_omni_moe_thinker_only_cpu.yaml"
NIXL = ExpandOptions(connector="NixlConnector", kv_buffer_device="cpu")


def run_cli(args, capsys):
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        rc = main(args)
    finally:
        os.chdir(old)
    return (rc, *capsys.readouterr())


def exp(path=THINKER, layout="1e1p1d", opts=NIXL, **kw):
    eo = {k: kw.pop(k) for k in ("ec_connector", "storage", "encoder_devices") if k in kw}
    return expand_encoder_document(load_file(path), EncoderOptions(layout, **eo), opts, **kw)


def stage(res, sid):
    return next(s for s in res.config.stages if s.stage_id == sid).model_dump(by_alias=True, exclude_unset=True)


@pytest.mark.parametrize("args,golden", [
    (["expand", "-q", str(THINKER.relative_to(ROOT)), "--encoder-split", "1e1p1d", "--connector", "NixlConnector",
      "--kv-buffer-device", "cpu"], "qwen3_omni_thinker_1e1p1d.yaml"),
    (["expand", "-q", str(THINKER.relative_to(ROOT)), "--encoder-split", "1e1pd"], "qwen3_omni_thinker_1e1pd.yaml"),
    (["expand", "-q", "tests/fixtures/llm.yaml", "--pipeline", "llm", "--encoder-split", "1e1p1d",
      "--vllm-version", "0.24"], "llm_1e1p1d_mooncake_v024.yaml"),
])
def test_golden(args, golden, capsys):
    rc, out, err = run_cli(args, capsys)
    assert rc == 0, err
    assert out == (GOLDEN / golden).read_text(encoding="utf-8")


@pytest.mark.parametrize("golden", sorted(p.name for p in GOLDEN.glob("*.yaml")))
def test_goldens_validate_clean(golden):
    text = (GOLDEN / golden).read_text()
    vv = "0.24" if "v024" in golden else None
    res = validate_text(text, golden, ValidateOptions(vllm_version=vv))
    assert [(d.code, d.message) for d in res.diagnostics if d.severity is not Severity.INFO] == []


def test_1e1p1d_roles_edges_and_devices():
    res = exp()
    assert res.plan.target_pipeline.name == "qwen3_omni_moe_thinker_only_1e1p1d"
    assert [(s.stage_id, s.role, s.pd_role, s.input_sources) for s in res.plan.target_pipeline.stages] == [
        (0, "encoder", None, ()), (1, "thinker", "prefill", (0,)), (2, "thinker", "decode", (1,))]
    e, p, d = stage(res, 0), stage(res, 1), stage(res, 2)
    assert e["ec_transfer_config"] == {"ec_connector": "ECExampleConnector", "ec_role": "ec_producer",
                                       "engine_id": "omni-thinker-encoder",
                                       "ec_connector_extra_config": {"shared_storage_path": "/tmp/omni-pd-ec"}}
    assert "kv_transfer_config" not in e and "mm_encoder_only" not in e  # 0.30 switches it on itself
    assert (e["devices"], p["devices"], d["devices"]) == ("2", "0", "1")
    assert p["ec_transfer_config"]["ec_role"] == "ec_consumer" and p["kv_transfer_config"]["kv_role"] == "kv_producer"
    assert "ec_transfer_config" not in d and d["kv_transfer_config"]["kv_role"] == "kv_consumer"
    assert [(x.from_, x.to) if hasattr(x, "from_") else tuple(x.model_dump(by_alias=True).values())[:2]
            for x in res.config.edges] == [(0, 1), (1, 2)]
    # E copies the model keys of the Thinker entry, nothing of its serving layout
    assert {k: e[k] for k in ("max_model_len", "max_num_seqs", "enforce_eager", "dtype")} == {
        "max_model_len": 2048, "max_num_seqs": 4, "enforce_eager": True, "dtype": "float32"}


def test_1e1pd_consumer_is_the_combined_instance():
    res = exp(layout="1e1pd", opts=ExpandOptions())
    assert res.plan.pd is None
    e, c = stage(res, 0), stage(res, 1)
    assert c["ec_transfer_config"]["ec_role"] == "ec_consumer" and "kv_transfer_config" not in c
    assert (e["devices"], c["devices"]) == ("1", "0")
    assert res.text.count("ec_transfer_config") == 2


@pytest.mark.parametrize("version,flag", [("0.13", False), ("0.18", True), ("0.29", True), ("0.30", False)])
def test_mm_encoder_only_where_the_release_needs_it(version, flag):
    res = exp(layout="1e1pd", opts=ExpandOptions(), vllm_version=version)
    assert ("mm_encoder_only" in stage(res, 0)) is flag


def test_storage_and_encoder_devices_options():
    res = exp(storage="/shared/ec", encoder_devices=(0,))
    assert stage(res, 0)["ec_transfer_config"]["ec_connector_extra_config"] == {"shared_storage_path": "/shared/ec"}
    assert stage(res, 1)["ec_transfer_config"]["ec_connector_extra_config"] == {"shared_storage_path": "/shared/ec"}
    assert stage(res, 0)["devices"] == "0"
    assert [(d.code, d.message) for d in res.diagnostics if d.code == "OPD903"] == [
        ("OPD903", "the encoder shares device(s) 0 with the language model")]


def test_full_omni_pipeline_is_refused_with_the_reason(capsys):
    rc, out, err = run_cli(["expand", "--encoder-split", "1e1p1d"], capsys)
    assert rc == 2 and out == ""
    assert "error[OPD806]: pipeline `qwen3_omni_moe` (thinker -> talker -> code2wav) cannot take an encoder split" in err
    assert "its orchestrator forwards a stage's outputs to the next stage as its prompt" in err
    assert "serve `qwen3_omni_moe_thinker_only`" in err


@pytest.mark.parametrize("kw,code,text", [
    ({"ec_connector": "ECMooncakeConnector"}, "OPD807", "expand does not emit it yet"),
    ({"ec_connector": "ECNope"}, "OPD807", "no EC connector contract for `ECNope`"),
])
def test_connector_refusals(kw, code, text):
    with pytest.raises(OmniPdError) as ei:
        exp(**kw)
    assert ei.value.diagnostic.code == code and text in ei.value.diagnostic.message


def test_already_split_is_refused():
    text = (GOLDEN / "qwen3_omni_thinker_1e1pd.yaml").read_text()
    with pytest.raises(OmniPdError) as ei:
        expand_encoder_document(parse_text(text, "e.yaml"), EncoderOptions("1e1p1d"), NIXL)
    assert ei.value.diagnostic.code == "OPD803"


def test_catalogue_has_encoder_variants_only_for_plain_vllm_pipelines():
    cat = load_catalogue()
    names = {n for n in cat.names() if n.endswith(("_1e1pd", "_1e1p1d"))}
    assert names == {f"{b}_{lay}" for b in ("llm", "qwen2_5_omni_thinker_only", "qwen3_omni_moe_thinker_only")
                     for lay in ("1e1pd", "1e1p1d")}
    p = cat.get("llm_1e1p1d")
    assert p.encoder.stage_id == 0 and p.ec_consumer.stage_id == 1 and p.pd_pair == (1, 2) and p.split_stage is None
    with pytest.raises(ValueError):
        derive_encoder(cat.get("qwen3_omni_moe"), "1e1pd")


def test_validate_flags_consumer_on_decode_in_expanded_file():
    text = (GOLDEN / "qwen3_omni_thinker_1e1p1d.yaml").read_text()
    # move the consumer from prefill to decode: prefill re-encodes (OPD616)
    lines = text.splitlines(keepends=True)
    i = next(k for k, ln in enumerate(lines) if "ec_role: ec_consumer" in ln)
    block = lines[i - 2:i + 4]  # ec_transfer_config: ... shared_storage_path
    assert block[0].strip() == "ec_transfer_config:"
    rest = lines[:i - 2] + lines[i + 4:]
    j = next(k for k, ln in enumerate(rest) if "engine_id: omni-thinker-decode" in ln)
    bad = "".join(rest[:j + 2] + block + rest[j + 2:])
    res = validate_text(bad, "bad.yaml", ValidateOptions())
    got = [(d.code, d.severity, d.location.line) for d in res.diagnostics if d.code == "OPD616"]  # 24: `- stage_id: 1`
    assert got == [("OPD616", Severity.ERROR, 24), ("OPD616", Severity.ERROR, bad.splitlines().index(
        "      ec_role: ec_consumer") + 1)]


def test_graph_shows_the_encoder_and_both_transfers(capsys):
    rc, out, err = run_cli(["graph", "tests/golden/encoder/qwen3_omni_thinker_1e1p1d.yaml"], capsys)
    assert rc == 0, err
    assert out == (GOLDEN / "graph_1e1p1d.txt").read_text(encoding="utf-8")


def test_pd_half_uses_the_plain_vllm_runtime_facts():
    """A thinker-only pipeline is vllm-omni's, but its encoder split is served by plain
    `vllm serve`: Mooncake's bootstrap port goes to the env only (vLLM reads nothing else;
    a `bootstrap_port` extra key would be OPD505). Fails without the runtime swap in
    plan_encoder_split."""
    text = ("pipeline: qwen3_omni_moe_thinker_only\n"
            "stages:\n  - {stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2, enforce_eager: true}\n")
    res = expand_encoder_document(parse_text(text, "thinking.yaml"), EncoderOptions("1e1p1d"))
    p = stage(res, 1)
    assert p["kv_transfer_config"]["kv_connector"] == "MooncakeConnector"
    assert "kv_connector_extra_config" not in p["kv_transfer_config"]
    assert p["env"] == {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "25201"}
    assert (stage(res, 0)["devices"], p["devices"], stage(res, 2)["devices"]) == ("4", "0,1", "2,3")
    out = validate_text(res.text, "out.yaml", ValidateOptions())
    assert [(d.code, d.message) for d in out.diagnostics if d.severity is not Severity.INFO] == []


@pytest.mark.parametrize("layout", ["1e1pd", "1e1p1d"])
@pytest.mark.parametrize("connector", ["MooncakeConnector", "NixlConnector"])
def test_wheel_thinker_only_config_splits_clean(omni_wheel_deploy_dir, layout, connector):
    """vllm-omni 0.30.0's own thinker-only deploy file (TP 2 on "0,1") under both layouts:
    validate (every platform) finds nothing but infos; the full omni files are refused."""
    path = omni_wheel_deploy_dir / "qwen3_omni_moe_thinking.yaml"
    res = expand_encoder_document(load_file(path), EncoderOptions(layout), ExpandOptions(connector=connector))
    out = validate_text(res.text, "out.yaml", ValidateOptions(all_platforms=True))
    assert [(d.code, d.message) for d in out.diagnostics if d.severity is not Severity.INFO] == []
    assert stage(res, 0)["devices"] == ("2" if layout == "1e1pd" else "4")
    for name in ("qwen3_omni_moe.yaml", "qwen2_5_omni.yaml"):
        with pytest.raises(OmniPdError) as ei:
            expand_encoder_document(load_file(omni_wheel_deploy_dir / name), EncoderOptions(layout))
        assert ei.value.diagnostic.code == "OPD806"


@pytest.mark.parametrize("args,msg", [
    (["--encoder-split", "epd"], "error[OPD006]: --encoder-split epd: not an encoder layout"),
    (["--ec-storage-path", "/x"], "error[OPD006]: --ec-storage-path /x: applies only with --encoder-split"),
    (["--encoder-devices", "3"], "error[OPD006]: --encoder-devices 3: applies only with --encoder-split"),
    (["--ec-connector", "ECExampleConnector"], "error[OPD006]: --ec-connector ECExampleConnector: applies only with --encoder-split"),
])
def test_encoder_options_are_checked_before_reading(args, msg, capsys):
    rc, out, err = run_cli(["expand", "tests/fixtures/llm.yaml", "--pipeline", "llm", *args], capsys)
    assert rc == 2 and out == "" and err.splitlines()[0] == msg


@pytest.mark.parametrize("option", [
    ["--tp", "2"], ["--decode-tp", "2"], ["--prefill-dp", "2"], ["--prefill-replicas", "2"],
    ["--connector", "NixlConnector"], ["--prefill-devices", "3"], ["--downstream-devices", "3"],
    ["--kv-host", "10.0.0.1"], ["--port-base", "30000"], ["--mooncake-protocol", "tcp"],
    ["--kv-buffer-device", "cpu"]])
def test_1e1pd_refuses_the_prefill_decode_options_it_used_to_drop(option, capsys):
    """E -> PD has no prefill/decode pair: each of these options was dropped without a word
    (the output was byte for byte the one without it); now a usage error naming it."""
    rc, out, err = run_cli(["expand", "tests/fixtures/llm.yaml", "--pipeline", "llm", "--encoder-split", "1e1pd",
                            *option], capsys)
    assert (rc, out) == (2, "")
    assert err.splitlines()[0] == (f"error[OPD006]: {option[0]} {option[1]}: has no prefill/decode pair to apply to: "
                                   "--encoder-split 1e1pd is an encoder and one instance that runs prefill and "
                                   "decode itself")


def test_1e1p1d_still_takes_the_pair_options(capsys):
    rc, out, err = run_cli(["expand", "tests/fixtures/llm.yaml", "--pipeline", "llm", "--encoder-split", "1e1p1d",
                            "--tp", "2", "-q"], capsys)
    assert rc == 0, err
    assert out.count("tensor_parallel_size: 2") == 2


def test_thinker_only_encoder_split_of_a_full_file_narrows_first(tmp_path, capsys):
    """OPD806's help for the three-stage pipelines says to serve `*_thinker_only` with
    --encoder-split; on a full file that ended in OPD000 (exit 3): the encoder path did not
    take the Thinker out first (OPD202 on stage 2) as the PD path does (OPD905)."""
    from ruamel.yaml import YAML

    yaml = YAML()
    tree = yaml.load((ROOT / "presets" / "qwen3_omni_moe.yaml").read_text())
    del tree["platforms"]
    full = tmp_path / "q3o.yaml"
    with full.open("w") as f:
        yaml.dump(tree, f)
    for layout, stages in (("1e1pd", 2), ("1e1p1d", 3)):
        out = tmp_path / f"{layout}.yaml"
        rc, _, err = run_cli(["expand", str(full), "--pipeline", "qwen3_omni_moe_thinker_only", "--encoder-split",
                              layout, "-o", str(out)], capsys)
        assert rc == 0, err
        assert "info[OPD905]" in err
        doc = load_file(out)
        assert [s["stage_id"] for s in doc.tree["stages"]] == list(range(stages))
        assert doc.tree["pipeline"] == f"qwen3_omni_moe_thinker_only_{layout}"
        assert "# Thinker only (--pipeline qwen3_omni_moe_thinker_only): the input's other stages are left out.\n" \
            in out.read_text()
        rc, vout, verr = run_cli(["validate", str(out)], capsys)
        assert rc == 0, vout + verr


def test_an_encoder_split_refuses_overlays_of_the_split_stage(capsys):
    """The bundled preset's platforms.cuda/npu/xpu override the Thinker; E's devices and the
    split's ports are allocated on the base only, so the overlays would collide (OPD404 on
    xpu, OPD501 on npu: an internal error before). A usage error now."""
    rc, out, err = run_cli(["expand", "--pipeline", "qwen3_omni_moe_thinker_only", "--encoder-split", "1e1pd"],
                           capsys)
    assert (rc, out) == (2, "")
    assert err.splitlines()[0] == ("error[OPD806]: --encoder-split does not rewrite platform overlays yet: "
                                   "platforms.cuda, platforms.npu, platforms.xpu override stage 0 (thinker)")
    assert "= help: remove the `platforms:` entries of this stage" in err
