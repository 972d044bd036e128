"""Issue 35: `--vllm-version 0.34` and the facts of vLLM 0.32-0.34 / vllm-omni 0.31+, each
pinned at its release boundary (one release on each side), plus connector identity from
``kv_connector_module_path`` (omni_pd/compile/connectors/identity.py).

Facts: shared/reference/upstream_2026_12.md (vllm 0.33.0 vs 0.34.0 wheels, vllm-omni release
notes), presets/targets/{vllm,kv_semantics,output_types,ec_connectors,nixl_lease}.yaml.
"""

from __future__ import annotations

import pytest

from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.compile.connectors.identity import ConnectorIdentity, identify
from omni_pd.compile.targets import target
from omni_pd.compile.versions import known_target, known_vllm_versions
from rule_found import col, found

EXTRA = "kv_connector_extra_config"
ASCEND_MC = "vllm_ascend.distributed.kv_transfer.kv_p2p.mooncake_connector"


def pair(c: str = "NixlConnector", p: str = "", d: str = "", ps: str = "", ds: str = "", dc: str | None = None) -> str:
    return ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
            f"  - {{stage_id: 0, devices: \"0\"{ps}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_producer, "
            f"engine_id: p0{p}}}}}\n"
            f"  - {{stage_id: 1, devices: \"1\", env: {{VLLM_NIXL_SIDE_CHANNEL_PORT: \"5700\"}}{ds}, kv_transfer_config: "
            f"{{kv_connector: {dc or c}, kv_role: kv_consumer, engine_id: d0{d}}}}}\n")


def extra(**kw) -> str:
    return f", {EXTRA}: {{" + ", ".join(f"{k}: {v}" for k, v in kw.items()) + "}"


def opts(v: str | None) -> ValidateOptions:
    return ValidateOptions(vllm_version=v)


# --- the release range -----------------------------------------------------------------------------

def test_0_34_is_the_newest_known_release_and_0_35_is_refused() -> None:
    assert known_vllm_versions()[-1] == "0.34" and "0.33" in known_vllm_versions()
    assert known_target("0.34").label == "0.34"
    with pytest.raises(ValueError, match=r"known versions: 0.11 to 0.34"):
        known_target("0.35")


def test_validate_cli_accepts_vllm_version_0_34(tmp_path, capsys) -> None:
    from omni_pd.cli import main

    f = tmp_path / "pd.yaml"
    f.write_text(pair())
    assert main(["validate", str(f), "--vllm-version", "0.34"]) == 0
    assert main(["validate", str(f), "--vllm-version", "0.35"]) == 2
    assert "--vllm-version 0.35: omni-pd has no facts for vLLM 0.35; known versions: 0.11 to 0.34" in capsys.readouterr().err


def test_expand_writes_a_0_34_pair(tmp_path) -> None:
    from omni_pd.cli import main
    from omni_pd.resources import preset_path

    out = tmp_path / "pd.yaml"
    assert main(["expand", str(preset_path("qwen3_omni_moe")), "--vllm-version", "0.34", "-o", str(out)]) == 0
    assert [d.message for d in validate_text(out.read_text(), "pd.yaml", opts("0.34")).errors] == []


@pytest.mark.parametrize(("version", "registered"), [("0.33", False), ("0.34", True)])
def test_umbp_store_connector_is_registered_from_0_34(version: str, registered: bool) -> None:
    assert ("UMBPStoreConnector" in target(version).connectors()) is registered
    got = found(pair("UMBPStoreConnector"), "OPD601", opts=opts(version))
    assert got == [] if registered else [g[1] for g in got] == [
        "stage 0: UMBPStoreConnector is not available in vLLM 0.33 (added in vLLM 0.34)",
        "stage 1: UMBPStoreConnector is not available in vLLM 0.33 (added in vLLM 0.34)"]


@pytest.mark.parametrize(("version", "nixl"), [("0.32", None), ("0.33", 15), ("0.34", 16)])
def test_nixl_connector_version_per_release(version: str, nixl: int | None) -> None:
    assert target(version).nixl_connector_version == nixl


@pytest.mark.parametrize(("version", "fires"), [("0.31", False), ("0.32", True), ("0.34", True)])
def test_removed_kv_fields_are_errors_from_0_32(version: str, fires: bool) -> None:
    text = pair(p=", kv_buffer_size: 1.0e9, kv_ip: 10.0.0.1")
    got = found(text, "OPD609", opts=opts(version))
    if not fires:
        assert [g for g in got if g[0] != "info"] == []
        return
    assert [(g[0], g[1]) for g in got] == [
        ("error", f"stage 0: `kv_buffer_size` was removed from KVTransferConfig in vLLM 0.32; judged for vLLM {version}"),
        ("error", f"stage 0: `kv_ip` was removed from KVTransferConfig in vLLM 0.32; judged for vLLM {version}")]


def test_every_release_pinned_facts_reach_the_newest_known_release() -> None:
    """A fact file that says which release it was read up to (``until``) must cover the newest
    release ``--vllm-version`` accepts, and every ``since`` of the 0.34 facts is a known release."""
    from omni_pd.check.rules import nixl_lease
    from omni_pd.check.rules._kv_release import facts as kv_facts

    last = known_vllm_versions()[-1]
    assert nixl_lease.facts().until == last
    for section, f in kv_facts().items():
        assert str(f.get("since") or f.get("from_children_since")) in known_vllm_versions(), section


# --- OPD626 NIXL transfer_mode ------------------------------------------------------------------

def test_opd626_push_on_0_33_silently_pulls_and_says_how_to_push() -> None:
    text = pair(p=extra(transfer_mode="push"), d=extra(transfer_mode="push"))
    got = found(text, "OPD626", opts=opts("0.33"))
    line, c = col(text, "push")
    assert got[0] == ("warning", "prefill (stage 0): vLLM 0.33 ignores kv_connector_extra_config.transfer_mode (read "
                      "from vLLM 0.34): NixlConnector pulls (this push config silently pulls)", (line, c),
                      "write kv_connector: NixlPushConnector on both sides to push there, or pass --vllm-version 0.34 "
                      "if the engines run it", [])
    assert len(got) == 2 and found(text, "OPD626", opts=opts("0.34")) == []


def test_opd626_mode_mismatch_on_0_34_only() -> None:
    text = pair(p=extra(transfer_mode="push"))
    got = found(text, "OPD626", opts=opts("0.34"))
    assert [(g[0], g[1], g[3]) for g in got] == [
        ("error", "prefill (stage 0) runs NIXL push and decode (stage 1) pull on vLLM 0.34: pull and push never pair "
                  "(the transfer mode is in NIXL's handshake compat hash, connector version 16), so every request "
                  "fails the handshake", "set kv_connector_extra_config.transfer_mode: push on both sides")]
    assert got[0][2] == col(text, "push")
    assert [g[0] for g in found(text, "OPD626", opts=opts("0.33"))] == ["warning"]


def test_opd626_says_which_release_it_assumed() -> None:
    got = found(pair(p=extra(transfer_mode="push")), "OPD626", opts=opts(None))
    assert "vLLM 0.30 (assumed: no --vllm-version given; pass --vllm-version X.Y) ignores" in got[0][1]


def test_opd626_module_path_to_another_package_is_not_vllms_nixl() -> None:
    mod = ", kv_connector_module_path: my_pkg.nixl"
    assert found(pair(p=extra(transfer_mode="write") + mod, d=mod), "OPD626", opts=opts("0.34")) == []


# --- OPD627 Mooncake kv_lease_duration ----------------------------------------------------------

@pytest.mark.parametrize(("version", "want"), [
    ("0.33", [("warning", "prefill (stage 0): vLLM 0.33's MooncakeConnector ignores kv_lease_duration (read from vLLM "
                          "0.34): prefill holds un-pulled KV for VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (480 s)")]),
    ("0.34", [("error", "prefill (stage 0) sets kv_lease_duration and decode (stage 1) does not: on vLLM 0.34 decode "
                        "sends no lease heartbeats, so prefill frees the KV after 30 s instead of 480 s and a late pull "
                        "fails (\"KV expired on P side before the pull.\")")]),
])
def test_opd627_release_boundary(version: str, want: list) -> None:
    got = found(pair("MooncakeConnector", p=extra(kv_lease_duration=30)), "OPD627", opts=opts(version))
    assert [(g[0], g[1]) for g in got] == want


def test_opd627_vllm_ascend_class_by_module_path_is_not_judged() -> None:
    text = pair("MooncakeConnector", p=extra(kv_lease_duration=30) + f", kv_connector_module_path: {ASCEND_MC}",
                d=f", kv_connector_module_path: {ASCEND_MC}")
    assert found(text, "OPD627", opts=opts("0.34")) == []


def test_opd627_both_sides_pass_and_a_string_lease_is_an_error() -> None:
    assert found(pair("MooncakeConnector", p=extra(kv_lease_duration=30), d=extra(kv_lease_duration=30)),
                 "OPD627", opts=opts("0.34")) == []
    got = found(pair("MooncakeConnector", p=extra(kv_lease_duration='"30"'), d=extra(kv_lease_duration=30)),
                "OPD627", opts=opts("0.34"))
    assert [(g[0], g[1]) for g in got] == [("error", "prefill (stage 0): kv_lease_duration '30': vLLM 0.34's "
                                            "MooncakeConnector needs a number of seconds greater than 0")]


# --- OPD628 MultiConnector role -----------------------------------------------------------------

def _multi(pk: str = "kv_producer", dk: str = "kv_consumer") -> str:
    def side(i: int, top: str, kid: str) -> str:
        return (f"  - {{stage_id: {i}, devices: \"{i}\", env: {{VLLM_NIXL_SIDE_CHANNEL_PORT: \"{5600 + 100 * i}\"}}, "
                f"kv_transfer_config: {{kv_connector: MultiConnector, kv_role: {top}, engine_id: e{i}, {EXTRA}: "
                f"{{connectors: [{{kv_connector: NixlConnector, kv_role: {kid}}}]}}}}}}\n")
    return "pipeline: llm_pd\nasync_chunk: false\nstages:\n" + side(0, "kv_producer", pk) + side(1, "kv_consumer", dk)


@pytest.mark.parametrize(("version", "want"), [
    ("0.33", [("warning", "prefill (stage 0): MultiConnector's top-level kv_role kv_producer makes it a producer up to "
                          "vLLM 0.33, its children's roles make it a consumer from vLLM 0.34; vLLM 0.33 uses the "
                          "top-level kv_role (a producer)")]),
    ("0.34", [("error", "prefill (stage 0): on vLLM 0.34 MultiConnector's role comes from its children, which make it "
                        "a consumer only: the prefill does not produce KV (top-level kv_role kv_producer no longer "
                        "decides)")]),
])
def test_opd628_release_boundary(version: str, want: list) -> None:
    got = found(_multi(pk="kv_consumer"), "OPD628", opts=opts(version))
    assert [(g[0], g[1]) for g in got] == want


def test_opd628_on_npu_the_name_is_vllm_ascends_multi_connector() -> None:
    assert identify({"kv_connector": "MultiConnector"}, "npu").package == "vllm-ascend"
    assert found(_multi(pk="kv_consumer"), "OPD628", opts=ValidateOptions(vllm_version="0.34", platform="npu")) == []


# --- OPD629 extensible KV cache -------------------------------------------------------------------

@pytest.mark.parametrize(("version", "fires"), [("0.33", False), ("0.34", True)])
def test_opd629_release_boundary(version: str, fires: bool) -> None:
    text = pair("MooncakeConnector", ps=", enable_extensible_kv_cache: true, num_gpu_blocks_override: 512")
    got = found(text, "OPD629", opts=opts(version))
    assert [(g[0], g[1]) for g in got] == ([("error", "stage 0: enable_extensible_kv_cache: true with "
                                             "num_gpu_blocks_override set: vLLM 0.34 refuses the pair at engine start "
                                             "(ValueError)")] if fires else [])


def test_opd629_rocm_counts_multi_connector_children_and_skips_other_packages() -> None:
    on = ", enable_extensible_kv_cache: true"
    rocm = ValidateOptions(vllm_version="0.34", platform="rocm")
    assert [g[0] for g in found(pair(ps=on), "OPD629", opts=rocm)] == ["error"]
    assert found(pair(p=", kv_connector_module_path: my_pkg.nixl", ps=on), "OPD629", opts=rocm) == []


# --- OPD113 canonical output types -----------------------------------------------------------------

def _out(v: str) -> str:
    return f"stages:\n  - {{stage_id: 0, devices: \"0\"}}\n  - {{stage_id: 2, devices: \"1\", final_output_type: {v}}}\n"


@pytest.mark.parametrize(("version", "want"), [
    ("0.30", [("warning", "stage 2: final_output_type 'speech': vllm-omni 0.30 reads 'speech' as an alias of audio "
                          "(for vLLM 0.30); vllm-omni 0.31+ refuses the alias", "write final_output_type: audio")]),
    ("0.31", [("error", "stage 2: final_output_type 'speech' is not one of text|image|audio|latent|token_ids, the only "
                        "output types vllm-omni 0.31+ (v0.31.0rc1 and v0.32.0, GitHub releases not on PyPI) on vLLM "
                        "0.31 accepts (https://github.com/vllm-project/vllm-omni/pull/7843)",
               "write final_output_type: audio")]),
])
def test_opd113_release_boundary(version: str, want: list) -> None:
    got = found(_out("speech"), "OPD113", opts=opts(version))
    assert [(g[0], g[1], g[3]) for g in got] == want
    assert got[0][2] == col(_out("speech"), "speech")


def test_opd113_on_0_34_says_no_vllm_omni_release_was_found() -> None:
    (got,) = found(_out("images"), "OPD113", opts=opts("0.34"))
    assert "on vLLM 0.34 (no vllm-omni release for it yet: 0.32's rule assumed)" in got[1]


def test_every_catalogue_pipeline_uses_canonical_output_types() -> None:
    from omni_pd.check.rules.output_types import facts, parts
    from omni_pd.compile.pipelines import load_catalogue

    canon = set(facts()["canonical"])
    for p in load_catalogue().pipelines.values():
        for s in p.stages:
            if s.final_output_type:
                assert set(parts(s.final_output_type)) <= canon, (p.name, s.stage_id, s.final_output_type)


# --- ECCPUConnector side channel -------------------------------------------------------------------

@pytest.mark.parametrize(("version", "ports"), [("0.33", [(5601, 1)]), ("0.34", [])])
def test_ec_cpu_side_channel_is_os_assigned_from_0_34(version: str, ports: list) -> None:
    from omni_pd.compile.ec_connectors.base import ec_ports

    ec = {"ec_connector": "ECCPUConnector", "ec_role": "ec_producer"}
    v = target(version).version
    assert [(u.port, u.span) for u in ec_ports(ec, {}, 1, 2, v)] == ports
    # set explicitly: base + DP index on 0.34 (two DP ranks: two ports)
    got = [(u.port, u.span) for u in ec_ports(ec, {"VLLM_EC_SIDE_CHANNEL_PORT": "6000"}, 1, 2, v)]
    assert got == ([(6000, 1)] if version == "0.33" else [(6000, 2)])


# --- connector identity ----------------------------------------------------------------------------

@pytest.mark.parametrize(("kv", "plat", "want"), [
    ({"kv_connector": "MooncakeConnector"}, "cuda", ConnectorIdentity("MooncakeConnector", "vllm", "MooncakeConnector")),
    ({"kv_connector": "MooncakeConnector", "kv_connector_module_path": ASCEND_MC}, "cuda",
     ConnectorIdentity("MooncakeConnectorV1", "vllm-ascend", "MooncakeConnector", ASCEND_MC)),
    ({"kv_connector": "MooncakeConnector", "kv_connector_module_path": ASCEND_MC}, "npu",
     ConnectorIdentity("MooncakeConnectorV1", "vllm-ascend", "MooncakeConnector", ASCEND_MC)),
    ({"kv_connector": "MultiConnector"}, "npu", ConnectorIdentity("MultiConnector", "vllm-ascend", "MultiConnector")),
    ({"kv_connector": "NixlConnector"}, "npu", ConnectorIdentity("NixlConnector", "vllm", "NixlConnector")),
    ({"kv_connector": "MooncakeConnector", "kv_connector_module_path": "vllm_ascend.not.a.registered.module"}, "npu",
     ConnectorIdentity("vllm_ascend.not.a.registered.module:MooncakeConnector", "vllm-ascend", "MooncakeConnector",
                       "vllm_ascend.not.a.registered.module")),
    ({"kv_connector": "LMCacheMPConnector", "kv_connector_module_path": "lmcache.integration.vllm.lmcache_mp_connector"},
     "cuda", ConnectorIdentity("lmcache.integration.vllm.lmcache_mp_connector:LMCacheMPConnector", "lmcache",
                               "LMCacheMPConnector", "lmcache.integration.vllm.lmcache_mp_connector")),
    ({"kv_connector": "NixlConnector", "kv_connector_module_path": "vllm.distributed.kv_transfer.kv_connector.v1.nixl"},
     "cuda", ConnectorIdentity("NixlConnector", "vllm", "NixlConnector", "vllm.distributed.kv_transfer.kv_connector.v1.nixl")),
    ({"kv_connector": "MyConn", "kv_connector_module_path": " my_pkg.conn "}, None,
     ConnectorIdentity("my_pkg.conn:MyConn", "out-of-tree", "MyConn", "my_pkg.conn")),
])
def test_identity_from_name_module_path_and_platform(kv: dict, plat: str | None, want: ConnectorIdentity) -> None:
    assert identify(kv, plat) == want


@pytest.mark.parametrize("kv", [None, {}, {"kv_connector": ""}, {"kv_connector": 3}, {"kv_role": "kv_producer"}, "x"])
def test_identity_of_no_connector_is_none(kv) -> None:
    assert identify(kv) is None


def test_identity_rows_and_words() -> None:
    ascend = identify({"kv_connector": "MooncakeConnector", "kv_connector_module_path": ASCEND_MC})
    assert ascend is not None and ascend.vllm_row() is None and not ascend.is_vllm
    assert ascend.describe() == f"vllm-ascend's MooncakeConnectorV1 (MooncakeConnector from {ASCEND_MC})"
    vllm = identify({"kv_connector": "MooncakeConnector"})
    assert vllm is not None and vllm.vllm_row() == "MooncakeConnector" and vllm.describe() == "MooncakeConnector"


# --- the 0.30 side, read from vllm-omni 0.30.0 itself when the oracle venv is there ----------------

def _oracle_site():
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    py = os.environ.get("OMNI_PD_ORACLE_PYTHON")
    cands = [Path(py).parents[1] / "lib" / "python3.11" / "site-packages"] if py else []
    cands.append(root / ".cache" / "oracle" / "venv030" / "lib" / "python3.11" / "site-packages")
    return next((c for c in cands if (c / "vllm_omni").is_dir()), None)


def test_output_type_aliases_are_vllm_omni_030s() -> None:
    import ast

    from omni_pd.check.rules.output_types import facts

    site = _oracle_site()
    if site is None:
        pytest.skip("vllm-omni 0.30 (the oracle venv) is not installed; set OMNI_PD_ORACLE_PYTHON")
    tree = ast.parse((site / "vllm_omni" / "outputs" / "output_modality.py").read_text())
    aliases = next(ast.literal_eval(n.value) for n in ast.walk(tree)
                   if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "_MODALITY_ALIASES")
    assert aliases == facts()["aliases_until_0_30"]


def test_vllm_030_reads_neither_transfer_mode_nor_a_mooncake_lease() -> None:
    """The 0.30 side of OPD626/OPD627: vLLM 0.30's factory does not look at transfer_mode and
    its MooncakeConnector has no kv_lease_duration (both arrive in 0.34)."""
    site = _oracle_site()
    if site is None or not (site / "vllm").is_dir():
        pytest.skip("vLLM 0.30 (the oracle venv) is not installed; set OMNI_PD_ORACLE_PYTHON")
    kv = site / "vllm" / "distributed" / "kv_transfer" / "kv_connector"
    assert "transfer_mode" not in (kv / "factory.py").read_text()
    assert not any("kv_lease_duration" in f.read_text() for f in (kv / "v1" / "mooncake").glob("*.py"))
    assert found(pair(p=extra(transfer_mode="push")), "OPD626", opts=opts("0.30"))[0][0] == "warning"


# --- OPD623 (NIXL lease) reads the connector's identity --------------------------------------------

@pytest.mark.parametrize(("version", "fires"), [("0.29", False), ("0.30", True), ("0.34", True), ("0.24", False)])
def test_opd623_nixl_lease_is_judged_from_0_30_to_0_34(version: str, fires: bool) -> None:
    got = found(pair(p=extra(kv_lease_duration=0)), "OPD623", opts=opts(version))
    assert [g[1] for g in got] == (["stage 0 (prefill): kv_lease_duration 0: prefill frees every request's KV blocks "
                                    "at once, before decode can read them"] if fires else [])


def test_opd623_a_nixl_class_from_another_package_is_not_vllms() -> None:
    from omni_pd.check.rules.nixl_lease import planned_lease

    mod = ", kv_connector_module_path: my_pkg.nixl"
    assert found(pair(p=extra(kv_lease_duration=0) + mod, d=mod), "OPD623", opts=opts("0.34")) == []
    kv = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    assert planned_lease(kv, "cpu", target("0.34")) == {**kv, EXTRA: {"kv_lease_duration": 480}}
    assert planned_lease({**kv, "kv_connector_module_path": "my_pkg.nixl"}, "cpu", target("0.34")) is None
