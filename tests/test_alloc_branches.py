"""Every branch of compile/alloc.py, with the devices and ports worked out by hand from the
rules in its docstrings (issue 16: oracles independent of the code under test; the mutation
run in bench/MUTATION.md is what these are measured by).

Device rules (``split_devices``): prefill keeps the split stage's devices (or ``world`` of
them from its lowest one), decode takes the next unused ids above prefill, every other
stage's device moves to the smallest free id at or above itself, keeping shared devices
shared and distinct ones distinct. Port rule (``allocate_ports``): first fit at or above the
base, ranges half-open ``[port, port + span)``, nothing past 65535.
"""

from __future__ import annotations

import pytest

from omni_pd.compile.alloc import MAX_PORT, AllocationError, DeviceLayout, allocate_ports, split_devices


def lay(d: DeviceLayout) -> tuple:
    return d.prefill, d.decode, d.others


# --- split_devices: where prefill comes from ---------------------------------------------------------

def test_cpu_split_stage_gives_cpu_to_both_halves_and_leaves_the_rest() -> None:
    assert lay(split_devices({0: "cpu", 1: (0,), 2: None}, 0, 1)) == ("cpu", "cpu", {1: (0,), 2: None})


def test_cpu_split_stage_with_prefill_given_places_decode_after_it() -> None:
    # prefill= overrides the "cpu" shortcut; decode is the next id above prefill
    assert lay(split_devices({0: "cpu", 1: (0,)}, 0, 1, prefill=(1,))) == ((1,), (2,), {1: (0,)})


def test_cpu_split_stage_with_only_decode_given_places_prefill_after_the_devices_in_use() -> None:
    # "cpu" is not a device list: prefill starts after device 0 (stage 1's), decode as given
    assert lay(split_devices({0: "cpu", 1: (0,)}, 0, 1, decode=(5,))) == ((1,), (5,), {1: (0,)})


def test_split_stage_without_devices_starts_after_every_device_in_use() -> None:
    # used by others: 0 and 3 -> prefill 4,5 (world 2), decode 6,7; the others do not move
    assert lay(split_devices({0: None, 1: (0,), 2: (3,)}, 0, 2)) == ((4, 5), (6, 7), {1: (0,), 2: (3,)})


def test_split_stage_without_devices_on_an_empty_host_starts_at_zero() -> None:
    assert lay(split_devices({0: None, 1: "cpu"}, 0, 1)) == ((0,), (1,), {1: "cpu"})


def test_prefill_keeps_the_split_stage_devices_when_world_matches() -> None:
    assert lay(split_devices({0: (2, 3)}, 0, 2)) == ((2, 3), (4, 5), {})


def test_smaller_world_keeps_the_lowest_devices_from_the_first() -> None:
    # devices "3,2", world 1: prefill is the lowest id (2), not the first listed or the highest
    assert lay(split_devices({0: (3, 2)}, 0, 1)) == ((2,), (3,), {})


def test_larger_world_counts_up_from_the_lowest_device() -> None:
    assert lay(split_devices({0: (4,)}, 0, 3)) == ((4, 5, 6), (7, 8, 9), {})


def test_prefill_override_wins_over_the_split_stage_devices() -> None:
    assert lay(split_devices({0: (0,)}, 0, 1, prefill=(5,))) == ((5,), (6,), {})


# --- decode -------------------------------------------------------------------------------------------

def test_decode_override_is_taken_as_given() -> None:
    assert lay(split_devices({0: (0, 1)}, 0, 2, decode=(6, 4))) == ((0, 1), (6, 4), {})


def test_decode_count_sizes_decode_independently_of_prefill() -> None:
    assert lay(split_devices({0: (0,)}, 0, 1, decode_count=3)) == ((0,), (1, 2, 3), {})


def test_decode_skips_prefill_devices_when_prefill_is_given_below_the_stage() -> None:
    # prefill 3 given, split stage on 0: decode starts at 4 (3 is prefill's)
    assert lay(split_devices({0: (0,)}, 0, 1, prefill=(3,))) == ((3,), (4,), {})


def test_decode_may_take_another_stages_device_when_the_split_stage_had_devices() -> None:
    # stage 2 sat on 1; decode takes 1 and stage 2 moves up to 2
    assert lay(split_devices({0: (0,), 1: (0,), 2: (1,)}, 0, 1)) == ((0,), (1,), {1: (0,), 2: (2,)})


def test_decode_steps_over_other_stages_devices_when_the_split_stage_had_none() -> None:
    # no devices on the split stage and prefill given at 1: device 2 belongs to stage 1, so
    # decode goes to 3 and stage 1 stays on 2
    assert lay(split_devices({0: None, 1: (2,)}, 0, 1, prefill=(1,))) == ((1,), (3,), {1: (2,)})


def test_overlapping_prefill_and_decode_are_refused_with_both_lists() -> None:
    with pytest.raises(AllocationError) as e:
        split_devices({0: (0, 1)}, 0, 2, prefill=(0, 1), decode=(1, 2))
    assert str(e.value) == 'prefill devices "0,1" and decode devices "1,2" overlap'


def test_decode_list_shorter_than_decode_count_is_refused() -> None:
    with pytest.raises(AllocationError) as e:
        split_devices({0: (0,)}, 0, 1, decode=(3,), decode_count=2)
    assert str(e.value) == 'decode has 1 device(s) ("3") but its instances need 2'


def test_decode_count_matching_the_given_list_is_accepted() -> None:
    assert lay(split_devices({0: (0,)}, 0, 1, decode=(3, 4), decode_count=2)) == ((0,), (3, 4), {})


def test_unequal_halves_without_decode_count_are_refused() -> None:
    with pytest.raises(AllocationError) as e:
        split_devices({0: (0, 1)}, 0, 2, decode=(3,))
    assert str(e.value) == ('prefill has 2 device(s) ("0,1") but decode has 1 ("3"); both halves need the same '
                            'count')
    assert isinstance(e.value, ValueError)


# --- the other stages -----------------------------------------------------------------------------------

def test_a_stage_sharing_the_split_stage_keeps_sharing_the_same_prefill_position() -> None:
    # TP 2 Thinker on 0,1; the Talker shares 1 (position 1) -> stays on 1; Code2Wav on 2 moves
    # past decode (2,3) to 4
    assert lay(split_devices({0: (0, 1), 1: (1,), 2: (2,)}, 0, 2)) == ((0, 1), (2, 3), {1: (1,), 2: (4,)})


def test_sharing_follows_the_position_when_prefill_is_given() -> None:
    # the split stage's position 0 (device 0) becomes prefill's position 0 (device 5)
    assert lay(split_devices({0: (0,), 1: (0,)}, 0, 1, prefill=(5,))) == ((5,), (6,), {1: (5,)})


def test_a_position_prefill_no_longer_has_is_moved_like_any_device() -> None:
    # split stage 0,1 with world 1: prefill 0, decode 1; the stage that shared 1 (position 1,
    # gone) moves to 2 and the stage on 3 stays distinct on 3
    assert lay(split_devices({0: (0, 1), 1: (1,), 2: (3,)}, 0, 1)) == ((0,), (1,), {1: (2,), 2: (3,)})


def test_distinct_devices_moved_past_decode_stay_distinct() -> None:
    # stages on 1 and 2, prefill 0, decode 1: 1 -> 2, then 2 -> 3 (not 2 again)
    assert lay(split_devices({0: (0,), 1: (1,), 2: (2,)}, 0, 1)) == ((0,), (1,), {1: (2,), 2: (3,)})


def test_shared_devices_stay_shared_after_moving() -> None:
    # stages 1 and 2 both on 1, stage 3 on 1 and 2: the same remap applies to all
    got = split_devices({0: (0,), 1: (1,), 2: (1,), 3: (1, 2)}, 0, 1)
    assert lay(got) == ((0,), (1,), {1: (2,), 2: (2,), 3: (2, 3)})


def test_a_device_above_everything_taken_does_not_move() -> None:
    assert lay(split_devices({0: (0,), 1: (7,)}, 0, 1)) == ((0,), (1,), {1: (7,)})


def test_downstream_places_every_device_stage_there_and_leaves_cpu_and_none() -> None:
    got = split_devices({0: (0,), 1: (0,), 2: (3,), 3: "cpu", 4: None}, 0, 1, downstream=(6, 7))
    assert lay(got) == ((0,), (1,), {1: (6, 7), 2: (6, 7), 3: "cpu", 4: None})


def test_non_device_stages_are_kept_as_they_are() -> None:
    assert lay(split_devices({0: (0,), 1: "cpu", 2: None}, 0, 1)) == ((0,), (1,), {1: "cpu", 2: None})


# --- allocate_ports -------------------------------------------------------------------------------------

def test_ranges_are_placed_one_after_another_from_the_base() -> None:
    assert allocate_ports([2, 1, 3], [], 5000) == [5000, 5002, 5003]


def test_a_used_port_is_stepped_over() -> None:
    assert allocate_ports([1], [(5000, 1)], 5000) == [5001]


def test_a_clash_jumps_to_the_end_of_the_range_it_hits() -> None:
    # used 5000..5009; a port wanted at 5003 goes to 5010
    assert allocate_ports([1], [(5000, 10)], 5003) == [5010]


def test_a_range_that_would_overlap_a_later_used_range_moves_past_it() -> None:
    # 2 ports at 5000 would cover 5001, used by (5001, 2) -> 5003
    assert allocate_ports([2], [(5001, 2)], 5000) == [5003]


def test_ranges_are_half_open_so_touching_ranges_do_not_clash() -> None:
    # used 4998..4999 ends where the base starts; used 5002 starts where [5000, 5002) ends
    assert allocate_ports([2], [(4998, 2), (5002, 1)], 5000) == [5000]


def test_a_zero_span_counts_as_one_port_both_used_and_requested() -> None:
    assert allocate_ports([0, 0], [(100, 0)], 100) == [101, 102]


def test_spans_given_as_other_numbers_are_read_as_integers() -> None:
    assert allocate_ports([2.0, "3"], [], 7000) == [7000, 7002]


def test_a_range_may_end_exactly_on_the_last_port() -> None:
    assert MAX_PORT == 65535
    assert allocate_ports([1], [], 65535) == [65535]
    assert allocate_ports([2], [], 65534) == [65534]


def test_a_range_past_the_last_port_is_refused_naming_span_and_base() -> None:
    with pytest.raises(AllocationError) as e:
        allocate_ports([2], [], 65535)
    assert str(e.value) == "no free range of 2 port(s) at or above 65535"


def test_running_out_after_clashes_is_refused() -> None:
    with pytest.raises(AllocationError) as e:
        allocate_ports([1, 1], [(65534, 1)], 65534)
    assert str(e.value) == "no free range of 1 port(s) at or above 65534"
