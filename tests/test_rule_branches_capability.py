"""Every branch of the connector capability rules (OPD601-OPD615,
omni_pd/check/rules/capability.py and the modules split from it in issue 38) with exact messages, locations and help lines (issue 16:
the rule examples' golden, tests/test_rule_branches.py, reaches one or two branches of each;
these pin the others, named by the mutation run of bench/mutation.py).

Each test names the branch it pins.
"""

from __future__ import annotations

import pytest

from omni_pd.check.rules.encoder import _epd
from omni_pd.check.validate import ValidateOptions, validate_text
from rule_found import col as _col, found, found_with_notes  # tests/rule_found.py

V30 = ValidateOptions(vllm_version="0.30")
ROCM_NOTE = "found with the `platforms.rocm` overlay applied"


def _overlay(ec: str) -> str:
    """A 1E1P1D file whose base EC wiring is right and whose ``platforms.rocm`` overlay gives
    prefill (stage 1) the ``ec_transfer_config`` ``ec``."""
    return _epd() + f"platforms:\n  rocm:\n    stages:\n      - stage_id: 1\n        ec_transfer_config: {ec}\n"


# --- --all-platforms: the base plus each overlay (OPD614, OPD615) -----------------------------------

def test_opd614_all_platforms_checks_an_overlays_ec_transfer_config_too() -> None:
    # `--platform rocm` reports the overlay's misspelt connector, its unknown role and the producer
    # it leaves without a consumer; `--all-platforms` ("base + every overlay") must report them too,
    # each noted with the overlay (the rule ran on the base platform only: none)
    text = _overlay("{ec_connector: ECExampleConnectr, ec_role: ec_reader}")
    want = [("warning", "stage 0 is an ec_producer but no ec_consumer is downstream of it: its encoder outputs go nowhere",
             _col(text, "ec_producer")),
            ("error", "stage 1: unknown ec_connector `ECExampleConnectr`; did you mean ECExampleConnector?",
             _col(text, "ECExampleConnectr,")),
            ("error", "stage 1: unsupported ec_role `ec_reader`", _col(text, "ec_reader"))]
    rocm = ValidateOptions(platform="rocm", vllm_version="0.30")
    assert [h[:3] for h in found(text, "OPD614", opts=rocm)] == want
    assert found(text, "OPD614", opts=V30) == []
    every = ValidateOptions(all_platforms=True, vllm_version="0.30")
    got = [(d.severity.value, d.message, (d.location.line, d.location.column), list(d.notes))
           for d in validate_text(text, "t.yaml", every).diagnostics if d.code == "OPD614"]
    assert got == [(*w, [ROCM_NOTE]) for w in want]


def test_opd615_all_platforms_checks_an_overlays_ec_transfer_config_too() -> None:
    text = _overlay("{ec_connector: ECExampleConnector, ec_role: ec_consumer, ec_bufer_size: 1.0e9}")
    want = ("error", "stage 1: `ec_bufer_size` is not an ECTransferConfig field", _col(text, "ec_bufer_size"))
    assert [h[:3] for h in found(text, "OPD615", opts=ValidateOptions(platform="rocm", vllm_version="0.30"))] == [want]
    every = ValidateOptions(all_platforms=True, vllm_version="0.30")
    got = [(d.severity.value, d.message, (d.location.line, d.location.column), list(d.notes))
           for d in validate_text(text, "t.yaml", every).diagnostics if d.code == "OPD615"]
    assert got == [(*want, [ROCM_NOTE])]


def test_opd614_and_opd615_are_said_once_under_all_platforms_when_the_base_has_them() -> None:
    # a base finding is true on every platform: the overlay's copy is merged into it (no note)
    text = _epd(p=", ec_transfer_config: {ec_connector: ECExampleConnectr, ec_role: ec_consumer, ec_bufer_size: 1}") + \
        "platforms:\n  rocm:\n    stages:\n      - {stage_id: 0, devices: \"3\"}\n"
    every = ValidateOptions(all_platforms=True, vllm_version="0.30")
    got = [(d.code, d.message, list(d.notes)) for d in validate_text(text, "t.yaml", every).diagnostics
           if d.code in ("OPD614", "OPD615")]
    assert got == [("OPD614", "stage 1: unknown ec_connector `ECExampleConnectr`; did you mean ECExampleConnector?", []),
                   ("OPD615", "stage 1: `ec_bufer_size` is not an ECTransferConfig field", [])]


# --- OPD601 kv_connector registered for the vLLM version / platform ----------------------------------

def _pair(conn: str, p_kv: str = "", d_kv: str = "", p_extra: str = "", d_extra: str = "") -> str:
    """A Qwen3-Omni PD pair (stage 0 prefill on line 4, stage 1 decode on line 5) over ``conn``."""
    from omni_pd.check.rules.capability import _pair_yaml

    return _pair_yaml(conn, p_extra, d_extra, p_kv, d_kv)


def _both(sev: str, msg: str, help_: str, col: int = 68) -> list[tuple]:
    """The same finding for stage 0 (line 4) and stage 1 (line 5), at column ``col``."""
    return [(sev, msg.format(s=s), (4 + s, col), help_, []) for s in (0, 1)]


ASCEND_ON_CUDA = "stage {s}: MooncakeConnectorV1 is a vllm-ascend connector; it exists only on the npu platform"
HELP_011 = ("pick a connector your vLLM has: LMCacheConnectorV1, MultiConnector, NixlConnector, OffloadingConnector, "
            "P2pNcclConnector, SharedStorageConnector")


def test_opd601_a_vllm_ascend_connector_off_npu_and_the_platform_from_the_inventory() -> None:
    from omni_pd.check.context import Inventory

    text = _pair("MooncakeConnectorV1")
    assert found(text, "OPD601") == _both("error", ASCEND_ON_CUDA, "on cuda use MooncakeConnector or NixlConnector")
    assert found(text, "OPD601", opts=ValidateOptions(platform="npu")) == []
    # per stage: the host each stage is placed on; --platform wins over the inventory
    two = Inventory.from_dict({"hosts": {"a": {"accelerator": "npu"}, "b": {"accelerator": "cuda"}},
                               "placement": {"0": "a", "1": "b"}})
    assert found(text, "OPD601", opts=ValidateOptions(inventory=two)) == \
        _both("error", ASCEND_ON_CUDA, "on cuda use MooncakeConnector or NixlConnector")[1:]
    assert found(text, "OPD601", opts=ValidateOptions(inventory=two, platform="rocm")) == \
        _both("error", ASCEND_ON_CUDA, "on rocm use NixlConnector")
    one = Inventory.from_dict({"hosts": {"a": {"accelerator": "npu"}}})
    assert found(text, "OPD601", opts=ValidateOptions(inventory=one)) == []
    # a host that names no accelerator: cuda
    bare = Inventory.from_dict({"hosts": {"a": {}}})
    assert len(found(text, "OPD601", opts=ValidateOptions(inventory=bare))) == 2
    # stages the inventory does not place are where expand and launch place them (prefill on
    # the first host, decode on the second): both npu here
    unplaced = Inventory.from_dict({"hosts": {"a": {"accelerator": "npu"}, "b": {"accelerator": "npu"}}})
    assert found(text, "OPD601", opts=ValidateOptions(inventory=unplaced)) == []
    half = Inventory.from_dict({"hosts": {"a": {"accelerator": "npu"}, "b": {"accelerator": "cuda"}}})
    assert found(text, "OPD601", opts=ValidateOptions(inventory=half)) == \
        _both("error", ASCEND_ON_CUDA, "on cuda use MooncakeConnector or NixlConnector")[1:]


def _every_ascend_release() -> list:
    from omni_pd.compile import ascend

    return [pytest.param(rel, name, id=f"{rel}-{name}") for rel in ascend.releases() for name in sorted(ascend.registered(rel))]


@pytest.mark.parametrize(("release", "name"), _every_ascend_release())
def test_opd601_accepts_every_connector_a_vllm_ascend_release_registers(release: str, name: str) -> None:
    # issue 22 / BR-49: MooncakeHybridConnector (registered by vllm-ascend 0.23.0.post1) was "unknown
    # kv_connector"; the names come from presets/targets/vllm_ascend.yaml extracted.<release>.connectors
    from omni_pd.compile import ascend

    opts = ValidateOptions(platform="npu", vllm_version=ascend.releases()[release])
    assert found(_pair(name), "OPD601", opts=opts) == []


def test_opd601_a_vllm_ascend_connector_its_release_does_not_register_names_the_release_that_does() -> None:
    hy = "MooncakeHybridConnector"
    assert found(_pair(hy), "OPD601", opts=ValidateOptions(platform="npu", vllm_version="0.18")) == _both(
        "error", "stage {s}: MooncakeHybridConnector is not registered in vllm-ascend 0.18.0 (the release for "
        "vLLM 0.18) (registered in vllm-ascend 0.23.0.post1)",
        "run vllm-ascend 0.23.0.post1 (`--vllm-version 0.23`) or use one of MooncakeConnectorV1, "
        "MooncakeLayerwiseConnector")
    # a name no release in the table registers any more (vllm-ascend <= 0.11)
    assert [h[1] for h in found(_pair("LLMDataDistCMgrConnector"), "OPD601",
                                opts=ValidateOptions(platform="npu", vllm_version="0.23"))] == [
        f"stage {s}: LLMDataDistCMgrConnector is not registered in vllm-ascend 0.23.0.post1 (the release for vLLM 0.23)"
        for s in (0, 1)]
    # no vllm-ascend release runs on vLLM 0.30: no registry facts, no finding
    assert found(_pair(hy), "OPD601", opts=ValidateOptions(platform="npu", vllm_version="0.30")) == []
    # off npu it is a vllm-ascend connector like the others
    assert [h[1] for h in found(_pair(hy), "OPD601", opts=V30)] == [
        f"stage {s}: {hy} is a vllm-ascend connector; it exists only on the npu platform" for s in (0, 1)]


def test_opd601_help_for_a_vllm_ascend_connector_names_the_platform_checked() -> None:
    # it said "on cuda use MooncakeConnector or NixlConnector" under --platform rocm / xpu too
    text = _pair("MooncakeConnectorV1")
    helps = {plat: {h[3] for h in found(text, "OPD601", opts=ValidateOptions(platform=plat, vllm_version=v))}
             for plat, v in (("cuda", "0.30"), ("rocm", "0.30"), ("xpu", "0.30"), ("musa", "0.30"))}
    assert helps == {"cuda": {"on cuda use MooncakeConnector or NixlConnector"}, "rocm": {"on rocm use NixlConnector"},
                     "xpu": {"on xpu use NixlConnector"},
                     "musa": {"on musa use a connector vLLM 0.30 registers, or kv_connector_module_path for an "
                              "out-of-tree one"}}
    # only what the target registers: vLLM 0.11 has no MooncakeConnector
    assert {h[3] for h in found(text, "OPD601", opts=ValidateOptions(vllm_version="0.11"))} == \
        {"on cuda use NixlConnector"}
    # --all-platforms: a platforms.rocm overlay over a vllm-ascend base is checked on rocm
    over = text + "platforms:\n  rocm:\n    stages:\n      - {stage_id: 0, enforce_eager: true}\n"
    every = validate_text(over, "t.yaml", ValidateOptions(all_platforms=True, vllm_version="0.30")).diagnostics
    assert sorted((d.location.line, d.help, list(d.notes)) for d in every if d.code == "OPD601") == [
        (l, "on rocm use NixlConnector", ["found with the `platforms.rocm` overlay applied"]) for l in (4, 5)]


def test_opd601_a_renamed_connector_names_the_new_name_and_whether_it_ever_was_v1() -> None:
    assert found(_pair("SharedStorageConnector"), "OPD601", opts=V30) == _both(
        "error", "stage {s}: SharedStorageConnector is not registered in vLLM 0.30; did you mean ExampleConnector?",
        "write `kv_connector: ExampleConnector`")
    assert found(_pair("SharedStorageConnector"), "OPD601", opts=ValidateOptions(vllm_version="0.11")) == []
    assert found(_pair("LMCacheConnector"), "OPD601", opts=V30) == _both(
        "error", "stage {s}: LMCacheConnector is not a V1 connector; did you mean LMCacheConnectorV1?",
        "write `kv_connector: LMCacheConnectorV1`")


def test_opd601_a_connector_added_later_or_removed_says_when_and_lists_six_it_has() -> None:
    v011 = ValidateOptions(vllm_version="0.11")
    assert found(_pair("MoRIIOConnector"), "OPD601", opts=v011) == _both(
        "error", "stage {s}: MoRIIOConnector is not available in vLLM 0.11 (added in vLLM 0.18)", HELP_011)
    assert found(_pair("ExampleConnector"), "OPD601", opts=v011) == _both(
        "error", "stage {s}: ExampleConnector is not available in vLLM 0.11 (added in vLLM 0.13)", HELP_011)
    assert found(_pair("P2pNcclConnector"), "OPD601", opts=V30) == _both(
        "error", "stage {s}: P2pNcclConnector is not available in vLLM 0.30 (removed in vLLM 0.24)",
        "pick a connector your vLLM has: DecodeBenchConnector, ExampleConnector, ExampleHiddenStatesConnector, "
        "FlexKVConnectorV1, HF3FSKVConnector, LMCacheConnectorV1")


def test_opd601_unknown_names_get_the_case_insensitive_or_closest_name_or_the_module_path_hint() -> None:
    for typo in ("NIXLCONNECTOR", "NixlConector"):
        assert found(_pair(typo), "OPD601", opts=V30) == _both(
            "error", f"stage {{s}}: unknown kv_connector `{typo}`; did you mean NixlConnector?",
            "write `kv_connector: NixlConnector`")
    # the closest name is one registered on the platform checked: a vllm-ascend name on npu
    # only (on cuda OPD601 refuses MooncakeConnectorV1, so suggesting it sent the user in a circle)
    assert found(_pair("MooncakeConnectorV2"), "OPD601", opts=V30) == _both(
        "error", "stage {s}: unknown kv_connector `MooncakeConnectorV2`; did you mean MooncakeConnector?",
        "write `kv_connector: MooncakeConnector`")
    for plat in ("rocm", "xpu", "musa"):
        assert [h[1] for h in found(_pair("MooncakeConnectorV2"), "OPD601",
                                    opts=ValidateOptions(vllm_version="0.30", platform=plat))] == [
            f"stage {s}: unknown kv_connector `MooncakeConnectorV2`; did you mean MooncakeConnector?" for s in (0, 1)]
    assert found(_pair("MooncakeConnectorV2"), "OPD601", opts=ValidateOptions(vllm_version="0.30", platform="npu")) == \
        _both("error", "stage {s}: unknown kv_connector `MooncakeConnectorV2`; did you mean MooncakeConnectorV1?",
              "write `kv_connector: MooncakeConnectorV1`")
    assert found(_pair("FooBar"), "OPD601", opts=V30) == _both(
        "error", "stage {s}: unknown kv_connector `FooBar`", "set kv_connector_module_path for an out-of-tree connector")
    # a module path loads it; before 0.11 there are no registry facts
    mod = ", kv_connector_module_path: my.mod"
    assert found(_pair("FooBar", p_kv=mod, d_kv=mod), "OPD601", opts=V30) == []
    assert found(_pair("FooBar"), "OPD601", opts=ValidateOptions(vllm_version="0.10")) == []
    # a registered connector on one stage does not end the scan
    text = _pair("NixlConnector").replace("NixlConnector, kv_role: kv_consumer", "FooBar, kv_role: kv_consumer")
    assert found(text, "OPD601", opts=V30) == [
        ("error", "stage 1: unknown kv_connector `FooBar`", (5, 68), "set kv_connector_module_path for an out-of-tree connector",
         [])]


# --- OPD602 MultiConnector children --------------------------------------------------------------------

PARAMS_HS = ("ExampleHiddenStatesConnector returns kv_transfer_params (hidden_states_path) for every request, so every "
             "request that prefill finishes fails with RuntimeError \"Only one connector can produce KV transfer params\"")
PCP_STALL = ("NIXL on PCP ranks > 0 never reports sends done while OffloadingConnector saves on every rank, so requests "
             "never finish sending and prefill stalls with its KV cache full")


def _multi(children: list[str], side: str = "d", prefill: str = "") -> str:
    """A PD pair (llm_pd) whose ``side`` stage runs MultiConnector over ``children``;
    ``prefill`` adds keys to the prefill stage (line 4)."""
    from omni_pd.check.rules.multi_connector import _multi as multi

    return multi(children, side).replace('devices: "0", kv_transfer_config', f'devices: "0"{prefill}, kv_transfer_config')


def test_opd602_two_handoff_children_between_the_releases_read_name_both_refusals() -> None:
    text = _multi(["NixlConnector", "MooncakeConnector"])
    assert found(text, "OPD602", opts=ValidateOptions(vllm_version="0.27")) == [(
        "error", "stage 1: MultiConnector has two P->D handoff children (NixlConnector, MooncakeConnector): both return "
        "kv_transfer_params, which vLLM 0.27 either refuses outright (RuntimeError \"Only one connector can produce KV "
        "transfer params\") or merges and refuses on a key clash (RuntimeError \"Key clash in kv_transfer_params from "
        "multiple connectors\") (PR #46777; release not pinned); decode loads from one of them only",
        _col(text, "MooncakeConnector, kv_role: kv_consumer"),
        "keep one handoff connector (NixlConnector); use the others as cache/offload children only",
        [(*_col(text, "NixlConnector, kv_role: kv_consumer}, {"), "first handoff child")])]


def test_opd602_a_cache_child_first_on_decode_known_by_kv_role_or_by_the_pd_pair() -> None:
    warn = ("stage 1: MultiConnector lists OffloadingConnector before the handoff child NixlConnector; decode loads from "
            "the first child that reports hits, so a local OffloadingConnector hit skips the transfer from prefill (the "
            "rest of the prompt is recomputed; prefill keeps its blocks until their lease ends)")
    # a pipeline without a PD split (no pair): the consumer role alone makes the stage decode
    text = _multi(["OffloadingConnector", "NixlConnector"]).replace("pipeline: llm_pd", "pipeline: qwen3_omni_moe")
    assert found(text, "OPD602") == [("warning", warn, _col(text, "OffloadingConnector"),
                                      "list NixlConnector first in `connectors:`",
                                      [(*_col(text, "NixlConnector, kv_role: kv_consumer"), "handoff child")])]
    # a PD pair's decode whatever its kv_role says
    both = _multi(["OffloadingConnector", "NixlConnector"]).replace("MultiConnector, kv_role: kv_consumer",
                                                                     "MultiConnector, kv_role: kv_both")
    assert [h[:3] for h in found(both, "OPD602")] == [("warning", warn, _col(both, "OffloadingConnector"))]
    assert found(both.replace("pipeline: llm_pd", "pipeline: qwen3_omni_moe"), "OPD602") == []


def test_opd602_hidden_states_on_prefill_from_the_first_release_with_it_and_past_a_clean_row() -> None:
    # 0.18 is the row's `since` (broken from it on, no clean release before); the LMCacheMPConnector
    # row, clean on 0.18, is skipped without ending the scan
    for kids in (["NixlConnector", "ExampleHiddenStatesConnector"],
                 ["NixlConnector", "LMCacheMPConnector", "ExampleHiddenStatesConnector"]):
        text = _multi(kids, side="p")
        assert found(text, "OPD602", opts=ValidateOptions(vllm_version="0.18")) == [(
            "error", "stage 0: MultiConnector NixlConnector + ExampleHiddenStatesConnector on prefill on vLLM 0.18: "
            f"{PARAMS_HS} (https://github.com/vllm-project/vllm/pull/46777)", _col(text, "ExampleHiddenStatesConnector"),
            "drop ExampleHiddenStatesConnector from prefill's connectors, or target vLLM 0.30+ (which merges the params)",
            [])]


def test_opd602_a_release_after_the_broken_span_names_the_span_read() -> None:
    text = _multi(["NixlConnector", "ExampleHiddenStatesConnector"], side="p")
    assert found(text, "OPD602", opts=ValidateOptions(vllm_version="0.27")) == [(
        "info", "stage 0: MultiConnector NixlConnector + ExampleHiddenStatesConnector on prefill: on vLLM 0.18-0.24 "
        f"(releases read) {PARAMS_HS}; vLLM 0.27 lies between the releases read, so this is not pinned",
        _col(text, "ExampleHiddenStatesConnector"), "check that your vLLM has https://github.com/vllm-project/vllm/pull/46777",
        [])]


def test_opd602_the_pcp_stall_needs_a_nixl_handoff_and_replicated_pcp_prefill() -> None:
    v028 = ValidateOptions(vllm_version="0.28")
    pcp = ", prefill_context_parallel_size: 2"
    text = _multi(["NixlConnector", "OffloadingConnector"], side="p", prefill=pcp)
    stall = [("info", "stage 0: MultiConnector NixlConnector + OffloadingConnector on prefill: reported before vLLM 0.30 "
              f"(no release read with it) {PCP_STALL}; vLLM 0.28 lies between the releases read, so this is not pinned",
              _col(text, "OffloadingConnector"), "check that your vLLM has https://github.com/vllm-project/vllm/pull/53903",
              [])]
    assert found(text, "OPD602", opts=v028) == stall
    # another handoff child: the row does not apply
    assert found(_multi(["MooncakeConnector", "OffloadingConnector"], side="p", prefill=pcp), "OPD602", opts=v028) == []
    # no prefill context parallelism (absent, 1 or 0: unreadable sizes count as 1)
    for no in ("", ", prefill_context_parallel_size: 1", ", prefill_context_parallel_size: 0"):
        assert found(_multi(["NixlConnector", "OffloadingConnector"], side="p", prefill=no), "OPD602", opts=v028) == []
    # decode context parallelism shards the KV (not replicated); 0 or an unreadable size counts as 1
    assert found(_multi(["NixlConnector", "OffloadingConnector"], side="p",
                        prefill=pcp + ", decode_context_parallel_size: 2"), "OPD602", opts=v028) == []
    for dcp in ("0", "x"):
        t = _multi(["NixlConnector", "OffloadingConnector"], side="p", prefill=pcp + f", decode_context_parallel_size: {dcp}")
        assert [h[:3] for h in found(t, "OPD602", opts=v028)] == [(*stall[0][:2], _col(t, "OffloadingConnector"))]


# --- OPD612 pipeline parallelism per connector and side -----------------------------------------------

NPU30 = ValidateOptions(vllm_version="0.30", platform="npu")


def _pp(c: str, pp: int, dp: int, pe: str = "", de: str = "", pipeline: str = "llm_pd") -> str:
    from omni_pd.check.rules.pipeline_parallel import _pp_yaml

    return _pp_yaml(c, pp, dp, pe, de).replace("pipeline: llm_pd", f"pipeline: {pipeline}")


def _peer(pp: str = "") -> str:
    from omni_pd.check.rules.pipeline_parallel import _ASCEND_PEER

    return _ASCEND_PEER.format(p=pp)


def test_opd612_ascend_peer_pp_size_checked_on_each_stage_with_peer_blocks() -> None:
    # prefill has no peer blocks (skipped, not the end of the scan); decode's lacks pp_size
    text = _pp("MooncakeConnectorV1", 2, 1, de=_peer())
    assert found(text, "OPD612", opts=NPU30) == [(
        "error", "stage 1: kv_connector_extra_config.prefill.pp_size is missing but the prefill stage 0 runs "
        "pipeline_parallel_size 2; MooncakeConnectorV1 maps ranks from it", _col(text, "prefill: {", 0),
        "write `pp_size: 2` in the `prefill` block on both stages", [])]
    # a wrong pp_size (not only a missing one)
    text = _pp("MooncakeConnectorV1", 2, 1, pe=_peer(", pp_size: 1"), de=_peer(", pp_size: 2"))
    assert found(text, "OPD612", opts=NPU30) == [(
        "error", "stage 0: kv_connector_extra_config.prefill.pp_size is 1 but the prefill stage 0 runs "
        "pipeline_parallel_size 2; MooncakeConnectorV1 maps ranks from it", _col(text, "pp_size: 1"),
        "write `pp_size: 2` in the `prefill` block on both stages", [])]
    # no PD pair (a pipeline without the split): no peer to compare with
    assert found(_pp("MooncakeConnectorV1", 2, 1, pe=_peer(", pp_size: 1"), pipeline="qwen3_omni_moe"), "OPD612",
                 opts=NPU30) == []
    # a connector whose row has no peer blocks ignores a `prefill:` block in its extra config
    assert found(_pp("NixlPushConnector", 2, 1, pe=", kv_connector_extra_config: {prefill: {pp_size: 1}}"), "OPD612",
                 opts=V30) == []


def test_opd602_kv_layouts_skip_the_children_without_a_layout_under_mla() -> None:
    from omni_pd.check.validate import options_from_example

    mla = options_from_example({"model": {"attention": "MLA"}, "vllm_version": "0.30"})
    three = _multi(["NixlConnector", "OffloadingConnector", "ExampleHiddenStatesConnector"])

    def layouts(shown: str) -> list[tuple]:
        return [("error", f"stage 1: MultiConnector children require different KV cache layouts ({shown}): vLLM 0.30 stops "
                 "with \"KV cache layout mismatch\"", _col(three, "connectors"),
                 "combine children that use the same KV cache layout", [])]

    # NIXL needs no layout under MLA: the scan goes on to the next children
    assert found(three, "OPD602", opts=mla) == layouts("OffloadingConnector LBHNC, ExampleHiddenStatesConnector LBNHC")
    assert found(three, "OPD602", opts=V30) == layouts("NixlConnector LBHNC, ExampleHiddenStatesConnector LBNHC")
    assert found(_multi(["NixlConnector", "ExampleHiddenStatesConnector"]), "OPD602", opts=mla) == []


def test_opd612_the_global_flag_is_located_on_the_command_line() -> None:
    from omni_pd.check.validate import options_from_example

    opts = options_from_example({"vllm_version": "0.30", "cli": {"pipeline_parallel_size": 2}})
    got = [d for d in validate_text(_pp("NixlConnector", 1, 1), "t.yaml", opts).diagnostics if d.code == "OPD612"]
    assert [(d.message, d.location.file, d.location.path, [(r.file, r.path, r.label) for r in d.related]) for d in got] == [
        ("NixlConnector does not support pipeline_parallel_size > 1 in vLLM 0.30 (stage 0 PP 2, stage 1 PP 2)",
         "<command line>", ("pipeline_parallel_size",),
         [("<command line>", ("pipeline_parallel_size",), "stage 1 (decode) PP 2")])]


# --- OPD603-OPD606: TP pairing, MLA, kv_cache_dtype -----------------------------------------------------

def _model(vllm_version: str = "0.30", **facts: object) -> ValidateOptions:
    """vLLM ``vllm_version`` (0.30) with ``--model-info`` facts (:class:`omni_pd.check.context.ModelInfo` fields)."""
    from omni_pd.check.validate import options_from_example

    return options_from_example({"model": facts, "vllm_version": vllm_version})


def _val(text: str, key: str, nth: int = 0) -> tuple[int, int]:
    """(line, column) of the value of the ``nth`` flow-style ``key: value`` in ``text``."""
    line, col = _col(text, f"{key}: ", nth)
    return line, col + len(key) + 2


def _tp(conn: str, ptp: int, dtp: int) -> str:
    """A PD pair with prefill TP ``ptp`` on devices 0.., decode TP ``dtp`` on the next devices."""
    p_dev = ",".join(str(i) for i in range(ptp))
    d_dev = ",".join(str(i) for i in range(ptp, ptp + dtp))
    return _pair(conn, p_extra=f", tensor_parallel_size: {ptp}", d_extra=f", tensor_parallel_size: {dtp}").replace(
        'devices: "0"', f'devices: "{p_dev}"').replace('devices: "1"', f'devices: "{d_dev}"')


def test_opd603_decode_tp_above_the_kv_heads_is_located_at_decode_with_prefills_tp_related() -> None:
    """Before vllm#45879 (vLLM 0.23) the NIXL handshake failed for decode TP above the KV heads."""
    text = _tp("NixlConnector", 2, 4)
    assert found(text, "OPD603", opts=_model("0.23", num_kv_heads=2)) == [(
        "error", "decode TP 4 > num_key_value_heads 2 with the other side at TP 2: KV heads are replicated and the "
        "heterogeneous-TP shape check fails (NIXL before vllm#45879; vLLM 0.23 lacks it, 0.25+ has it)",
        _val(text, "tensor_parallel_size", 1), "give decode (stage 1) `tensor_parallel_size: 2` or prefill (stage 0) "
        "`tensor_parallel_size: 4` (equal TP), or pick TPs the connector pairs",
        [(*_val(text, "tensor_parallel_size"), "prefill (stage 0) TP 2")])]
    assert found(text, "OPD603", opts=_model("0.23", num_kv_heads=8)) == []
    # MLA keeps one latent KV per token: no head limit
    assert found(text, "OPD603", opts=_model("0.23", num_kv_heads=2, attention="MLA")) == []


def test_opd603_decode_tp_above_the_kv_heads_release_boundary_of_vllm_45879() -> None:
    """vllm#45879 (merged 2026-06-17): 0.23 error, 0.24 warning (not pinned), 0.25 and 0.30 pair;
    MooncakeConnector keeps the old fact (not re-read)."""
    text = _tp("NixlConnector", 2, 4)
    assert [f[0] for f in found(text, "OPD603", opts=_model("0.23", num_kv_heads=2))] == ["error"]
    w = found(text, "OPD603", opts=_model("0.24", num_kv_heads=2))
    assert [f[0] for f in w] == ["warning"] and "not pinned" in w[0][1]
    assert found(text, "OPD603", opts=_model("0.25", num_kv_heads=2)) == []
    assert found(text, "OPD603", opts=_model("0.30", num_kv_heads=2)) == []
    mc = _tp("MooncakeConnector", 2, 4)
    assert [f[0] for f in found(mc, "OPD603", opts=_model("0.30", num_kv_heads=2))] == ["error"]


def test_opd603_prefill_tp_above_the_kv_heads_still_fails_after_vllm_45879() -> None:
    """The direction the CPU e2e (tests/test_e2e_tp_across_hosts.py) relies on: prefill TP 2 over
    1 KV head with decode TP 1 is refused on 0.23 and on 0.30 alike."""
    text = _tp("NixlConnector", 2, 1)
    for v in ("0.23", "0.25", "0.30", "0.33"):
        got = found(text, "OPD603", opts=_model(v, num_kv_heads=1))
        assert [(f[0], f[1]) for f in got] == [("error", "prefill TP 2 > num_key_value_heads 1 with the other side at "
                                                "TP 1: KV heads are replicated and the heterogeneous-TP shape check fails")], v


def test_opd603_msa_attention_needs_equal_tp_over_nixl_on_every_release() -> None:
    """vllm#46204 (MSA keeps KV NHD; fix #46223 unmerged): unequal TP errors on 0.23 and 0.33,
    equal TP passes; the same shape over MooncakeConnector is not this fact."""
    text = _tp("NixlConnector", 1, 8)
    msa = {"num_kv_heads": 4, "attention": "GQA", "sparse_attention": "msa", "model_type": "minimax_m3"}
    for v in ("0.23", "0.30", "0.33"):
        got = found(text, "OPD603", opts=_model(v, **msa))
        assert len(got) == 1 and got[0][0] == "error" and "keeps its KV cache NHD" in got[0][1] and "vllm#46204" in got[0][1]
    assert found(_tp("NixlConnector", 8, 8), "OPD603", opts=_model("0.30", **msa)) == []
    assert found(text, "OPD603", opts=_model("0.30", num_kv_heads=4, attention="GQA")) == []


def test_model_info_reads_msa_from_the_config() -> None:
    from omni_pd.check.context import ModelInfo

    assert ModelInfo.from_config_json({"model_type": "minimax_m3", "num_key_value_heads": 4}).sparse_attention == "msa"
    assert ModelInfo.from_config_json({"model_type": "x", "sparse_attention_config": {"type": "MSA"}}).sparse_attention == "msa"
    assert ModelInfo.from_config_json({"model_type": "qwen3_moe", "num_key_value_heads": 4}).sparse_attention is None
    assert ModelInfo.from_config_json({"max_position_embeddings": 4096}).max_position_embeddings == 4096
    # a rope-scaled context is not max_position_embeddings: unknown
    assert ModelInfo.from_config_json({"max_position_embeddings": 4096,
                                       "rope_scaling": {"type": "yarn", "factor": 4.0}}).max_position_embeddings is None


def test_opd603_hybrid_models_need_equal_tp_over_nixl() -> None:
    text = _tp("NixlConnector", 2, 4)
    assert [h[1] for h in found(text, "OPD603", opts=_model(attention="hybrid"))] == [
        "hybrid-attention models need equal TP over NIXL (got P=2, D=4)"]
    assert found(text, "OPD603", opts=V30) == []


def test_opd603_the_connector_is_prefills_else_decodes() -> None:
    v013 = ValidateOptions(vllm_version="0.13")
    # Mooncake (prefill) needs equal TP on 0.13 where NIXL (decode) would take D a multiple of P
    mixed = _tp("NixlConnector", 2, 4).replace("NixlConnector, kv_role: kv_producer", "MooncakeConnector, kv_role: kv_producer")
    assert [h[1] for h in found(mixed, "OPD603", opts=v013)] == [
        "MooncakeConnector on vLLM 0.13 needs equal TP on prefill and decode"]
    # prefill names no connector: decode's
    bare = _tp("NixlConnector", 4, 2).replace("kv_connector: NixlConnector, kv_role: kv_producer", "kv_role: kv_producer")
    assert [h[1] for h in found(bare, "OPD603", opts=v013)] == [
        "NixlConnector on vLLM 0.13 allows decode TP >= prefill TP only, as a multiple (got P=4, D=2)"]


def test_opd604_each_connector_without_mla_support_under_an_mla_model() -> None:
    for conn in ("PyNcclConnector", "LMCacheConnector"):
        assert found(_pair(conn), "OPD604", opts=_model(attention="MLA")) == _both(
            "error", f"stage {{s}}: {conn} has no MLA KV layout support and the model uses MLA",
            "use NixlConnector (MLA needs no head split)")
    assert found(_pair("PyNcclConnector"), "OPD604", opts=_model(attention="GQA")) == []
    assert found(_pair("MooncakeConnector"), "OPD604", opts=_model(attention="MLA")) == []


def test_opd605_an_unset_side_counts_as_auto_and_is_located_at_its_stage() -> None:
    text = _pair("NixlConnector", p_extra=", kv_cache_dtype: fp8")
    assert found(text, "OPD605") == [("error", "kv_cache_dtype fp8 (prefill) != auto (decode)", (5, 5),
                                      "write `kv_cache_dtype: fp8` on both stages", [(*_col(text, "fp8"), "prefill uses fp8")])]
    text = _pair("NixlConnector", d_extra=", kv_cache_dtype: fp8")
    assert found(text, "OPD605") == [("error", "kv_cache_dtype auto (prefill) != fp8 (decode)", _col(text, "fp8"),
                                      "write `kv_cache_dtype: auto` on both stages", [(4, 5, "prefill uses auto")])]


def test_opd606_any_fp8_variant_over_nixl_only() -> None:
    fp8 = ", kv_cache_dtype: fp8_e4m3"
    text = _pair("NixlConnector", p_extra=fp8, d_extra=fp8)
    assert found(text, "OPD606") == [
        ("warning", "fp8 KV cache over NIXL P/D has been reported to corrupt output for this model family",
         _col(text, "fp8_e4m3"), "use `kv_cache_dtype: auto` on both stages, or compare outputs against a non-PD run first",
         [])]
    assert found(_pair("MooncakeConnector", p_extra=fp8, d_extra=fp8), "OPD606") == []
    auto = ", kv_cache_dtype: auto"
    assert found(_pair("NixlConnector", p_extra=auto, d_extra=auto), "OPD606") == []


# --- OPD607 block sizes ---------------------------------------------------------------------------------

def _blocks(conn: str, pb: str, db: str, p_kv: str = "") -> str:
    return _pair(conn, p_kv=p_kv, p_extra=f", block_size: {pb}", d_extra=f", block_size: {db}")


def test_opd607_nixl_decode_may_take_a_multiple_from_013_unless_prefill_stages_on_the_host() -> None:
    def refused(text: str, pb: str, db: str, conn: str = "NixlConnector") -> list[tuple]:
        return [("error", f"block_size {pb} (prefill) and {db} (decode) are not compatible for {conn}",
                 _val(text, "block_size", 1), f"write `block_size: {pb}` on both stages",
                 [(*_val(text, "block_size"), f"prefill block_size {pb}")])]

    text = _blocks("NixlConnector", "16", "32")
    assert found(text, "OPD607", opts=ValidateOptions(vllm_version="0.13")) == []
    assert found(text, "OPD607", opts=ValidateOptions(vllm_version="0.11")) == refused(text, "16", "32")
    assert found(_blocks("MooncakeConnector", "16", "32"), "OPD607", opts=V30) == \
        refused(_blocks("MooncakeConnector", "16", "32"), "16", "32", "MooncakeConnector")
    cpu = _blocks("NixlConnector", "16", "32", p_kv=", kv_buffer_device: cpu")
    assert found(cpu, "OPD607", opts=V30) == refused(cpu, "16", "32")
    for pb, db in (("16", "24"), ("0", "32"), ("x", "32")):  # not a multiple; unreadable sizes are refused
        text = _blocks("NixlConnector", pb, db)
        assert found(text, "OPD607", opts=V30) == refused(text, pb, db)


def test_opd607_a_hybrid_model_with_different_layouts_and_a_side_without_block_size() -> None:
    warn = "hybrid model with different P/D layouts: the physical block size may differ (observed 16 vs 32)"
    help_ = "pin the same `block_size:` on both stages"
    hybrid = _model(attention="hybrid")

    def layout(p: str, d: str = "") -> str:
        return _pair("NixlConnector", p_extra=p, d_extra=d).replace('devices: "0"', 'devices: "0,1"').replace(
            'devices: "1"', 'devices: "2"')

    # decode has no block_size: located at decode's stage; prefill has none: at prefill's
    for differs in (", tensor_parallel_size: 2", ", data_parallel_size: 2"):
        assert found(layout(differs), "OPD607", opts=hybrid) == [("warning", warn, (5, 5), help_, [(4, 5, "prefill")])]
    assert found(layout(", tensor_parallel_size: 2", ", block_size: 16"), "OPD607", opts=hybrid) == [
        ("warning", warn, (4, 5), help_, [(4, 5, "prefill")])]
    ep = _pair("NixlConnector", p_extra=", enable_expert_parallel: true")
    assert [h[1] for h in found(ep, "OPD607", opts=hybrid)] == [warn]
    # same layout, or not hybrid: nothing
    assert found(_pair("NixlConnector", d_extra=", block_size: 16"), "OPD607", opts=hybrid) == []
    assert found(layout(", tensor_parallel_size: 2"), "OPD607", opts=V30) == []


# --- OPD608 required extra config keys, OPD609 KVTransferConfig fields -------------------------------

def _x(keys: str) -> str:
    return f", kv_connector_extra_config: {{{keys}}}"


def test_opd608_p2pnccl_needs_http_port_only_with_a_proxy_and_an_empty_value_counts_as_missing() -> None:
    v018 = ValidateOptions(vllm_version="0.18")
    need = ("error", "stage 0: P2pNcclConnector requires kv_connector_extra_config.http_port")
    help_ = "add `http_port: <port>` (the instance's API --port)"
    # proxy_ip on prefill (no http_port), proxy_port with http_port on decode
    text = _pair("P2pNcclConnector", p_kv=_x("proxy_ip: 10.0.0.1"), d_kv=_x("proxy_port: 30001, http_port: 8200"))
    assert found(text, "OPD608", opts=v018) == [(*need, _col(text, "kv_connector_extra_config"), help_, [])]
    text = _pair("P2pNcclConnector", p_kv=_x("proxy_ip: 10.0.0.1, http_port: ''"))
    assert found(text, "OPD608", opts=v018) == [(*need, _col(text, "kv_connector_extra_config"), help_, [])]
    assert found(_pair("P2pNcclConnector"), "OPD608", opts=v018) == []


def test_opd608_moriio_without_extra_config_is_located_at_kv_transfer_config() -> None:
    text = _pair("MoRIIOConnector")
    want = []
    for s in (0, 1):  # handshake_port / notify_port default (6301 / 61005): only http_port is required
        want.append(("error", f"stage {s}: MoRIIOConnector requires kv_connector_extra_config.http_port",
                     _col(text, "kv_transfer_config", s), "add `http_port: <port>` (the instance's API --port)", []))
    assert found(text, "OPD608", opts=ValidateOptions(vllm_version="0.18")) == want


def test_opd609_removed_fields_typos_and_unknown_keys_and_the_warning_before_018() -> None:
    text = _pair("NixlConnector", p_kv=", kv_ip: 10.0.0.1, kv_rank: 0", d_kv=", kv_bufer_size: 1, foo_bar_baz: 1")
    assert found(text, "OPD609", opts=ValidateOptions(vllm_version="0.32")) == [
        ("error", "stage 0: `kv_ip` was removed from KVTransferConfig in vLLM 0.32; judged for vLLM 0.32", _col(text, "kv_ip"),
         "remove `kv_ip` (vllm-omni reads the Mooncake address from kv_connector_extra_config / env)", []),
        ("error", "stage 0: `kv_rank` was removed from KVTransferConfig in vLLM 0.32; judged for vLLM 0.32", _col(text, "kv_rank"),
         "remove `kv_rank`", []),
        ("error", "stage 1: `kv_bufer_size` is not a KVTransferConfig field", _col(text, "kv_bufer_size"),
         "did you mean `kv_buffer_device`?", []),
        ("error", "stage 1: `foo_bar_baz` is not a KVTransferConfig field", _col(text, "foo_bar_baz"),
         "move connector options under kv_connector_extra_config", [])]
    text = _pair("NixlConnector", d_kv=", kv_bufer_size: 1")
    assert found(text, "OPD609", opts=ValidateOptions(vllm_version="0.13")) == [
        ("warning", "stage 1: `kv_bufer_size` is not a KVTransferConfig field", _col(text, "kv_bufer_size"),
         "did you mean `kv_buffer_size`?", [])]
    assert found(text, "OPD609", opts=ValidateOptions(vllm_version="0.10")) == []
    # a field newer than the target names the release it came in; without --vllm-version the
    # finding says which release it assumed
    text = _pair("NixlConnector", d_kv=", kv_load_failure_policy: fail")
    assert found(text, "OPD609", opts=ValidateOptions(vllm_version="0.11")) == [
        ("warning", "stage 1: `kv_load_failure_policy` is a KVTransferConfig field from vLLM 0.13 on; judged for "
                    "vLLM 0.11", _col(text, "kv_load_failure_policy"),
         "remove `kv_load_failure_policy`, or pass --vllm-version 0.13 or later if the engines run it", [])]
    text = _pair("NixlConnector", p_kv=", kv_rank: 0")
    assert [g[1] for g in found(text, "OPD609", opts=ValidateOptions(vllm_version="0.34"))] == [
        "stage 0: `kv_rank` was removed from KVTransferConfig in vLLM 0.32; judged for vLLM 0.34"]


# --- OPD611 kv_buffer_device per platform and release ---------------------------------------------------

def test_opd611_the_latest_row_of_the_stages_platform_and_release_decides() -> None:
    def bufs(p: str, d: str) -> str:
        return _pair("NixlConnector", p_kv=f", kv_buffer_device: {p}", d_kv=f", kv_buffer_device: {d}")

    def refused(stage: int, plat: str, v: str, allowed: str, dev: str, first: str) -> tuple:
        return ("error", f"stage {stage}: NixlConnector on {plat} with vLLM {v} accepts kv_buffer_device {allowed}, not {dev}",
                (4 + stage, 137), f"write `kv_buffer_device: {first}`", [])

    assert found(bufs("cpu", "xpu"), "OPD611", opts=ValidateOptions(vllm_version="0.13")) == [
        refused(1, "cuda", "0.13", "cuda or cpu", "xpu", "cuda")]
    assert found(bufs("xpu", "cuda"), "OPD611", opts=ValidateOptions(vllm_version="0.18", platform="xpu")) == [
        refused(1, "xpu", "0.18", "cpu or xpu", "cuda", "cpu")]
    assert found(bufs("xpu", "cuda"), "OPD611", opts=ValidateOptions(vllm_version="0.13", platform="xpu")) == [
        refused(0, "xpu", "0.13", "cpu", "xpu", "cpu"), refused(1, "xpu", "0.13", "cpu", "cuda", "cpu")]
    assert found(bufs("cpu", "cpu"), "OPD611", opts=ValidateOptions(vllm_version="0.11", platform="rocm")) == [
        refused(0, "rocm", "0.11", "cuda", "cpu", "cuda"), refused(1, "rocm", "0.11", "cuda", "cpu", "cuda")]
    # no row for the platform, or before the first row; connectors without a table are not checked
    assert found(bufs("cpu", "cpu"), "OPD611", opts=ValidateOptions(vllm_version="0.11", platform="npu")) == []
    assert found(bufs("cpu", "cpu"), "OPD611", opts=ValidateOptions(vllm_version="0.10")) == []
    banana = _pair("MooncakeConnector", p_kv=", kv_buffer_device: banana")
    assert found(banana, "OPD611", opts=ValidateOptions(vllm_version="0.11")) == []


NIXL_PP_HELP = "use pipeline_parallel_size 1 (scale with tensor_parallel_size instead), or NixlPushConnector with PP on prefill only"


def test_opd612_sides_from_kv_role_outside_a_pd_pair_and_from_the_pair_inside_one() -> None:
    # no PD pair: kv_producer is prefill, kv_consumer decode, each stage listed with its side
    text = _pp("NixlConnector", 2, 2, pipeline="qwen3_omni_moe")
    assert found(text, "OPD612", opts=V30) == [(
        "error", "NixlConnector does not support pipeline_parallel_size > 1 in vLLM 0.30 (stage 0 PP 2, stage 1 PP 2)",
        _val(text, "pipeline_parallel_size"), NIXL_PP_HELP, [(*_val(text, "pipeline_parallel_size", 1), "stage 1 (decode) PP 2")])]
    # in a PD pair the pair decides: a prefill that says kv_consumer is still prefill (push NIXL takes PP there)
    text = _pp("NixlPushConnector", 2, 1).replace("kv_role: kv_producer", "kv_role: kv_consumer")
    assert found(text, "OPD612", opts=V30) == []


def test_opd612_a_kv_both_stage_is_named_once() -> None:
    # kv_both runs both sides: one stage, named once (it was "stage 0 PP 2, stage 0 PP 2" with itself related)
    both = _pp("NixlConnector", 2, 1, pipeline="qwen3_omni_moe").replace("kv_role: kv_producer", "kv_role: kv_both")
    assert found(both, "OPD612", opts=V30) == [(
        "error", "NixlConnector does not support pipeline_parallel_size > 1 in vLLM 0.30 (stage 0 PP 2)",
        _val(both, "pipeline_parallel_size"), NIXL_PP_HELP, [])]
    # a MultiConnector naming the same child twice: the stage once too
    kid = "{kv_connector: NixlConnector, kv_role: kv_producer}"
    twice = _pp("MultiConnector", 2, 1, pe=f", kv_connector_extra_config: {{connectors: [{kid}, {kid}]}}")
    assert [h[1:] for h in found(twice, "OPD612", opts=V30)] == [(
        "NixlConnector does not support pipeline_parallel_size > 1 in vLLM 0.30 (stage 0 PP 2)",
        _val(twice, "pipeline_parallel_size"), NIXL_PP_HELP, [])]


# --- OPD613 LMCacheConnectorV1 as the PD transport ---------------------------------------------------------

NO_TRANSPORT_HELP = ("use MultiConnector with NixlConnector (P->D handoff) and LMCacheMPConnector (reuse), or set LMCache PD "
                     "mode (lmcache.enable_pd: true, lmcache.pd_role: sender / receiver) with LMCache's PD proxy, or one "
                     "shared backend (the same LMCACHE_REMOTE_URL on both sides)")


def _two_hosts() -> ValidateOptions:
    from omni_pd.check.context import Inventory
    from omni_pd.check.rules.lmcache_pd import _TWO_HOSTS

    return ValidateOptions(inventory=Inventory.from_dict(_TWO_HOSTS["inventory"]))


def _lmc(**kw: str) -> str:
    from omni_pd.check.rules.lmcache_pd import _lmc as lmc

    return lmc(**kw)


def _multi_p(kids: str) -> str:
    """:func:`_lmc` with prefill's connector a MultiConnector over ``kids`` (decode stays LMCacheConnectorV1)."""
    return _lmc().replace("kv_connector: LMCacheConnectorV1, kv_role: kv_producer",
                          f"kv_connector: MultiConnector, kv_role: kv_producer, kv_connector_extra_config: {{connectors: [{kids}]}}")


def test_opd613_no_transport_says_two_hosts_only_when_they_are_and_points_at_both_connectors() -> None:
    text = _lmc()
    for opts, hosts in ((None, ""), (_two_hosts(), " on two hosts")):
        assert found(text, "OPD613", opts=opts) == [(
            "error", f"LMCacheConnectorV1 P/D pair{hosts} with no LMCache PD mode (enable_pd/pd_role) and no shared remote "
            "backend: decode recomputes every prompt", (4, 68), NO_TRANSPORT_HELP, [(5, 68, "decode")])]


def test_opd613_a_transport_problem_gets_the_help_of_its_transport() -> None:
    url = ", env: {{LMCACHE_REMOTE_URL: \"redis://{}:6379\"}}"
    text = _lmc(pe=url.format("a"), de=url.format("b"))
    assert found(text, "OPD613", opts=_two_hosts()) == [(
        "error", "LMCacheConnectorV1 P/D pair: prefill and decode use different LMCache remote backends (redis://a:6379 / "
        "redis://b:6379): decode never finds prefill's KV", _val(text, "kv_connector"),
        "point both sides at one remote backend both hosts reach (same LMCACHE_REMOTE_URL)",
        [(*_val(text, "kv_connector", 1), "decode")])]
    pd = ", kv_connector_extra_config: {lmcache.enable_pd: true, lmcache.pd_role: sender}"
    assert found(_lmc(px=pd), "OPD613", opts=_two_hosts()) == [(
        "error", "LMCacheConnectorV1 P/D pair: LMCache PD mode (enable_pd) is on for one side only; decode does not have it",
        (4, 68), "set enable_pd on both with pd_role sender (prefill) / receiver (decode)", [(5, 68, "decode")])]


def test_opd613_under_multiconnector_the_lmcache_child_is_the_transport_and_offloaders_do_not_count() -> None:
    off = "{kv_connector: OffloadingConnector, kv_role: kv_producer}"
    # the LMCache child's own extra config is read (PD mode on prefill only)
    pd = "{kv_connector: LMCacheConnectorV1, kv_role: kv_producer, kv_connector_extra_config: {lmcache.enable_pd: true, " \
         "lmcache.pd_role: sender}}"
    assert [h[1] for h in found(_multi_p(f"{off}, {pd}"), "OPD613", opts=_two_hosts())] == [
        "LMCacheConnectorV1 P/D pair: LMCache PD mode (enable_pd) is on for one side only; decode does not have it"]
    # offload-only children move nothing: LMCache is still the only transport
    assert len(found(_multi_p(f"{off}, {{kv_connector: SimpleCPUOffloadConnector, kv_role: kv_producer}}"), "OPD613")) == 1
    # another connector that moves KV: not an LMCache pair
    assert found(_lmc().replace("LMCacheConnectorV1, kv_role: kv_consumer", "NixlConnector, kv_role: kv_consumer"),
                 "OPD613") == []
    only_off = _multi_p(off).replace("LMCacheConnectorV1, kv_role: kv_consumer", "OffloadingConnector, kv_role: kv_consumer")
    assert found(only_off, "OPD613") == []


# --- OPD610 a broken vLLM install: the import error's first line ----------------------------------------

def test_opd610_a_broken_import_is_named_by_its_first_line_or_its_type_alone(monkeypatch) -> None:
    import importlib.machinery
    import sys
    import types

    def broken(exc: Exception) -> str:
        pkg = types.ModuleType("vllm")
        pkg.__spec__ = importlib.machinery.ModuleSpec("vllm", None, is_package=True)
        pkg.__path__ = []
        cfg = types.ModuleType("vllm.config")

        def fail(name: str) -> None:
            raise exc

        cfg.__getattr__ = fail  # type: ignore[attr-defined]  # `from vllm.config import X` raises exc
        monkeypatch.setitem(sys.modules, "vllm", pkg)
        monkeypatch.setitem(sys.modules, "vllm.config", cfg)
        (hit,) = found(_pair("NixlConnector"), "OPD610")
        assert (hit[0], hit[2]) == ("info", (4, 33))
        return hit[1]

    tail = "): kv_transfer_config was not checked by vLLM"
    head = "vLLM is installed but `from vllm.config import KVTransferConfig` failed ("
    assert broken(RuntimeError("CPU lacks AVX\nsee the install guide")) == head + "RuntimeError: CPU lacks AVX" + tail
    assert broken(RuntimeError()) == head + "RuntimeError" + tail


# --- OPD614 EC roles along the edges ------------------------------------------------------------------------

def test_opd614_an_ec_both_stage_downstream_consumes_the_producers_outputs() -> None:
    from omni_pd.check.rules.ec_connector import _ec

    assert found(_ec(dr="ec_both"), "OPD614", opts=V30) == []


def test_opd612_a_stage_or_multiconnector_child_without_a_connector_has_no_pp_facts_to_check() -> None:
    assert found(_pp("NixlConnector", 2, 1).replace("kv_connector: NixlConnector, kv_role: kv_producer",
                                                     "kv_role: kv_producer"), "OPD612", opts=V30) == []
    odd = _pp("MultiConnector", 2, 1, pe=", kv_connector_extra_config: {connectors: [{kv_role: kv_producer}, 3, "
              "{kv_connector: NixlConnector, kv_role: kv_producer}]}")
    assert [h[1] for h in found(odd, "OPD612", opts=V30)] == [
        "NixlConnector does not support pipeline_parallel_size > 1 in vLLM 0.30 (stage 0 PP 2)"]


# --- OPD614 EC connector registry, roles and options --------------------------------------------------

NOWHERE = "stage {} is an ec_producer but no ec_consumer is downstream of it: its encoder outputs go nowhere"
NOWHERE_HELP = "give the stage that consumes its outputs `ec_role: ec_consumer`"
V2_OFF = "stage {}: ECCPUConnector requires the V2 model runner, which is switched off here"
V2_HELP = "set VLLM_USE_V2_MODEL_RUNNER=1 (and no `model_runner: v1`)"


def _ec(**kw: str) -> str:
    """Stage 0 (line 2) an encoder-only EC producer, stage 1 (line 3) its consumer."""
    from omni_pd.check.rules.ec_connector import _ec as ec

    return ec(**kw)


def _cpu_ok() -> str:
    from omni_pd.check.rules.ec_connector import _CPU_OK

    return _CPU_OK


def _on_both(text: str, msg: str, needle: str, help_: str, sev: str = "error") -> list[tuple]:
    """``msg`` for stage 0 and stage 1, located at the first and second ``needle``."""
    return [(sev, msg.format(s), _col(text, needle, s), help_, []) for s in (0, 1)]


def test_opd614_before_013_one_finding_at_the_first_ec_config() -> None:
    text = _ec()
    assert found(text, "OPD614", opts=ValidateOptions(vllm_version="0.11")) == [
        ("error", "ec_transfer_config (encoder disaggregation) arrived in vLLM 0.13; the target is 0.11",
         _col(text, "ec_transfer_config"), "target vLLM 0.13 or later, or remove ec_transfer_config", [])]


@pytest.mark.parametrize("connector,vllm,message,at,help_", [
    ("ECMooncakeConnector", "0.29", "stage {}: ECMooncakeConnector is not registered in vLLM 0.29 (added in vLLM 0.30)",
     "ECMooncakeConnector", "pick an EC connector your vLLM has: ECCPUConnector, ECExampleConnector"),
    ("ECSharedStorageConnector", "0.30", "stage {}: ECSharedStorageConnector is not registered; it is ECExampleConnector",
     "ECShared", "write `ec_connector: ECExampleConnector`"),
    ("FooBarBaz", "0.30", "stage {}: unknown ec_connector `FooBarBaz`", "FooBarBaz",
     "set ec_connector_module_path for an out-of-tree EC connector"),
    ("ECExampleConnectr", "0.30", "stage {}: unknown ec_connector `ECExampleConnectr`; did you mean ECExampleConnector?",
     "ECExampleConnectr", "write `ec_connector: ECExampleConnector`"),
])
def test_opd614_connector_not_yet_registered_renamed_or_unknown(connector, vllm, message, at, help_) -> None:
    text = _ec(c=connector)
    assert found(text, "OPD614", opts=ValidateOptions(vllm_version=vllm)) == _on_both(text, message, at, help_)


def test_opd614_a_missing_or_unknown_role_and_the_producer_left_without_a_consumer() -> None:
    text = _ec().replace(", ec_role: ec_consumer", "")
    assert found(text, "OPD614", opts=V30) == [
        ("warning", NOWHERE.format(0), _col(text, "ec_producer"), NOWHERE_HELP, []),
        ("error", "stage 1: ec_connector is set but there is no ec_role (vLLM refuses to start)",
         _col(text, "ec_transfer_config", 1), "add `ec_role: ec_producer` (encoder) or `ec_role: ec_consumer`", [])]
    for role, hint in (("ec_reader", "did you mean `ec_producer`? "), ("zzz", "")):
        text = _ec(dr=role)
        assert found(text, "OPD614", opts=V30) == [
            ("warning", NOWHERE.format(0), _col(text, "ec_producer"), NOWHERE_HELP, []),
            ("error", f"stage 1: unsupported ec_role `{role}`", _col(text, role),
             hint + "ec_role is one of ec_producer, ec_consumer, ec_both", [])]


def test_opd614_consumers_name_their_upstream_and_every_lone_producer_is_warned() -> None:
    text = _ec(pr="ec_consumer")
    assert found(text, "OPD614", opts=V30) == [
        ("error", "stage 0 is an ec_consumer but no ec_producer feeds it (upstream: none)", _col(text, "ec_consumer"),
         "make the encoder-only stage upstream of it `ec_role: ec_producer`", []),
        ("error", "stage 1 is an ec_consumer but no ec_producer feeds it (upstream: 0)", _col(text, "ec_consumer", 1),
         "make the encoder-only stage upstream of it `ec_role: ec_producer`", [])]
    text = _ec(dr="ec_producer")
    assert found(text, "OPD614", opts=V30) == _on_both(text, NOWHERE, "ec_producer", NOWHERE_HELP, "warning")


def test_opd614_required_options_zero_counts_as_missing_and_options_a_release_ignores() -> None:
    text = _ec(c="ECCPUConnector")
    assert found(text, "OPD614", opts=V30) == _on_both(
        text, "stage {}: ECCPUConnector in vLLM 0.30 requires ec_connector_extra_config.ec_cpu_bytes", "ec_transfer_config",
        "add `ec_cpu_bytes: <bytes>` (the CPU region size for encoder outputs)")
    text = _ec(c="ECCPUConnector", px=", ec_connector_extra_config: {ec_cpu_bytes: 0, ec_enable_nixl: true}", dx=_cpu_ok())
    assert found(text, "OPD614", opts=V30) == [
        ("error", "stage 0: ECCPUConnector in vLLM 0.30 requires ec_connector_extra_config.ec_cpu_bytes",
         _col(text, "ec_connector_extra_config"), "add `ec_cpu_bytes: <bytes>` (the CPU region size for encoder outputs)",
         [])]
    x = ", ec_connector_extra_config: {ec_cpu_bytes: 1, ec_enable_nixl: true}"
    text = _ec(c="ECCPUConnector", px=x, dx=x)
    assert found(text, "OPD614", opts=ValidateOptions(vllm_version="0.29")) == _on_both(
        text, "stage {}: ec_connector_extra_config.ec_enable_nixl is not read by ECCPUConnector in vLLM 0.29: P2P NIXL EC "
        "transfer (vLLM PR #47941) is not in this release; it arrives in 0.30: the consumer re-encodes every item",
        "ec_enable_nixl", "target the release that reads ec_enable_nixl, or use an EC connector that moves encoder outputs "
        "on this release (ECExampleConnector with a shared directory)")


def test_opd614_the_v2_runner_switched_off_by_stage_env_launcher_env_or_model_runner() -> None:
    ok = _cpu_ok()
    for off in ("0", " False "):
        text = _ec(c="ECCPUConnector", px=ok, dx=ok, de=f", env: {{VLLM_USE_V2_MODEL_RUNNER: \"{off}\"}}")
        assert found(text, "OPD614", opts=V30) == [
            ("error", V2_OFF.format(1), _col(text, "VLLM_USE_V2_MODEL_RUNNER"), V2_HELP, [])]
    on = _ec(c="ECCPUConnector", px=ok, dx=ok, de=", env: {VLLM_USE_V2_MODEL_RUNNER: \"1\"}")
    assert found(on, "OPD614", opts=V30) == []
    # the launcher's environment: no stage key to point at, so each stage
    text = _ec(c="ECCPUConnector", px=ok, dx=ok)
    got = found(text, "OPD614", opts=ValidateOptions(vllm_version="0.30", env={"VLLM_USE_V2_MODEL_RUNNER": "no"}))
    assert got == [("error", V2_OFF.format(s), (2 + s, 5), V2_HELP, []) for s in (0, 1)]
    assert found("model_runner: v1\n" + text, "OPD614", opts=V30) == [
        ("error", V2_OFF.format(s), (1, 1), V2_HELP, []) for s in (0, 1)]


def test_opd614_mooncake_producers_run_on_one_rank_each_size_named() -> None:
    text = _ec(c="ECMooncakeConnector").replace(
        'devices: "0", mm_encoder_only', 'devices: "0,1,2,3", tensor_parallel_size: 2, pipeline_parallel_size: 2, mm_encoder_only')
    assert found(text, "OPD614", opts=V30) == [
        ("error", f"stage 0: ECMooncakeConnector producers need {k} 1 (got 2)", _val(text, k),
         f"run the encoder stage with `{k}: 1`", []) for k in ("tensor_parallel_size", "pipeline_parallel_size")]
    text = _ec(c="ECMooncakeConnector", pr="ec_both").replace(
        'devices: "0", mm_encoder_only', 'devices: "0,1", data_parallel_size: 2, mm_encoder_only')
    assert found(text, "OPD614", opts=V30) == [
        ("error", "stage 0: ECMooncakeConnector producers need data_parallel_size 1 (got 2)", _val(text, "data_parallel_size"),
         "run the encoder stage with `data_parallel_size: 1`", [])]
    # consumers may run TP > 1
    text = _ec(c="ECMooncakeConnector").replace('devices: "1"', 'devices: "1,2", tensor_parallel_size: 2')
    assert found(text, "OPD614", opts=V30) == []


# --- OPD615 ECTransferConfig fields and EC connector options --------------------------------------------

FORK = ("a key of the closed fork PR https://github.com/vllm-project/vllm/pull/42998; no upstream EC connector reads it")


def test_opd615_removed_fields_typos_and_unknown_fields_a_warning_before_018_nothing_before_013() -> None:
    text = _ec(px=", ec_rank: 0, ec_parallel_size: 1")
    assert found(text, "OPD615", opts=ValidateOptions(vllm_version="0.32")) == [
        ("error", f"stage 0: ec_transfer_config.{k} was removed in vLLM 0.32; judged for vLLM 0.32", _col(text, k), f"remove `{k}`", [])
        for k in ("ec_rank", "ec_parallel_size")]
    assert found(text, "OPD615", opts=V30) == []
    text = _ec(px=", ec_bufer_size: 1.0e9, zzz_qqq: 1")
    assert found(text, "OPD615", opts=ValidateOptions(vllm_version="0.13")) == [
        ("warning", "stage 0: `ec_bufer_size` is not an ECTransferConfig field", _col(text, "ec_bufer_size"),
         "did you mean `ec_buffer_size`?", []),
        ("warning", "stage 0: `zzz_qqq` is not an ECTransferConfig field", _col(text, "zzz_qqq"),
         "move connector options under ec_connector_extra_config", [])]
    assert found(text, "OPD615", opts=ValidateOptions(vllm_version="0.11")) == []


def test_opd615_connector_options_fork_keys_typos_and_the_list_it_reads() -> None:
    text = _ec(c="ECCPUConnector", px=", ec_connector_extra_config: {ec_cpu_bytes: 1, ec_enable_nixl: true, "
                                      "num_ec_blocks: 3, ec_cpu_byts: 1, zzzz: 2}")
    assert found(text, "OPD615", opts=V30) == [
        ("warning", f"stage 0: num_ec_blocks is not an option of ECCPUConnector ({FORK})", _col(text, "num_ec_blocks"),
         "remove `num_ec_blocks`", []),
        ("warning", "stage 0: `ec_cpu_byts` is not an option ECCPUConnector reads in vLLM 0.30", _col(text, "ec_cpu_byts"),
         "did you mean `ec_cpu_bytes`?", []),
        ("warning", "stage 0: `zzzz` is not an option ECCPUConnector reads in vLLM 0.30", _col(text, "zzzz"),
         "ECCPUConnector reads: ec_cpu_bytes, ec_enable_nixl, consumer_ack_timeout_s", [])]


def test_opd615_a_release_without_pinned_options_still_names_fork_keys_past_an_ignored_option() -> None:
    # 0.29: ECCPUConnector's options are not pinned (no unknown-key finding); ec_enable_nixl is
    # OPD614's (ignored by this release), and the scan goes on to the fork key
    text = _ec(c="ECCPUConnector", px=", ec_connector_extra_config: {ec_enable_nixl: true, num_ec_blocks: 3, zzzz: 1}")
    assert found(text, "OPD615", opts=ValidateOptions(vllm_version="0.29")) == [
        ("warning", f"stage 0: num_ec_blocks is not an option of ECCPUConnector ({FORK})", _col(text, "num_ec_blocks"),
         "remove `num_ec_blocks`", [])]


def test_opd615_unknown_connectors_and_extra_config_that_is_not_a_mapping_are_not_read() -> None:
    assert found(_ec(c="FooBar", px=", ec_connector_extra_config: {zzz: 1}"), "OPD615", opts=V30) == []
    assert found(_ec(px=", ec_connector_extra_config: [1]"), "OPD615", opts=V30) == []


def test_opd602_malformed_children_each_key_named_and_the_npu_alias_after_a_non_name() -> None:
    one = _multi(["NixlConnector"])
    kids = "[{kv_connector: NixlConnector, kv_role: kv_consumer}]"
    need = ("error", "stage 1: MultiConnector needs a non-empty kv_connector_extra_config.connectors list")
    need_help = "list the child connectors: `connectors: [{kv_connector: NixlConnector, kv_role: kv_producer}]`"
    for bad in ("{a: 1}", "[]"):
        text = one.replace(kids, bad)
        assert found(text, "OPD602") == [(*need, _col(text, "kv_connector_extra_config"), need_help, [])]
    text = one.replace(kids, "[3, {kv_role: kv_consumer}, {kv_connector: NixlConnector}, {kv_connector: '', kv_role: ''}]")
    at = [_col(text, "{kv_role"), _col(text, "{kv_connector: NixlConnector}"), _col(text, "{kv_connector: ''")]
    assert found(text, "OPD602") == [
        ("error", "stage 1: MultiConnector child 1 has no kv_connector", at[0], "add `kv_connector:` to the child", []),
        ("error", "stage 1: MultiConnector child 2 has no kv_role", at[1], "add `kv_role:` to the child", []),
        ("error", "stage 1: MultiConnector child 3 has no kv_connector", at[2], "add `kv_connector:` to the child", []),
        ("error", "stage 1: MultiConnector child 3 has no kv_role", at[2], "add `kv_role:` to the child", [])]
    text = one.replace(kids, "[{kv_connector: [1], kv_role: kv_consumer}, {kv_connector: OffloadingConnector, "
                             "kv_role: kv_consumer}]")
    assert found(text, "OPD602", opts=ValidateOptions(platform="npu")) == [
        ("error", "stage 1: MultiConnector child 0 kv_connector must be a connector name, found a list",
         _col(text, "[1]"), "write the child's connector class name, e.g. `NixlConnector`", []),
        ("warning", "MultiConnector child 'OffloadingConnector' is an alias of AscendOffloadingConnector on npu; stats "
         "reconstruction can crash EngineCore on unpatched vLLM", _col(text, "OffloadingConnector"),
         "use a vLLM with the fix, or name `AscendOffloadingConnector` and check its stats support", [])]
    assert found(_multi(["MooncakeConnectorV1", "OffloadingConnector"]), "OPD602") == []


def test_opd612_no_fact_is_an_info_with_the_rows_reason_and_web_sources_when_there_is_a_row() -> None:
    text = _pp("LMCacheConnectorV1", 2, 1)
    assert found(text, "OPD612", opts=V30) == [(
        "info", "stage 0 (prefill) runs pipeline_parallel_size 2 over LMCacheConnectorV1: omni-pd has no pipeline-parallel "
        "fact for LMCacheConnectorV1 on the prefill side in vLLM 0.30", _val(text, "pipeline_parallel_size"),
        "check the connector's PP support for your release before launch", [])]
    text = _pp("NixlPushConnector", 2, 1)
    assert found(text, "OPD612", opts=ValidateOptions(vllm_version="0.26")) == [(
        "info", "stage 0 (prefill) runs pipeline_parallel_size 2 over NixlPushConnector: omni-pd has no pipeline-parallel "
        "fact for NixlPushConnector on the prefill side in vLLM 0.26; push mode before vLLM PR #45880 has no PP-aware "
        "handshake; decode PP is not supported", _val(text, "pipeline_parallel_size"),
        "check the connector's PP support for your release before launch (https://github.com/vllm-project/vllm/pull/35264, "
        "https://github.com/vllm-project/vllm/pull/45880)", [])]
    # before 0.11 there are no PP facts at all
    assert found(_pp("NixlConnector", 2, 2), "OPD612", opts=ValidateOptions(vllm_version="0.10")) == []


def test_opd612_a_side_only_row_names_the_side_and_its_fix() -> None:
    text = _pp("NixlPushConnector", 1, 2)
    assert found(text, "OPD612", opts=V30) == [(
        "error", "NixlPushConnector does not support pipeline_parallel_size > 1 on decode in vLLM 0.30 (stage 1 PP 2)",
        _val(text, "pipeline_parallel_size", 1),
        "use pipeline_parallel_size 1 on decode (scale decode with tensor_parallel_size)", [])]


def test_opd602_an_empty_list_on_prefill_does_not_end_the_scan_and_each_stage_has_its_hosts_platform() -> None:
    from omni_pd.check.context import Inventory

    text = _multi(["OffloadingConnector", "NixlConnector"]).replace(
        "{kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}",
        "{kv_connector: MultiConnector, kv_role: kv_producer, engine_id: p, kv_connector_extra_config: {connectors: []}}")
    assert [(h[0], h[1][:60]) for h in found(text, "OPD602")] == [
        ("error", "stage 0: MultiConnector needs a non-empty kv_connector_extra"),
        ("warning", "stage 1: MultiConnector lists OffloadingConnector before the")]
    # decode is placed on the npu host: OffloadingConnector there is vllm-ascend's alias
    inv = Inventory.from_dict({"hosts": {"a": {"accelerator": "cuda"}, "b": {"accelerator": "npu"}},
                               "placement": {"0": "a", "1": "b"}})
    text = _multi(["MooncakeConnectorV1", "OffloadingConnector"])
    assert [(h[1], h[2]) for h in found(text, "OPD602", opts=ValidateOptions(inventory=inv))] == [
        ("MultiConnector child 'OffloadingConnector' is an alias of AscendOffloadingConnector on npu; stats reconstruction "
         "can crash EngineCore on unpatched vLLM", _col(text, "OffloadingConnector"))]


def test_opd614_a_producer_two_stages_upstream_feeds_the_consumer_and_all_upstream_stages_are_named() -> None:
    def chain(*ec: str) -> str:
        return "stages:\n" + "".join(f"  - {{stage_id: {i}, devices: \"{i}\"{x}}}\n" for i, x in enumerate(ec))

    prod = ", ec_transfer_config: {ec_connector: ECExampleConnector, ec_role: ec_producer}"
    cons = ", ec_transfer_config: {ec_connector: ECExampleConnector, ec_role: ec_consumer}"
    assert found(chain(prod, "", cons), "OPD614", opts=V30) == []
    text = chain("", "", cons)
    assert found(text, "OPD614", opts=V30) == [
        ("error", "stage 2 is an ec_consumer but no ec_producer feeds it (upstream: 0, 1)", _col(text, "ec_consumer"),
         "make the encoder-only stage upstream of it `ec_role: ec_producer`", [])]


def test_opd607_a_prefill_without_kv_connector_names_decodes_connector() -> None:
    # "... are not compatible for " (an empty name) before: prefill's connector only was read
    text = _blocks("MooncakeConnector", "16", "32").replace("kv_connector: MooncakeConnector, kv_role: kv_producer",
                                                            "kv_role: kv_producer")
    assert [h[1] for h in found(text, "OPD607", opts=V30)] == [
        "block_size 16 (prefill) and 32 (decode) are not compatible for MooncakeConnector"]


def test_opd607_and_opd603_need_both_kv_configs() -> None:
    # a PD pair whose prefill has no kv_transfer_config: neither rule reads it (nor crashes)
    text = _tp("NixlConnector", 4, 2).replace(", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, "
                                              "engine_id: p}", ", block_size: 16")
    assert "kv_producer" not in text
    assert found(text, "OPD603", opts=ValidateOptions(vllm_version="0.13")) == []
    assert found(text.replace('devices: "4,5"', 'devices: "4,5", block_size: 32'), "OPD607", opts=V30) == []


def test_opd607_hybrid_warning_cases_by_which_side_pins_block_size() -> None:
    warn = "hybrid model with different P/D layouts: the physical block size may differ (observed 16 vs 32)"
    hybrid = _model(attention="hybrid")

    def layout(p: str, d: str = "") -> str:
        return _pair("NixlConnector", p_extra=p, d_extra=d).replace('devices: "0"', 'devices: "0,1"').replace(
            'devices: "1"', 'devices: "2"')

    # prefill pins it, decode does not: at decode's stage
    assert [h[1:3] for h in found(layout(", tensor_parallel_size: 2, block_size: 16"), "OPD607", opts=hybrid)] == [
        (warn, (5, 5))]
    # both pin the same size: nothing to warn about
    assert found(layout(", tensor_parallel_size: 2, block_size: 16", ", block_size: 16"), "OPD607", opts=hybrid) == []
    # expert parallelism on decode only differs too
    assert [h[1] for h in found(_pair("NixlConnector", d_extra=", enable_expert_parallel: true"), "OPD607",
                                opts=hybrid)] == [warn]
    # a side that writes `block_size: null` is pointed at that key
    text = layout(", tensor_parallel_size: 2", ", block_size: null")
    assert [h[1:3] for h in found(text, "OPD607", opts=hybrid)] == [(warn, _col(text, "block_size"))]
    text = layout(", tensor_parallel_size: 2, block_size: null", ", block_size: 16")
    assert [h[1:3] for h in found(text, "OPD607", opts=hybrid)] == [(warn, _col(text, "block_size"))]


def test_opd608_a_proxy_port_alone_needs_http_port_too() -> None:
    text = _pair("P2pNcclConnector", d_kv=_x("proxy_port: 30001"))
    assert [h[1:3] for h in found(text, "OPD608", opts=ValidateOptions(vllm_version="0.18"))] == [
        ("stage 1: P2pNcclConnector requires kv_connector_extra_config.http_port", _col(text, "kv_connector_extra_config"))]


def test_opd609_is_checked_from_011() -> None:
    text = _pair("NixlConnector", d_kv=", kv_bufer_size: 1")
    assert [h[:2] for h in found(text, "OPD609", opts=ValidateOptions(vllm_version="0.11"))] == [
        ("warning", "stage 1: `kv_bufer_size` is not a KVTransferConfig field")]


def test_opd611_each_stage_on_its_hosts_platform_and_a_stage_without_the_key_skipped() -> None:
    from omni_pd.check.context import Inventory

    inv = Inventory.from_dict({"hosts": {"a": {"accelerator": "cuda"}, "b": {"accelerator": "xpu"}},
                               "placement": {"0": "a", "1": "b"}})
    cpu = ", kv_buffer_device: cpu"
    got = found(_pair("NixlConnector", p_kv=cpu, d_kv=cpu), "OPD611", opts=ValidateOptions(vllm_version="0.11", inventory=inv))
    assert [h[1] for h in got] == ["stage 0: NixlConnector on cuda with vLLM 0.11 accepts kv_buffer_device cuda, not cpu"]
    got = found(_pair("NixlConnector", d_kv=", kv_buffer_device: xpu"), "OPD611", opts=ValidateOptions(vllm_version="0.13"))
    assert [h[1] for h in got] == ["stage 1: NixlConnector on cuda with vLLM 0.13 accepts kv_buffer_device cuda or cpu, not xpu"]


class _Refusing:
    """A stand-in vllm.config.KVTransferConfig that refuses every config with ``error``."""

    error: Exception = ValueError()

    def __init__(self, **_: object) -> None:
        raise type(self).error


def test_opd610_exact_findings_with_a_stand_in_class_and_a_broken_install(monkeypatch) -> None:
    import importlib.machinery
    import sys
    import types

    pkg = types.ModuleType("vllm")
    pkg.__spec__ = importlib.machinery.ModuleSpec("vllm", None, is_package=True)
    pkg.__path__ = []
    mod = types.ModuleType("vllm.config")
    mod.KVTransferConfig = _Refusing  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", pkg)
    monkeypatch.setitem(sys.modules, "vllm.config", mod)
    fix = "fix the field vLLM names (see `omni-pd explain OPD609` for removed fields)"
    # the first line is the message, the next three are notes
    _Refusing.error = ValueError("6 validation errors\nline 1\nline 2\nline 3\nline 4")
    text = _pair("NixlConnector")
    assert found_with_notes(text, "OPD610") == [
        ("error", f"stage {s}: vLLM rejects kv_transfer_config: 6 validation errors", _col(text, "kv_transfer_config", s),
         fix, [], ["line 1", "line 2", "line 3"]) for s in (0, 1)]
    # an error without a message is named by its type
    _Refusing.error = TypeError()
    assert [h[1] for h in found(text, "OPD610")] == [
        f"stage {s}: vLLM rejects kv_transfer_config: TypeError" for s in (0, 1)]
    # a broken install: one info, with the repair help
    monkeypatch.setitem(sys.modules, "vllm.config", None)
    assert [(h[0], h[2], h[3]) for h in found(text, "OPD610")] == [(
        "info", _col(text, "kv_transfer_config"), "repair the vLLM install (`python -c 'import vllm.config'` shows the "
        "error), or uninstall it to check without vLLM")]


def test_opd612_kv_both_outside_a_pair_and_a_reversed_role_on_the_pairs_decode() -> None:
    push = "use pipeline_parallel_size 1 on decode (scale decode with tensor_parallel_size)"
    # no pair: stage 0 consumes (decode), stage 1 is kv_both (prefill and decode): both named, decode only
    text = _pp("NixlPushConnector", 2, 2, pipeline="qwen3_omni_moe").replace(
        "kv_role: kv_producer", "kv_role: kv_consumer").replace("kv_role: kv_consumer, engine_id: d", "kv_role: kv_both, engine_id: d")
    assert found(text, "OPD612", opts=V30) == [(
        "error", "NixlPushConnector does not support pipeline_parallel_size > 1 on decode in vLLM 0.30 (stage 0 PP 2, "
        "stage 1 PP 2)", _val(text, "pipeline_parallel_size"), push,
        [(*_val(text, "pipeline_parallel_size", 1), "stage 1 (decode) PP 2")])]
    # the pair's decode that says kv_producer is decode
    text = _pp("NixlPushConnector", 1, 2).replace("kv_role: kv_consumer", "kv_role: kv_producer")
    assert found(text, "OPD612", opts=V30) == [(
        "error", "NixlPushConnector does not support pipeline_parallel_size > 1 on decode in vLLM 0.30 (stage 1 PP 2)",
        _val(text, "pipeline_parallel_size", 1), push, [])]
    # 0.11 has facts already
    assert [h[1] for h in found(_pp("NixlConnector", 2, 2), "OPD612", opts=ValidateOptions(vllm_version="0.11"))] == [
        "NixlConnector does not support pipeline_parallel_size > 1 in vLLM 0.11 (stage 0 PP 2, stage 1 PP 2)"]


def test_opd613_lmcache_must_be_the_only_mover_on_both_sides_and_its_mp_connector_moves_nothing() -> None:
    # decode over LMCache, prefill over NIXL: not an LMCache pair
    assert found(_lmc().replace("LMCacheConnectorV1, kv_role: kv_producer", "NixlConnector, kv_role: kv_producer"),
                 "OPD613") == []
    # LMCacheMPConnector beside LMCacheConnectorV1 moves nothing between engines: still an LMCache pair
    multi = _multi_p("{kv_connector: LMCacheConnectorV1, kv_role: kv_producer}, "
                     "{kv_connector: LMCacheMPConnector, kv_role: kv_producer}")
    assert [h[1] for h in found(multi, "OPD613")] == [
        "LMCacheConnectorV1 P/D pair with no LMCache PD mode (enable_pd/pd_role) and no shared remote backend: decode "
        "recomputes every prompt"]
    # a `connectors:` list under a plain LMCacheConnectorV1 is not read as MultiConnector's
    x = ", kv_connector_extra_config: {{lmcache.enable_pd: true, lmcache.pd_role: {}, connectors: [{{kv_connector: " \
        "LMCacheConnectorV1}}]}}"
    assert found(_lmc(px=x.format("sender"), dx=x.format("receiver")), "OPD613") == []


def test_opd614_from_013_and_a_role_suggested_from_half_similar() -> None:
    assert found(_ec(), "OPD614", opts=ValidateOptions(vllm_version="0.13")) == []
    text = _ec(dr="prod")
    assert found(text, "OPD614", opts=V30)[1][1:4] == (
        "stage 1: unsupported ec_role `prod`", _val(text, "ec_role", 1),
        "did you mean `ec_producer`? ec_role is one of ec_producer, ec_consumer, ec_both")


def test_opd614_a_module_path_stage_does_not_end_the_scan_and_an_empty_required_value_is_missing() -> None:
    text = _ec(c="FooBarBaz", px=", ec_connector_module_path: my.ec")
    assert [h[1] for h in found(text, "OPD614", opts=V30)] == ["stage 1: unknown ec_connector `FooBarBaz`"]
    x = ", ec_connector_extra_config: {ec_cpu_bytes: '', ec_enable_nixl: true}"
    text = _ec(c="ECCPUConnector", px=x, dx=_cpu_ok())
    assert [h[1] for h in found(text, "OPD614", opts=V30)] == [
        "stage 0: ECCPUConnector in vLLM 0.30 requires ec_connector_extra_config.ec_cpu_bytes"]


def test_opd615_suggestions_need_a_close_match_and_an_unread_stage_does_not_end_the_scan() -> None:
    text = _ec(px=", ec_buf: 1")
    assert [h[1:4] for h in found(text, "OPD615", opts=V30)] == [
        ("stage 0: `ec_buf` is not an ECTransferConfig field", _col(text, "ec_buf"),
         "move connector options under ec_connector_extra_config")]
    text = _ec(c="ECCPUConnector", px=", ec_connector_extra_config: {ec_cpu_bytes: 1, ec_cpu: 1}")
    assert [h[1:4] for h in found(text, "OPD615", opts=V30)] == [
        ("stage 0: `ec_cpu` is not an option ECCPUConnector reads in vLLM 0.30", _col(text, "ec_cpu:"),
         "ECCPUConnector reads: ec_cpu_bytes, ec_enable_nixl, consumer_ack_timeout_s")]
    # stage 0's connector is unknown (its options are not read); stage 1's are
    text = _ec(dx=", ec_connector_extra_config: {zzzz: 1}").replace("ec_connector: ECExampleConnector", "ec_connector: FooBar", 1)
    assert [h[1] for h in found(text, "OPD615", opts=V30)] == [
        "stage 1: `zzzz` is not an option ECExampleConnector reads in vLLM 0.30"]


# --- OPD608 LMCache's per-rank PD peer port lists (issue 22, BR-50) ------------------------------------

def _lmc_rx(init: str = "[7300, 7301]", alloc: str = "[7400, 7401]") -> str:
    from omni_pd.check.rules.capability import _lmc_rx as rx

    return rx(init, alloc)


def test_opd608_lmcache_peer_port_lists_need_one_port_per_decode_rank() -> None:
    text = _lmc_rx("[7300]", "[7400]")
    line = text.splitlines()[4]
    assert found(text, "OPD608") == [
        ("error", f"stage 1 (TP 2): lmcache.pd_peer_{k}_port lists 1 port; LMCache's PD backend takes one per worker "
                  "rank (rank 1 fails with IndexError at start)",
         (5, line.index(f"lmcache.pd_peer_{k}_port: [") + len(f"lmcache.pd_peer_{k}_port: ") + 1),
         f"list 2, e.g. `lmcache.pd_peer_{k}_port: [{base}, {base + 1}]`", [])
        for k, base in (("init", 7300), ("alloc", 7400))]
    # one port per rank, or more (unread), is right; OPD504 reads each element as a port
    for ok in (_lmc_rx(), _lmc_rx("[7300, 7301, 7302]", "[7400, 7401]")):
        assert found(ok, "OPD608") == [] and found(ok, "OPD504") == []


def test_opd608_a_scalar_lmcache_peer_port_in_extra_config_cannot_be_indexed() -> None:
    # vLLM's LMCache adapter setattr()s lmcache.* values as written: 7300 is indexed [tp_rank] (TypeError)
    for raw, shown, want in (("7300", "7300", "[7300, 7301]"), ('"7300,7301"', "'7300,7301'", "[7300, 7301]"),
                             ("abc", "'abc'", "[<port>, <port>]")):
        got = found(_lmc_rx(raw), "OPD608")
        assert [(g[1], g[3]) for g in got] == [(
            f"stage 1: lmcache.pd_peer_init_port = {shown} is not a list; vLLM's LMCache adapter sets lmcache.* values "
            "as written and LMCache indexes this one by worker rank (TypeError at start)",
            f"write `lmcache.pd_peer_init_port: {want}` (one port per rank, TP 2)")], raw


def test_opd608_lmcache_env_form_and_old_names_and_pp_ranks() -> None:
    # LMCACHE_PD_PEER_INIT_PORT goes through LMCache's _to_int_list: "7300,7301" is a list of two, 7300 of one
    text = _lmc_rx().replace("lmcache.pd_peer_init_port: [7300, 7301], ", "").replace(
        '"2,3", tensor_parallel_size: 2,', '"2,3", tensor_parallel_size: 2, env: {LMCACHE_PD_PEER_INIT_PORT: "@@"},')
    assert found(text.replace("@@", "7300,7301"), "OPD608") == []
    assert found(text.replace("@@", "7300,7301"), "OPD504") == []
    assert [g[1] for g in found(text.replace("@@", "7300"), "OPD608")] == [
        "stage 1 (TP 2): LMCACHE_PD_PEER_INIT_PORT lists 1 port; LMCache's PD backend takes one per worker rank "
        "(rank 1 fails with IndexError at start)"]
    # the extra-config key wins over the variable (vLLM's adapter applies it last)
    both = _lmc_rx().replace('"2,3", tensor_parallel_size: 2,', '"2,3", tensor_parallel_size: 2, env: {LMCACHE_PD_PEER_INIT_PORT: "7300"},')
    assert found(both, "OPD608") == []
    # LMCache <= 0.3 names (BR-50's report): same rule
    old = _lmc_rx("[7300]").replace("lmcache.pd_peer_", "lmcache.nixl_peer_")
    assert [g[1][:60] for g in found(old, "OPD608")] == ["stage 1 (TP 2): lmcache.nixl_peer_init_port lists 1 port; LM"]
    # PP ranks index it too: TP 2 x PP 2 needs four
    pp = _lmc_rx().replace('"2,3", tensor_parallel_size: 2,', '"2,3,4,5", tensor_parallel_size: 2, pipeline_parallel_size: 2,')
    assert [g[1][:62] for g in found(pp, "OPD608")] == [
        "stage 1 (TP 2 x PP 2): lmcache.pd_peer_init_port lists 2 ports", "stage 1 (TP 2 x PP 2): lmcache.pd_peer_alloc_port lists 2 port"]
    # another connector's keys of the same name are not LMCache's
    nixl = _lmc_rx("[7300]").replace("LMCacheConnectorV1", "NixlConnector")
    assert found(nixl, "OPD608") == []
