"""OPD405 stage-device-overlap: stages whose device sets intersect without being equal.

vllm-omni starts its stages' engines in initialization groups and takes a per-device lock
while a stage initializes. Before vllm-omni #7328 the groups are keyed by the raw
``devices`` string, so two stages on ``"0,1"`` and ``"0"`` start in parallel and wait on
each other's lock on device 0 until ``stage_init_timeout`` (300 s), then initialize
concurrently without it (their memory profiling can interfere). Equal sets (a Talker and a
Code2Wav on one GPU) initialize one after the other; disjoint sets need no lock. Facts:
``presets/targets/device_init.yaml``.

PASS::

    stages:
      - {stage_id: 0, devices: "0,1", tensor_parallel_size: 2}
      - {stage_id: 1, devices: "2"}

FAIL (vllm-omni 0.28)::

    stages:
      - {stage_id: 0, devices: "0,1", tensor_parallel_size: 2}
      - {stage_id: 1, devices: "0"}
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules.devices import _accel_word, _slots, _used_physicals

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    """``presets/targets/device_init.yaml``."""
    from omni_pd.resources import data_dir, load_data

    return dict(load_data(data_dir("presets") / "targets" / "device_init.yaml"))


def init_sets(ctx: Context, n: "StageNode") -> list[frozenset[str]]:
    """The physical device set of each engine instance of stage ``n`` (one per replica,
    each initializing on its own devices as vllm-omni's ``split_devices_for_replicas``
    gives them: pool or template mode, :func:`~omni_pd.check.rules.devices._slots`), only
    devices some rank uses (:func:`_used_physicals`)."""
    used = _used_physicals(ctx, n)
    sets: dict[int | None, list[str]] = {}
    for rep, _, ph, _ in _slots(ctx, n):
        if ph is not None and ph in used:
            sets.setdefault(rep, []).append(ph)
    if list(sets) == [None]:  # one replica, or a split vllm-omni refuses: the old even split
        ordered = sets[None]
        reps = max(1, int(n.num_replicas or 1))
        if reps == 1 or len(ordered) % reps:
            return [frozenset(ordered)]
        per = len(ordered) // reps
        return [frozenset(ordered[i * per:(i + 1) * per]) for i in range(reps)]
    return [frozenset(v) for v in sets.values()]


def _v(s: Any) -> tuple[int, int]:
    from omni_pd.compile.targets import parse_version

    return parse_version(str(s))


_Y = ("async_chunk: false\nstages:\n"
      "  - {{stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2, gpu_memory_utilization: 0.5}}\n"
      "  - {{stage_id: 1, devices: \"{d}\", gpu_memory_utilization: 0.3}}\n")
_INV3 = {"inventory": {"hosts": {"host-a": {"accelerator": "cuda", "count": 3}}}}


@rule("OPD405", "stage-device-overlap", Severity.WARNING,
      "two stages' device sets intersect without being equal: vllm-omni before #7328 deadlocks at init",
      fail=_Y.format(d="0"), passing=_Y.format(d="2"),
      example_context={"vllm_version": "0.28", **_INV3}, labels=("DEV-INIT-OVERLAP",), runtime="vllm-omni",
      examples=(
          Example("vllm-omni 0.30 (assumed without #7328)", _Y.format(d="0"), True, {"vllm_version": "0.30", **_INV3},
                  contains="#7328"),
          Example("vllm-omni 0.31 (v0.31.0rc1 carries #7328)", _Y.format(d="0"), False, {"vllm_version": "0.31", **_INV3}),
          Example("equal device sets initialize in one group", _Y.format(d="0,1"), False,
                  {"vllm_version": "0.28", **_INV3}),
      ))
def stage_device_overlap(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Two stages on one host whose physical device sets (after the visibility variable,
    only the devices a rank uses) intersect without being equal: a warning on vllm-omni
    releases without #7328 (0.30 and before; 0.30.0 is assumed without it), located at
    the second stage's ``devices`` with the first as related location. Equal or disjoint
    sets pass; the PD pair's own sharing is OPD403's. Facts:
    ``presets/targets/device_init.yaml``. Sources:
    https://github.com/vllm-project/vllm-omni/issues/4894,
    https://github.com/vllm-project/vllm-omni/pull/7328,
    https://github.com/vllm-project/vllm-omni/issues/4653."""
    if ctx.topology is None:
        return
    t = table()["overlap_deadlock"]
    if ctx.target.version >= _v(t["fixed_in"]):
        return
    pair = ctx.pd_pair
    pd_ids = {pair[0].stage_id, pair[1].stage_id} if pair is not None else set()
    nodes = [n for n in ctx.topology.stages if isinstance(n.devices, tuple) and n.devices]
    sets = {n.stage_id: init_sets(ctx, n) for n in nodes}
    assumed = ctx.target.version > (0, 28)  # 0.28: reproduced (vllm-omni#4894); 0.30: not read
    rel = f"vllm-omni {ctx.target.label}" + ctx.assumed_note()
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            if {a.stage_id, b.stage_id} == pd_ids or ctx.host_of(a) != ctx.host_of(b):
                continue
            hit = next(((sa, sb) for sa in sets[a.stage_id] for sb in sets[b.stage_id] if sa & sb and sa != sb), None)
            if hit is None:
                continue
            sa, sb = hit
            shared = sa & sb
            word = _accel_word(ctx, a)
            devs = ", ".join(sorted(shared))
            yield r.diag(
                f"stages {a.stage_id} (devices {','.join(sorted(sa))}) and {b.stage_id} (devices {','.join(sorted(sb))}) "
                f"share {word} {devs} on {ctx.host_of(a)} with different device sets: {rel} "
                + ("(its wheel not read for vllm-omni#7328, assumed without it)" if assumed else "lacks vllm-omni#7328")
                + f", initializes them in parallel and waits on the {word} {devs} init lock until "
                  f"stage_init_timeout ({t['stage_init_timeout_s']} s), then proceeds without it",
                ctx.sloc(b, "devices", value=True),
                related=[ctx.sloc(a, "devices", value=True, label=f"stage {a.stage_id} devices")],
                notes=[f"source: {s}" for s in t["sources"]],
                help=f"give stage {b.stage_id} devices disjoint from stage {a.stage_id}'s (or the same set "
                     f"`devices: \"{','.join(sorted(sa))}\"`), or run vllm-omni {t['fixed_in']}+ (`--vllm-version "
                     f"{t['fixed_in']}`), which initializes overlapping stages one after the other")
