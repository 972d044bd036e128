"""Every branch of the device rules (OPD401-OPD404), with exact messages, locations, help
lines and related spans (issue 16). The rule examples' golden (tests/test_rule_branches.py)
reaches a few branches of each; these pin the others, named by the mutation run of
omni_pd/check/rules/devices.py (bench/mutation.py).
"""

from __future__ import annotations

from omni_pd.check.validate import ValidateOptions, validate_text
from rule_found import found  # tests/rule_found.py


_Q = "pipeline: qwen3_omni_moe\nstages:\n"


# --- OPD401 world size ------------------------------------------------------------------------------

def test_opd401_more_devices_than_the_world_on_a_known_engine() -> None:
    assert found("stages:\n  - {stage_id: 0, devices: \"0,1,2\", tensor_parallel_size: 2}\n", "OPD401") == [(
        "error", "stage 0: tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 1 = 2 devices, but "
                 "devices has 3 entries", (2, 28), "list 2 devices here, e.g. devices: \"0,1\"", [])]


def test_opd401_pool_mode_needs_exactly_world_times_replicas() -> None:
    text = "stages:\n  - {stage_id: 0, devices: \"0,1,2\", num_replicas: 2, tensor_parallel_size: 2}\n"
    assert [h[1] for h in found(text, "OPD401")] == [
        "stage 0: tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 1 = 2 devices, but devices "
        "has 3 entries; with num_replicas 2, omni-pd's launcher takes 2 entries (one replica's template) or 4 (the "
        "pool of every replica)"]
    # one replica: the pool product is not an alternative
    text = "stages:\n  - {stage_id: 0, devices: \"0,1\", num_replicas: 1}\n"
    assert [h[1] for h in found(text, "OPD401")] == [
        "stage 0: tensor_parallel_size 1 x pipeline_parallel_size 1 x data_parallel_size 1 = 1 device, but devices "
        "has 2 entries"]


def test_opd401_one_device_is_singular() -> None:
    # a review found "= 1 devices" and "list 1 devices here"
    text = "stages:\n  - {stage_id: 0, devices: \"0,1\", num_replicas: 1}\n"
    assert [(h[1], h[3]) for h in found(text, "OPD401")] == [(
        "stage 0: tensor_parallel_size 1 x pipeline_parallel_size 1 x data_parallel_size 1 = 1 device, but devices "
        "has 2 entries", "list 1 device here, e.g. devices: \"0\"")]
    nested = "stages:\n  - {stage_id: 0, devices: \"0,1\", parallel_config: {tensor_parallel_size: 1}}\n"
    assert [(h[1], h[3]) for h in found(nested, "OPD401")] == [(
        "stage 0: the effective parallel_config needs 1 device (TP 1 x PP 1 x DP 1), but devices has 2 entries",
        "list 1 device here, e.g. devices: \"0\"")]


def test_opd401_a_stage_omni_pd_does_not_know_may_use_more_devices_but_not_fewer() -> None:
    # an inferred linear chain (no pipeline can be named): its stages' kind is unknown
    text = "stages:\n  - {stage_id: 0, devices: \"0,1,2\"}\n  - {stage_id: 1, devices: \"3\", tensor_parallel_size: 2}\n"
    assert found(text, "OPD401") == [(
        "error", "stage 1: tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 1 = 2 devices, but "
                 "devices has 1 entry", (3, 28), "list 2 devices here, e.g. devices: \"3,4\"", [])]


def test_opd401_pp_and_dp_enter_the_product() -> None:
    text = "stages:\n  - {stage_id: 0, devices: \"0\", data_parallel_size: 2, pipeline_parallel_size: 3}\n"
    assert found(text, "OPD401") == [(
        "error", "stage 0: tensor_parallel_size 1 x pipeline_parallel_size 3 x data_parallel_size 2 = 6 devices, but "
                 "devices has 1 entry", (2, 28), "list 6 devices here, e.g. devices: \"0,1,2,3,4,5\"", [])]


def test_opd401_the_global_tp_with_a_nested_parallel_config() -> None:
    text = "stages:\n  - {stage_id: 0, devices: \"0\", parallel_config: {tensor_parallel_size: 2}}\n"
    assert found(text, "OPD401", {"cli": {"tensor_parallel_size": 2}}) == [(
        "error", "stage 0: the effective parallel_config needs 2 devices (TP 2 x PP 1 x DP 1) (from the global "
                 "--tensor-parallel-size), but devices has 1 entry", (2, 28), "list 2 devices here, e.g. devices: \"0,1\"",
        [])]


def test_opd401_an_empty_parallel_config_is_not_the_nested_one() -> None:
    text = "stages:\n  - {stage_id: 0, devices: \"0\", parallel_config: {}, tensor_parallel_size: 2}\n"
    assert [h[1] for h in found(text, "OPD401")] == [
        "stage 0: tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 1 = 2 devices, but devices "
        "has 1 entry"]


def test_opd401_the_example_list_stops_at_64_devices() -> None:
    def help_for(tp: int) -> str:
        return found(f"stages:\n  - {{stage_id: 0, devices: \"0\", tensor_parallel_size: {tp}}}\n", "OPD401")[0][3]

    assert help_for(64) == f"list 64 devices here, e.g. devices: \"{','.join(map(str, range(64)))}\""
    assert help_for(65) == "list 65 devices here, or lower the parallel sizes"


def test_world_help_below_one() -> None:
    from omni_pd.check.rules.devices import _world_help

    assert _world_help(0) == "parallel sizes must be at least 1"
    assert _world_help(1) == "list 1 device here, e.g. devices: \"0\""
    assert _world_help(2) == "list 2 devices here, e.g. devices: \"0,1\""


# --- OPD402 device exists ---------------------------------------------------------------------------

_THREE = "stages:\n  - {stage_id: 0, devices: \"0,1,2\", tensor_parallel_size: 3}\n"


def test_opd402_npu_hosts_count_npus_in_the_plural() -> None:
    ctx = {"platform": "npu", "inventory": {"hosts": {"h": {"accelerator": "npu", "count": 2}}}}
    assert found(_THREE, "OPD402", ctx) == [(
        "error", "stage 0 uses device 2, but only 2 NPUs are visible (host h has 2)", (2, 28),
        "use device indices 0..1, or run on a host with more NPUs", [])]


def test_opd402_the_visibility_variable_wins_and_empty_entries_do_not_count() -> None:
    ctx = {"env": {"CUDA_VISIBLE_DEVICES": "4, 5,"}, "inventory": {"hosts": {"h": {"count": 8}}}}
    assert found(_THREE, "OPD402", ctx) == [(
        "error", "stage 0 uses device 2, but only 2 GPUs are visible (the launcher's visibility variable lists 2)",
        (2, 28), "use device indices 0..1, or run on a host with more GPUs", [])]


def test_opd402_a_blank_visibility_variable_falls_back_to_the_inventory_and_every_bad_index_is_named() -> None:
    ctx = {"env": {"CUDA_VISIBLE_DEVICES": " "}, "inventory": {"hosts": {"h": {"count": 1}}}}
    assert found(_THREE, "OPD402", ctx) == [(
        "error", "stage 0 uses device 1, 2, but only 1 GPU is visible (host h has 1)", (2, 28),
        "use device indices 0..0, or run on a host with more GPUs", [])]


def test_opd402_the_hosts_accelerator_picks_the_visibility_variable_and_the_word() -> None:
    ctx = {"env": {"ASCEND_RT_VISIBLE_DEVICES": "3", "CUDA_VISIBLE_DEVICES": "0,1,2"},
           "inventory": {"hosts": {"h": {"accelerator": "npu"}}}}
    assert found("stages:\n  - {stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2}\n", "OPD402", ctx) == [(
        "error", "stage 0 uses device 1, but only 1 NPU is visible (the launcher's visibility variable lists 1)",
        (2, 28), "use device indices 0..0, or run on a host with more NPUs", [])]


def test_opd402_a_platform_overlay_that_moves_the_stage_is_named() -> None:
    text = _Q + "  - {stage_id: 0, devices: \"0\"}\nplatforms:\n  rocm:\n    stages:\n      - {stage_id: 0, devices: \"3\"}\n"
    assert found(text, "OPD402", opts=ValidateOptions(platform="rocm", env={"HIP_VISIBLE_DEVICES": "0,1"})) == [(
        "error", "stage 0 rocm overlay places device 3, but only 2 GPUs are visible (the launcher's visibility "
                 "variable lists 2)", (7, 32), "use device indices 0..1, or run on a host with more GPUs", [])]
    # the same platform without an overlay in the file
    text = _Q + "  - {stage_id: 0, devices: \"3\"}\n"
    assert [h[1] for h in found(text, "OPD402", opts=ValidateOptions(platform="rocm",
                                                                      env={"HIP_VISIBLE_DEVICES": "0,1"}))] == [
        "stage 0 uses device 3, but only 2 GPUs are visible (the launcher's visibility variable lists 2)"]


def test_opd402_an_unknown_count_is_not_checked() -> None:
    # two hosts and no placement: the stage is where expand and launch place it (the proposal,
    # omni_pd/compile/placement.py: a stage that is not prefill goes to the second host)
    assert found("stages:\n  - {stage_id: 0, devices: \"7\"}\n", "OPD402",
                 {"inventory": {"hosts": {"h": {"count": 1}, "g": {"count": 1}}}}) == [(
        "error", "stage 0 uses device 7, but only 1 GPU is visible (host g has 1)", (2, 28),
        "use device indices 0..0, or run on a host with more GPUs", [])]
    assert found("stages:\n  - {stage_id: 0, devices: \"7\"}\n", "OPD402",
                 {"inventory": {"hosts": {"h": {"count": 1}, "g": {}}}}) == []
    assert found("stages:\n  - {stage_id: 0, devices: \"7\"}\n", "OPD402", {"inventory": {"hosts": {"h": {}}}}) == []


# --- OPD403 PD shared device ------------------------------------------------------------------------

_P2P = ("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
        "  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.45, kv_transfer_config: {kv_connector: "
        "P2pNcclConnector, kv_role: kv_producer, kv_buffer_size: 8589934592}}\n"
        "  - {stage_id: 1, devices: \"D\", gpu_memory_utilization: 0.45, kv_transfer_config: {kv_connector: "
        "P2pNcclConnector, kv_role: kv_consumer, kv_buffer_size: 1e9}}\n")
_SHARE_HELP = "give decode its own devices, or set `allow_shared_devices: true` in the inventory for a smoke test"


def test_opd403_two_logical_devices_that_are_one_physical_device() -> None:
    text = _P2P.replace("\"D\"", "\"1\"")
    assert found(text, "OPD403", {"env": {"CUDA_VISIBLE_DEVICES": "5,5"}}) == [(
        "warning", "prefill (stage 0) and decode (stage 1) share GPU 5; disaggregation gives no isolation", (5, 28),
        _SHARE_HELP, [(4, 28, "prefill devices")])]


def test_opd403_npu_wording_and_the_inventorys_switch() -> None:
    text = _P2P.replace("\"D\"", "\"0\"")
    assert [h[1] for h in found(text, "OPD403", {"platform": "npu"})] == [
        "prefill (stage 0) and decode (stage 1) share NPU 0; disaggregation gives no isolation"]
    assert found(text, "OPD403", {"inventory": {"hosts": {"h": {}}, "allow_shared_devices": True}}) == []
    assert len(found(text, "OPD403", {"inventory": {"hosts": {"h": {}}, "allow_shared_devices": False}})) == 1


def test_opd403_the_same_index_on_two_hosts_is_not_shared() -> None:
    text = _P2P.replace("\"D\"", "\"0\"")
    assert found(text, "OPD403", {"inventory": {"hosts": {"a": {}, "b": {}}, "placement": {"all": "a", "1": "b"}}}) == []


# --- OPD404 memory budget ---------------------------------------------------------------------------

_MEM_HELP = "lower gpu_memory_utilization so the stages on this device sum to at most 1.0, or move one to another device"


def test_opd404_each_tp_rank_counts_on_its_own_device() -> None:
    text = (_Q + "  - {stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2, gpu_memory_utilization: 0.6}\n"
            "  - {stage_id: 1, devices: \"1\", gpu_memory_utilization: 0.5}\n")
    assert found(text, "OPD404") == [(
        "error", "physical GPU 1: 0.6 (stage 0, TP rank 1) + 0.5 (stage 1) = 1.10 > 1.0", (4, 57), _MEM_HELP,
        [(3, 84, "stage 0 reserves 0.6")])]


def test_opd404_a_pp_rank_is_a_rank_and_a_pool_replica_is_named() -> None:
    text = (_Q + "  - {stage_id: 0, devices: \"0,1\", pipeline_parallel_size: 2, gpu_memory_utilization: 0.6}\n"
            "  - {stage_id: 1, devices: \"1\", gpu_memory_utilization: 0.5}\n")
    assert [h[1] for h in found(text, "OPD404")] == ["physical GPU 1: 0.6 (stage 0, PP rank 1) + 0.5 (stage 1) = 1.10 > 1.0"]
    text = (_Q + "  - {stage_id: 0, devices: \"0,1,2,3\", num_replicas: 2, tensor_parallel_size: 2, "
            "gpu_memory_utilization: 0.6}\n  - {stage_id: 1, devices: \"3\", gpu_memory_utilization: 0.5}\n")
    assert found(text, "OPD404") == [(
        "error", "physical GPU 3: 0.6 (stage 0, replica 1, TP rank 1) + 0.5 (stage 1) = 1.10 > 1.0", (4, 57), _MEM_HELP,
        [(3, 105, "stage 0 reserves 0.6")])]


def test_opd404_vllms_default_counts_for_a_known_engine_without_the_key() -> None:
    text = _Q + "  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.2}\n"
    assert found(text, "OPD404") == [(
        "error", "physical GPU 0: 0.9 (vLLM default) (stage 0) + 0.2 (stage 1) = 1.10 > 1.0", (4, 57), _MEM_HELP,
        [(3, 5, "stage 0 reserves 0.9")])]


def test_opd404_a_value_that_is_not_a_number_is_not_counted_as_the_default() -> None:
    # a review found OPD101's dropped value counted as "0.9 (vLLM default)" although the file sets the key: vLLM
    # would not start that engine (OPD101 says why), so its share is unknown and not counted
    text = (_Q + "  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: high}\n"
            "  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.3}\n")
    assert found(text, "OPD404") == []
    assert [h[1] for h in found(text, "OPD101")] == ["`gpu_memory_utilization` must be a number, found 'high'"]
    # the other stages on the device are still summed (the skipped stage does not end the scan); a value
    # under engine_args (untyped) that is not a number is not counted either
    for bad in ("gpu_memory_utilization: high", "engine_args: {gpu_memory_utilization: [0.5]}"):
        text = (_Q + "  - {stage_id: 0, devices: \"0\", " + bad + "}\n"
                "  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.6}\n"
                "  - {stage_id: 2, devices: \"0\", gpu_memory_utilization: 0.6}\n")
        assert [h[1] for h in found(text, "OPD404")] == ["physical GPU 0: 0.6 (stage 1) + 0.6 (stage 2) = 1.20 > 1.0"]
    # null is YAML for unset: vLLM's default counts
    text = (_Q + "  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: null}\n"
            "  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.3}\n")
    assert [h[1] for h in found(text, "OPD404")] == [
        "physical GPU 0: 0.9 (vLLM default) (stage 0) + 0.3 (stage 1) = 1.20 > 1.0"]


def test_opd404_an_unknown_engine_without_the_key_is_not_counted() -> None:
    # an inferred chain: the stages' kind is unknown, so vLLM's default is not theirs
    assert found("stages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"0\"}\n", "OPD404") == []


def test_opd404_a_sum_of_exactly_one_fits() -> None:
    text = (_Q + "  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.7}\n"
            "  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.3}\n")
    assert found(text, "OPD404") == []


def test_opd404_sums_per_host_and_names_the_host() -> None:
    text = (_Q + "  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.7}\n"
            "  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.7}\n"
            "  - {stage_id: 2, devices: \"0\", gpu_memory_utilization: 0.7}\n")
    assert found(text, "OPD404", {"inventory": {"hosts": {"a": {}, "b": {}}, "placement": {"all": "a", "1": "b"}}}) == [(
        "error", "a: physical GPU 0: 0.7 (stage 0) + 0.7 (stage 2) = 1.40 > 1.0", (5, 57), _MEM_HELP,
        [(3, 57, "stage 0 reserves 0.7")])]


def test_opd404_logical_devices_map_to_physical_ones_through_the_visibility_variable() -> None:
    text = (_Q + "  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.7}\n"
            "  - {stage_id: 1, devices: \"1\", gpu_memory_utilization: 0.7}\n")
    assert [h[1] for h in found(text, "OPD404", {"env": {"CUDA_VISIBLE_DEVICES": "3,3"}})] == [
        "physical GPU 3: 0.7 (stage 0, logical device 0 of CUDA_VISIBLE_DEVICES=3,3) + 0.7 (stage 1, logical device 1 "
        "of CUDA_VISIBLE_DEVICES=3,3) = 1.40 > 1.0"]


def test_opd404_p2pnccl_buffers_count_as_a_fraction_of_the_devices_memory() -> None:
    text = _P2P.replace("\"D\"", "\"0\"")
    ctx = {"inventory": {"hosts": {"h": {"memory_gib": 80}}, "allow_shared_devices": True}}
    # 8 GiB / 80 GiB = 0.10; 1e9 bytes / 80 GiB = 0.0116
    assert found(text, "OPD404", ctx) == [(
        "error", "h: physical GPU 0: 0.45 (stage 0) + 0.10 connector buffer + 0.45 (stage 1) + 0.01 connector buffer "
                 "= 1.01 > 1.0", (5, 57), _MEM_HELP, [(4, 57, "stage 0 reserves 0.55")])]


def test_opd404_a_single_stage_over_one_with_its_buffer() -> None:
    text = ("pipeline: llm\nstages:\n  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.95, kv_transfer_config: "
            "{kv_connector: P2pNcclConnector, kv_role: kv_both, kv_buffer_size: 8589934592}}\n")
    assert [h[1] for h in found(text, "OPD404", {"inventory": {"hosts": {"h": {"memory_gib": 80}}}})] == [
        "h: physical GPU 0: 0.95 (stage 0) + 0.10 connector buffer = 1.05 > 1.0"]


def test_opd404_buffers_that_are_not_on_the_device_or_cannot_be_sized_do_not_count() -> None:
    text = _P2P.replace("\"D\"", "\"0\"")
    assert found(text, "OPD404", {"inventory": {"hosts": {"h": {}}}}) == []  # memory_gib unknown
    assert found(text, "OPD404") == []  # no inventory
    cpu = text.replace("kv_buffer_size: 8589934592", "kv_buffer_size: 8589934592, kv_buffer_device: cpu")
    assert found(cpu, "OPD404", {"inventory": {"hosts": {"h": {"memory_gib": 80}}}}) == []
    nccl = text.replace("P2pNcclConnector", "NixlConnector")
    assert found(nccl, "OPD404", {"inventory": {"hosts": {"h": {"memory_gib": 80}}}}) == []


def test_opd404_points_into_the_file_being_validated_when_it_sets_a_contributor(tmp_path) -> None:
    (tmp_path / "base.yaml").write_text(
        _Q + "  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.8}\n"
        "  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.7}\n  - {stage_id: 2, devices: \"1\"}\n",
        encoding="utf-8")
    base, child = str(tmp_path / "base.yaml"), str(tmp_path / "child.yaml")

    def hits(text: str) -> list[tuple]:
        res = validate_text(text, child)
        return [(d.message, (d.location.file, d.location.line, d.location.column),
                 [(r.file, r.line, r.column, r.label) for r in d.related]) for d in res.diagnostics if d.code == "OPD404"]

    # the child sets stage 0's share: the finding points there, not at stage 1 (the last) in the base
    assert hits("base_config: base.yaml\nstages:\n  - {stage_id: 0, gpu_memory_utilization: 0.6}\n") == [(
        "physical GPU 0: 0.6 (stage 0) + 0.7 (stage 1) = 1.30 > 1.0", (child, 3, 43),
        [(base, 4, 57, "stage 1 reserves 0.7")])]
    # the child sets none of them: the last contributor, in the base
    assert hits("base_config: base.yaml\nstages:\n  - {stage_id: 2, enforce_eager: true}\n") == [(
        "physical GPU 0: 0.8 (stage 0) + 0.7 (stage 1) = 1.50 > 1.0", (base, 4, 57),
        [(base, 3, 57, "stage 0 reserves 0.8")])]
    # the child has stage 0's entry but not its gpu_memory_utilization: still the base's last
    assert hits("base_config: base.yaml\nstages:\n  - {stage_id: 0, enforce_eager: true}\n") == [(
        "physical GPU 0: 0.8 (stage 0) + 0.7 (stage 1) = 1.50 > 1.0", (base, 4, 57),
        [(base, 3, 57, "stage 0 reserves 0.8")])]


def test_opd403_a_side_without_devices_shares_nothing() -> None:
    text = _P2P.replace(", devices: \"D\"", "")
    assert found(text, "OPD403") == []


def test_opd404_a_buffer_on_a_host_the_inventory_cannot_name_is_not_sized() -> None:
    # two hosts and no placement: the stages' host is unknown, so is its memory
    text = _P2P.replace("\"D\"", "\"0\"").replace("0.45", "0.5")
    assert found(text, "OPD404", {"inventory": {"hosts": {"h": {"memory_gib": 80}, "g": {"memory_gib": 80}},
                                                "allow_shared_devices": True}}) == []


def test_opd404_a_buffer_size_that_is_not_a_number_adds_nothing() -> None:
    text = _P2P.replace("\"D\"", "\"0\"").replace("0.45", "0.5").replace("kv_buffer_size: 1e9", "kv_buffer_size: big")
    ctx = {"inventory": {"hosts": {"h": {"memory_gib": 80}}, "allow_shared_devices": True}}
    assert [h[1] for h in found(text, "OPD404", ctx)] == [
        "h: physical GPU 0: 0.5 (stage 0) + 0.10 connector buffer + 0.5 (stage 1) = 1.10 > 1.0"]


def test_opd401_a_stage_without_devices_or_with_the_right_count_does_not_end_the_scan() -> None:
    text = ("stages:\n  - {stage_id: 0}\n  - {stage_id: 1, devices: \"0,1\", tensor_parallel_size: 2}\n"
            "  - {stage_id: 2, devices: \"2\", tensor_parallel_size: 2}\n")
    assert [(h[1], h[2]) for h in found(text, "OPD401")] == [(
        "stage 2: tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 1 = 2 devices, but devices "
        "has 1 entry", (4, 28))]


def test_opd402_a_stage_without_devices_or_on_a_host_of_unknown_size_does_not_end_the_scan() -> None:
    # stage 1 is on a host whose count the inventory does not give
    text = ("stages:\n  - {stage_id: 0}\n  - {stage_id: 1, devices: \"5\"}\n  - {stage_id: 2, devices: \"1\"}\n")
    ctx = {"inventory": {"hosts": {"a": {}, "b": {"count": 1}}, "placement": {"1": "a", "2": "b"}}}
    assert [(h[1], h[2]) for h in found(text, "OPD402", ctx)] == [(
        "stage 2 uses device 1, but only 1 GPU is visible (host b has 1)", (4, 28))]


def test_opd403_names_every_shared_device_in_order() -> None:
    text = (_P2P.replace("\"0\", gpu", "\"1,0\", tensor_parallel_size: 2, gpu")
            .replace("\"D\"", "\"0,1\", tensor_parallel_size: 2"))
    assert [h[1] for h in found(text, "OPD403")] == [
        "prefill (stage 0) and decode (stage 1) share GPU 0, 1; disaggregation gives no isolation"]


def test_opd404_a_stage_without_devices_does_not_end_the_scan() -> None:
    text = (_Q + "  - {stage_id: 0}\n  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.7}\n"
            "  - {stage_id: 2, devices: \"0\", gpu_memory_utilization: 0.7}\n")
    assert [h[1] for h in found(text, "OPD404")] == ["physical GPU 0: 0.7 (stage 1) + 0.7 (stage 2) = 1.40 > 1.0"]


def test_opd404_an_unknown_engine_without_the_key_does_not_end_the_scan() -> None:
    text = ("stages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.7}\n"
            "  - {stage_id: 2, devices: \"0\", gpu_memory_utilization: 0.7}\n")
    assert [h[1] for h in found(text, "OPD404")] == ["physical GPU 0: 0.7 (stage 1) + 0.7 (stage 2) = 1.40 > 1.0"]


def test_opd404_sums_within_one_billionth_of_one_fit() -> None:
    # float rounding: 0.05 + 0.55 + 0.3 + 0.1 is 1.0000000000000002; the rule allows 1e-9, inclusive
    four = "stages:\n" + "".join(f"  - {{stage_id: {i}, devices: \"0\", gpu_memory_utilization: {u}}}\n"
                                 for i, u in enumerate((0.05, 0.55, 0.3, 0.1)))
    assert 0.05 + 0.55 + 0.3 + 0.1 > 1.0 and found(four, "OPD404") == []
    edge = (_Q + "  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.5}\n"
            "  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.500000001}\n")
    assert 0.5 + 0.500000001 == 1.0 + 1e-9 and found(edge, "OPD404") == []
    over = edge.replace("0.500000001", "0.500000002")
    assert [h[1] for h in found(over, "OPD404")] == ["physical GPU 0: 0.5 (stage 0) + 0.5 (stage 1) = 1.00 > 1.0"]


def test_opd404_with_three_contributors_in_the_base_points_at_the_last(tmp_path) -> None:
    (tmp_path / "base.yaml").write_text(
        _Q + "  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.4}\n"
        "  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.4}\n"
        "  - {stage_id: 2, devices: \"0\", gpu_memory_utilization: 0.4}\n", encoding="utf-8")
    res = validate_text("base_config: base.yaml\nasync_chunk: false\n", str(tmp_path / "child.yaml"))
    got = [(d.message, (d.location.file, d.location.line, d.location.column)) for d in res.diagnostics
           if d.code == "OPD404"]
    assert got == [("physical GPU 0: 0.4 (stage 0) + 0.4 (stage 1) + 0.4 (stage 2) = 1.20 > 1.0",
                    (str(tmp_path / "base.yaml"), 5, 57))]


def test_opd401_checks_the_device_list_a_platform_overlay_sets() -> None:
    # the base is right (TP 2 on "0,1"); platforms.rocm moves stage 0 to one device. A
    # brief reported this validating clean under --platform rocm / --all-platforms; it is
    # found at this revision because the rule reads the resolved per-platform node
    # (n.devices, ctx.parallel(n)) and has no platform_first guard: this pins both.
    text = (_Q + "  - {stage_id: 0, tensor_parallel_size: 2, devices: \"0,1\"}\n"
            "platforms:\n  rocm:\n    stages:\n      - {stage_id: 0, devices: \"6\"}\n")
    msg = ("stage 0: tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 1 = 2 devices, but "
           "devices has 1 entry")
    assert found(text, "OPD401") == []
    assert found(text, "OPD401", opts=ValidateOptions(platform="rocm")) == [
        ("error", msg, (7, 32), "list 2 devices here, e.g. devices: \"6,7\"", [])]
    got = [(d.message, d.location.line, d.location.column, list(d.notes))
           for d in validate_text(text, "t.yaml", ValidateOptions(all_platforms=True)).diagnostics if d.code == "OPD401"]
    assert got == [(msg, 7, 32, ["found with the `platforms.rocm` overlay applied"])]


def test_opd403_counts_only_the_devices_a_rank_uses() -> None:
    """Prefill TP 2 on "0,1,2,3" uses 0 and 1 (OPD401 reports the rest): decode on "2,3"
    shares nothing. It said 'share GPU 2, 3' (new-user walkthrough), as OPD404 did before
    item 10; a real overlap is still found."""
    text = ("pipeline: qwen3_omni_moe_thinker_only_pd\nstages:\n"
            "  - {stage_id: 0, devices: \"0,1,2,3\", tensor_parallel_size: 2, gpu_memory_utilization: 0.4,\n"
            "     kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, engine_id: p}}\n"
            "  - {stage_id: 1, devices: \"2,3\", tensor_parallel_size: 2, gpu_memory_utilization: 0.4,\n"
            "     kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d}}\n")
    assert found(text, "OPD403") == []
    overlap = text.replace('devices: "2,3"', 'devices: "1,2"')
    assert [h[1] for h in found(overlap, "OPD403")] == [
        "prefill (stage 0) and decode (stage 1) share GPU 1; disaggregation gives no isolation"]
