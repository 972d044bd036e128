"""Device rules judge each replica on the devices the runtime gives it.

vllm-omni 0.30 splits a stage's ``devices`` among its ``num_replicas`` by
``split_devices_for_replicas`` (vllm_omni/engine/stage_init_utils.py): a pool of every
replica's devices, or one replica's template that replica r shifts by ``r x`` its size.
Found in a walkthrough: ``devices: "0"`` with two replicas put replica 1 on device 1, where
the Talker and Code2Wav already reserved 0.9, and validate passed; ``devices: "1"`` (an
offset past one replica's one device: vllm-omni's ValueError) passed too. omni-pd's launcher
of the plain ``vllm`` runtime splits its instances by the same rule (it shared one device).
"""

from __future__ import annotations

import pytest

from omni_pd.check.validate import ValidateOptions, validate_text
from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.diagnostics import OmniPdError
from omni_pd.io import load_file, parse_text
from omni_pd.launch.plan import LaunchOptions, plan_document
from omni_pd.resources import preset_path
from rule_found import found  # tests/rule_found.py

OMNI = ("pipeline: qwen3_omni_moe\nstages:\n"
        "  - {{stage_id: 0, devices: \"{d}\", num_replicas: 2, gpu_memory_utilization: 0.9}}\n"
        "  - {{stage_id: 1, devices: \"{o}\", gpu_memory_utilization: 0.6}}\n"
        "  - {{stage_id: 2, devices: \"{o}\", gpu_memory_utilization: 0.3}}\n")


def _codes(text: str, opts: ValidateOptions | None = None) -> list[tuple[str, str]]:
    res = validate_text(text, "t.yaml", opts or ValidateOptions())
    return [(d.code, d.message) for d in res.diagnostics if d.severity.value in ("error", "warning")]


def test_template_replica_counts_on_its_own_device_in_the_memory_budget():
    hits = found(OMNI.format(d="0", o="1"), "OPD404")
    assert [(h[0], h[1]) for h in hits] == [
        ("error", "physical GPU 1: 0.9 (stage 0, replica 1) + 0.6 (stage 1) + 0.3 (stage 2) = 1.80 > 1.0")]
    assert hits[0][2] == (5, 57)  # stage 2's gpu_memory_utilization, the last contributor


def test_a_pool_of_one_device_per_replica_is_unchanged():
    assert _codes(OMNI.format(d="0,1", o="2")) == []
    # the pool's replica 1 shares device 1 with the talker: counted there, as before
    assert [h[1] for h in found(OMNI.format(d="0,1", o="1"), "OPD404")] == [
        "physical GPU 1: 0.9 (stage 0, replica 1) + 0.6 (stage 1) + 0.3 (stage 2) = 1.80 > 1.0"]


def test_an_offset_past_one_replicas_devices_is_vllm_omnis_value_error():
    hits = found(OMNI.format(d="1", o="2"), "OPD401")
    assert len(hits) == 1
    sev, msg, at, hlp, related = hits[0]
    assert (sev, at) == ("error", (3, 28))
    assert msg == ("stage 0: num_replicas 2 with devices \"1\" (1 device per replica) is a per-replica template: "
                   "replica r takes device r x 1 + each entry, so every entry must be below 1; vllm-omni refuses to "
                   "start (vllm-omni 0.30 split_devices_for_replicas: ValueError: Stage 0: template-mode device "
                   "offset(s) [1] out of range [0, 1); devices='1')")
    assert hlp == ("write the template as offsets (devices: \"0\": replica r on device r x 1 + each), or list every "
                   "replica's devices, 2 devices (the pool, e.g. devices: \"0,1\")")
    assert related == [(3, 47, "replicas")]


def test_tp2_template_offsets_and_lengths():
    tp2 = "pipeline: qwen3_omni_moe\nstages:\n  - {{stage_id: 0, devices: \"{d}\", num_replicas: 2, tensor_parallel_size: 2}}\n"
    assert found(tp2.format(d="0,1"), "OPD401") == []      # template: replicas on 0,1 and 2,3
    assert found(tp2.format(d="0,1,2,3"), "OPD401") == []  # pool
    assert "offset(s) [2] out of range [0, 2)" in found(tp2.format(d="0,2"), "OPD401")[0][1]
    msg = found(tp2.format(d="0,1,2"), "OPD401")[0][1]
    assert msg.endswith("with num_replicas 2, vllm-omni takes 2 entries (one replica's template) or 4 (the pool "
                        "of every replica)")


def test_the_visible_count_rule_sees_a_template_replica():
    inv = {"hosts": {"host-a": {"accelerator": "cuda", "count": 1}}}
    hits = found("pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"0\", num_replicas: 2,"
                 " gpu_memory_utilization: 0.4}\n", "OPD402", {"inventory": inv}, notes=True)
    assert len(hits) == 1
    assert hits[0][1] == "stage 0 (replica 1) uses device 1, but only 1 GPU is visible (host host-a has 1)"
    assert hits[0][5] == ["num_replicas 2 with devices \"0\" is vllm-omni's per-replica template: replica 0 on 0; "
                          "replica 1 on 1"]


LLM_PD = ("pipeline: llm_pd\nstages:\n"
          "  - {{stage_id: 0, devices: \"{p}\", num_replicas: 2, gpu_memory_utilization: 0.8,"
          " kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_producer}}}}\n"
          "  - {{stage_id: 1, devices: \"{d}\", gpu_memory_utilization: 0.8,"
          " kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_consumer}}}}\n")


def test_vllm_runtime_planner_and_validate_agree_on_a_template(tmp_path):
    # the launcher starts prefill-1 on device 1 (it shared device 0 before): decode there is
    # a shared device and an over-full budget
    text = LLM_PD.format(p="0", d="1")
    assert [h[1] for h in found(text, "OPD403")] == [
        "prefill (stage 0) and decode (stage 1) share GPU 1; disaggregation gives no isolation"]
    assert [h[1] for h in found(text, "OPD404")] == ["physical GPU 1: 0.8 (stage 0, replica 1) + 0.8 (stage 1) = 1.60 > 1.0"]
    ok = tmp_path / "ok.yaml"
    ok.write_text(LLM_PD.format(p="0", d="2"))
    planned = plan_document(load_file(ok), str(ok), LaunchOptions(model="m"))
    assert planned.plan is not None, [d.message for d in planned.validation.diagnostics]
    devs = {p.name: p.env.get("CUDA_VISIBLE_DEVICES") for p in planned.plan.processes}
    assert (devs["prefill-0"], devs["prefill-1"], devs["decode-0"]) == ("0", "1", "2")


def test_vllm_runtime_offset_error_names_omni_pds_launcher():
    msg = found(LLM_PD.format(p="1", d="3"), "OPD401")[0][1]
    assert "omni-pd's launcher, which splits replicas by vllm-omni's rule, cannot place them" in msg


def test_vllm_omni_plan_notes_where_vllm_omni_places_replicas(tmp_path):
    f = tmp_path / "pd.yaml"
    f.write_text("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
                 "  - {stage_id: 0, devices: \"0\", num_replicas: 2, async_scheduling: false, kv_transfer_config:"
                 " {kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p}}\n"
                 "  - {stage_id: 1, devices: \"2\", kv_transfer_config: {kv_connector: MooncakeConnector,"
                 " kv_role: kv_consumer, engine_id: d}}\n")
    planned = plan_document(load_file(f), str(f), LaunchOptions(model="m"))
    assert planned.plan is not None, [d.message for d in planned.validation.diagnostics]
    assert ("vllm-omni places stage 0's 2 replicas itself: replica 0 on device 0, replica 1 on device 1 "
            "(a per-replica template \"0\")") in planned.plan.notes


@pytest.mark.parametrize("pipeline", ["qwen3_omni_moe", "llm"])
@pytest.mark.parametrize("replicas,tp", [(2, 1), (3, 1), (2, 2)])
def test_expand_of_a_file_with_num_replicas_validates_clean(pipeline, replicas, tp):
    if pipeline == "llm":
        src = (f"pipeline: llm\nstages:\n  - {{stage_id: 0, devices: \"{','.join(map(str, range(tp)))}\", "
               f"num_replicas: {replicas}, tensor_parallel_size: {tp}}}\n")
    else:
        src = preset_path("qwen3_omni_moe").read_text().replace(
            '    devices: "0"\n', f'    devices: "0"\n    num_replicas: {replicas}\n', 1)
    res = expand_document(parse_text(src, f"{pipeline}.yaml"), ExpandOptions(tp=tp))
    assert _codes(res.text) == []
    out = validate_text(res.text, "pd.yaml", ValidateOptions())
    assert not [d for d in out.diagnostics if d.code.startswith("OPD40")]


LLM_X2 = "pipeline: llm\nstages:\n  - {stage_id: 0, devices: \"0\", num_replicas: 2}\n"


def test_expand_writes_a_replicated_sides_device_options_verbatim_as_its_pool():
    # --prefill-devices/--decode-devices list the side's devices as the file holds them:
    # with num_replicas 2 the pool, replica r on the r-th engine's devices
    res = expand_document(parse_text(LLM_X2, "llm.yaml"), ExpandOptions(prefill_devices=(4, 5), decode_devices=(0, 1)))
    assert 'devices: "4,5"' in res.text and 'devices: "0,1"' in res.text
    assert _codes(res.text) == []


@pytest.mark.parametrize("opts,side,given", [
    (ExpandOptions(prefill_devices=(0,)), "prefill", 1),              # a valid vllm-omni template
    (ExpandOptions(prefill_devices=(1,)), "prefill", 1),              # the property tests' example
    (ExpandOptions(prefill_devices=(0,), decode_devices=(1,)), "prefill", 1),
    (ExpandOptions(prefill_devices=(0, 1), decode_devices=(3,)), "decode", 1),
    (ExpandOptions(prefill_devices=(0, 1, 2)), "prefill", 3),
])
def test_expand_refuses_a_device_option_that_is_not_every_replicas_devices(opts, side, given):
    # one engine's list would be vllm-omni's per-replica template in the file: replica 1 on a
    # device the option did not name ("0" -> 0,1; with decode "1" -> 1,2, prefill's device 1),
    # or its ValueError ("1" x 2); expand neither guesses nor writes it
    with pytest.raises(OmniPdError) as e:
        expand_document(parse_text(LLM_X2, "llm.yaml"), opts)
    d = e.value.diagnostic
    assert (d.code, d.message) == ("OPD805", f"--{side}-devices lists {given} device(s); {side} needs 2 (2 replicas, "
                                             "the Thinker's num_replicas, x 1 device(s) each: TP 1 from the Thinker "
                                             "x PP 1 x DP 1)")
    example = "0,1" if side == "prefill" else "2,3"
    assert d.help.startswith(f"give --{side}-devices every replica's devices, 2 (written as the {side} stage's "
                             f"devices, replica r on the r-th 1 of them), e.g. \"{example}\"")
    assert ("per-replica template" in d.help) == (given == 1)


def test_plan_pd_split_refuses_a_one_engine_option_for_num_replicas_like_xpyd():
    # plan_pd_split's own check (callers without expand's option check): the xPyD message
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.passes.pd_split import plan_pd_split
    from omni_pd.compile.targets import target
    from omni_pd.compile.topology import resolve

    cat = load_catalogue()
    topo = resolve(parse_config(parse_text(LLM_X2, "llm.yaml")), cat.get("llm"), None)
    with pytest.raises(OmniPdError) as e:
        plan_pd_split(topo, cat, target("0.30"), ExpandOptions(decode_devices=(5,)))
    d = e.value.diagnostic
    assert (d.code, d.message) == ("OPD805", "--decode-devices lists 1 device(s); 2 are needed "
                                             "(2 instance(s) x 1 device(s) each)")