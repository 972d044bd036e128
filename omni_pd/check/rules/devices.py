"""Device rules (OPD4xx): world size, device existence, PD isolation, memory budget.

Run after the platform overlay (``--platform`` / ``--all-platforms``). Logical device
indices map to physical ones through the visibility variable (``CUDA_VISIBLE_DEVICES``
...) of the launcher (``--env``) or of the stage's own ``env``, by the one mapping in
:mod:`omni_pd.compile.devices` (vllm-omni's rule, cited there). Sources: vllm-omni 0.30.0
``set_stage_devices`` and stage_init_utils (world size = TP x PP x local DP), vLLM
``gpu_memory_utilization`` (fraction of one device's memory, default 0.9).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Location, Severity
from omni_pd.check.rules import PARALLEL_SIZE_KEYS, Context, Example, Rule, rule
from omni_pd.compile.placement import overlay_elsewhere
from omni_pd.compile.devices import (DEVICE_VARS, ReplicaSplitError, device_name, format_devices, parse_visible,
                                     passed_through, physical_ids, rank_names, replica_devices, split_replica_devices,
                                     visible_value)

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode

#: vLLM's default gpu_memory_utilization (EngineArgs), a fraction of one device.
DEFAULT_GPU_UTIL = 0.9


def _hit(ctx: Context, node: "StageNode") -> tuple[tuple[str, ...], tuple[int, str, str] | None]:
    """The stage platform's visibility variables (omni_pd/compile/devices.py ``DEVICE_VARS``)
    and where its visible set is read (``visible_value`` of the stage's own ``env``, then
    the launcher's, ``--env``), as ``launch`` reads it (omni_pd/launch/plan.py ``map_devices``)."""
    names = DEVICE_VARS.get(ctx.platform or _host_accel(ctx, node) or "cuda", ())
    return names, visible_value(names, node.env if isinstance(node.env, dict) else {}, ctx.env)


def _var(ctx: Context, node: "StageNode") -> str | None:
    """The visibility variable the stage's devices index (``CUDA_VISIBLE_DEVICES`` ...; on
    ROCm ``HIP_VISIBLE_DEVICES`` when that is the one set), else its platform's deciding one."""
    names, hit = _hit(ctx, node)
    return hit[1] if hit is not None else (names[0] if names else None)


def _visible_set(ctx: Context, node: "StageNode") -> tuple[tuple[str, ...] | None, bool]:
    """Physical ids the stage's devices index, or None if unset (logical == physical), and
    whether they come from the stage's own ``env`` (vllm-omni applies it before mapping the
    stage's devices: ``stage_runtime_setup``) rather than the launcher's (``--env``)."""
    hit = _hit(ctx, node)[1]
    return (None, False) if hit is None else (parse_visible(hit[2]), hit[0] == 0)


def _visible(ctx: Context, node: "StageNode") -> tuple[str, ...] | None:
    """:func:`_visible_set`'s ids."""
    return _visible_set(ctx, node)[0]


def _host_accel(ctx: Context, node: "StageNode") -> str | None:
    if ctx.inventory is None:
        return None
    h = ctx.inventory.host(ctx.host_of(node))
    return h.accelerator if h else None


def _count(ctx: Context, node: "StageNode") -> tuple[int | None, str]:
    vis, own = _visible_set(ctx, node)
    if vis is not None:
        if own:
            return len(vis), f"the stage's env {_var(ctx, node)} lists"
        return len(vis), "the launcher's visibility variable lists"
    if ctx.inventory is not None:
        h = ctx.inventory.host(ctx.host_of(node))
        if h is not None and h.count is not None and not overlay_elsewhere(ctx.platform, h.accelerator):
            return h.count, f"host {h.name} has"
    return None, ""


def per_replica(ctx: Context, n: "StageNode") -> int:
    """Devices one replica of stage ``n`` takes when vllm-omni splits its ``devices`` among
    ``num_replicas``: vllm-omni 0.30.0 engine/stage_init_utils.py
    ``get_stage_devices_per_replica``, the diffusion world size for a diffusion stage, else
    TP x local DP x PP (no prefill-context parallel there). An int >= 1."""
    if ctx.is_diffusion(n):
        return max(1, ctx.world_size(n)[0])
    p = ctx.parallel(n)
    return max(1, p["tensor_parallel_size"]) * max(1, p["pipeline_parallel_size"]) * max(1, p["data_parallel_size"])


def replica_layout(ctx: Context, n: "StageNode") -> tuple[tuple[int, ...], ...] | None:
    """The logical devices of each replica of stage ``n`` (a tuple-devices stage), as the
    runtime places them: vllm-omni's ``split_devices_for_replicas`` (pool or template mode,
    :func:`omni_pd.compile.devices.replica_devices`), which omni-pd's own launcher of the
    ``vllm`` runtime follows too (omni_pd/compile/port_plan.py ``instance_devices``). One
    replica: ``(devices,)``. None when the split is refused (OPD401 reports it)."""
    reps = max(1, int(n.num_replicas or 1))
    if reps == 1:
        return (n.devices,)
    return replica_devices(n.devices, reps, per_replica(ctx, n))  # type: ignore[return-value]


def _slots(ctx: Context, n: "StageNode") -> list[tuple[int | None, int, str | None, str | None]]:
    """Every device entry some replica of stage ``n`` is given, in order, as ``(replica,
    logical, physical, rank)``: ``replica`` its index (None for a stage of one replica, or
    a split the runtime refuses: then the entries as written), ``logical`` the index into
    the visible set, ``physical`` its id (:func:`omni_pd.compile.devices.physical_ids` of
    the replica's own list, as vllm-omni maps each replica's; None: dropped, OPD402),
    ``rank`` the engine rank on it with the replica named (``"replica 1, TP rank 0"``,
    ``""`` for one one-device engine; None: past the world size, used by no rank, OPD401).
    ``devices: "0"`` with ``num_replicas: 2`` (template mode): ``[(0, 0, "0", "replica
    0"), (1, 1, "1", "replica 1")]``."""
    p = ctx.parallel(n)
    tp, pp, dp = (max(1, p[k]) for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"))
    world = max(1, ctx.world_size(n)[0])
    vis = _visible(ctx, n)
    layout = replica_layout(ctx, n)
    if layout is None or len(layout) == 1:
        ranks = rank_names(len(n.devices), tp, pp, dp, world, max(1, int(n.num_replicas or 1)))
        return [(None, i, ph, ranks[k]) for k, (i, ph) in enumerate(zip(n.devices, physical_ids(n.devices, vis)))]
    out: list[tuple[int | None, int, str | None, str | None]] = []
    for r, devs in enumerate(layout):
        ranks = rank_names(len(devs), tp, pp, dp, world)
        out += [(r, i, ph, None if ranks[k] is None else ", ".join(x for x in (f"replica {r}", ranks[k]) if x))
                for k, (i, ph) in enumerate(zip(devs, physical_ids(devs, vis)))]
    return out


def _accel_word(ctx: Context, node: "StageNode") -> str:
    acc = ctx.platform or _host_accel(ctx, node) or "cuda"
    return "NPU" if acc == "npu" else "GPU"


@rule("OPD401", "world-size", Severity.ERROR,
      "a stage's device list does not match TP x PP x DP",
      fail="stages:\n  - {stage_id: 0, devices: \"0\", tensor_parallel_size: 2}\n",
      passing="stages:\n  - {stage_id: 0, devices: \"0,1\", tensor_parallel_size: 2}\n", labels=("DEV-WORLD",),
      examples=(
          Example("nested parallel_config wins over flat sizes",
                  "stages:\n  - {stage_id: 0, devices: \"0,1\", tensor_parallel_size: 1, cfg_parallel_size: 2,"
                  " parallel_config: {tensor_parallel_size: 4, cfg_parallel_size: 1}}\n", True,
                  contains="needs 4 devices (TP 4 x PP 1 x DP 1)"),
          Example("TP 1 x CFG 2 on two devices (flat)",
                  "stages:\n  - {stage_id: 0, devices: \"0,1\", tensor_parallel_size: 1, cfg_parallel_size: 2}\n", False),
          Example("TP 1 x CFG 2 on two devices (nested)",
                  "stages:\n  - {stage_id: 0, devices: \"0,1\", parallel_config: {tensor_parallel_size: 1, cfg_parallel_size: 2}}\n",
                  False),
          Example("ulysses x ring count as sequence parallel",
                  "stages:\n  - {stage_id: 0, devices: \"0,1\", parallel_config: {ulysses_degree: 2, ring_degree: 2}}\n",
                  True, contains="SP 4"),
          Example("allgather replaces ulysses x ring",
                  "stages:\n  - {stage_id: 0, devices: \"0,1\", parallel_config: {allgather_degree: 2}}\n", False),
          Example("CFG with PP on the flat keys",
                  "stages:\n  - {stage_id: 0, devices: \"0,1\", pipeline_parallel_size: 2, cfg_parallel_size: 2}\n", True,
                  contains="CFG 2"),
          Example("HSDP replicate x shard when the other sizes are 1",
                  "stages:\n  - {stage_id: 0, devices: \"0,1,2,3\", parallel_config: {use_hsdp: true, hsdp_replicate_size: 2,"
                  " hsdp_shard_size: 2}}\n", False),
          Example("global --tensor-parallel-size counts",
                  "stages:\n  - {stage_id: 0, devices: \"0\"}\n", True, {"cli": {"tensor_parallel_size": 2}}),
          Example("pool mode: world x num_replicas",
                  "stages:\n  - {stage_id: 0, devices: \"0,1,2,3\", num_replicas: 2, tensor_parallel_size: 2}\n", False),
          Example("template mode: one replica's devices, replica r shifted by r x world",
                  "stages:\n  - {stage_id: 0, devices: \"0,1\", num_replicas: 2, tensor_parallel_size: 2}\n", False),
          Example("template mode: an entry that is no offset into one replica's devices",
                  "pipeline: qwen3_omni_moe\nstages:\n  - {stage_id: 0, devices: \"1\", num_replicas: 2}\n", True,
                  contains="template-mode device offset(s) [1] out of range [0, 1)"),
          Example("num_replicas: neither one replica's count nor the pool's",
                  "stages:\n  - {stage_id: 0, devices: \"0,1,2\", num_replicas: 2}\n", True,
                  contains="takes 1 entry (one replica's template) or 2 (the pool of every replica)"),
          Example("an instance spanning nodes lists one node's devices",
                  "stages:\n  - {stage_id: 0, devices: \"0,1\", tensor_parallel_size: 4, nnodes: 2}\n", False),
          Example("nnodes must divide the world size",
                  "stages:\n  - {stage_id: 0, devices: \"0\", tensor_parallel_size: 3, nnodes: 2}\n", True,
                  contains="nnodes 2 does not divide"),
      ))
def world_size(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``len(devices)`` must equal the stage's local world size (x ``num_replicas`` in
    pool mode; with ``num_replicas`` > 1 a list of one replica's size is vllm-omni's
    per-replica template, whose entries must be offsets below that size:
    :func:`_template_problem`, vllm-omni 0.30 engine/stage_init_utils.py
    ``split_devices_for_replicas``): TP x PP x local DP x prefill-context parallel, and for diffusion stages
    x CFG parallel x sequence parallel (``allgather_degree`` if > 1, else
    ``ulysses_degree`` x ``ring_degree``), or the HSDP replicate x shard product. The
    sizes come from the nested ``parallel_config`` when it sets them (it wins over the
    flat keys, see OPD112), else from the flat keys; a global
    ``--tensor-parallel-size`` counts for every stage. Otherwise workers fail with "DP
    adjusted local rank 1 is out of bounds for 1 devices" or "Stage 0 requires 8
    device(s) based on parallel_config". Sources: vllm-omni 0.30.0
    engine/stage_init_utils.py, config/omni_config.py ``_build_parallel_config``,
    ``OmniStageDiffusionParallelConfig``. An instance spanning ``nnodes`` hosts (vLLM's
    multi-node launch) lists the devices of one host: world / ``nnodes``, and ``nnodes``
    must divide the world (vLLM 0.30 vllm/engine/arg_utils.py ``create_engine_config``:
    "`--nnodes` must evenly divide the total world size");
    https://github.com/vllm-project/vllm-omni/issues/5003,
    https://github.com/vllm-project/vllm-omni/issues/3911,
    https://github.com/vllm-project/vllm-omni/issues/7778."""
    if ctx.topology is None:
        return

    def taken(n: Any) -> frozenset:
        return frozenset(i for m in ctx.topology.stages if m is not n and isinstance(m.devices, tuple)
                         and ctx.host_of(m) == ctx.host_of(n) for i in m.devices)

    for n in ctx.topology.stages:
        if not isinstance(n.devices, tuple):
            continue
        par = ctx.parallel(n)
        tp, pp, dp = par["tensor_parallel_size"], par["pipeline_parallel_size"], par["data_parallel_size"]
        world, how = ctx.world_size(n)
        have = len(n.devices)
        nodes = _nnodes(ctx, n)
        if nodes > 1:
            if world % nodes:
                yield r.diag(f"stage {n.stage_id}: nnodes {nodes} does not divide its world size, {_devices(world)} "
                             f"({how}): vLLM refuses to start it", ctx.sloc(n, "nnodes", value=True),
                             help=f"set nnodes to a divisor of {world}, or change the parallel sizes",
                             reads=ctx.reads(n, "nnodes", "parallel_config", *PARALLEL_SIZE_KEYS))
                continue
            if have == world // nodes:
                continue
            yield r.diag(f"stage {n.stage_id}: {_devices(world)} ({how}) over nnodes {nodes} hosts is "
                         f"{_devices(world // nodes)} on each host, but {'devices has ' + str(have)} "
                         f"entr{'y' if have == 1 else 'ies'}", ctx.sloc(n, "devices", value=True),
                         help=_world_help(world // nodes, n.devices, taken(n)).replace(" here", " here (one host's)"),
                         reads=ctx.reads(n, "devices", "nnodes", "parallel_config", *PARALLEL_SIZE_KEYS))
            continue
        bad_split = _template_problem(ctx, n, taken(n))
        if bad_split is not None:
            yield r.diag(bad_split[0], ctx.sloc(n, "devices", value=True), help=bad_split[1],
                         related=[ctx.sloc(n, "num_replicas", value=True, label="replicas")],
                         reads=ctx.reads(n, "devices", "num_replicas", "parallel_config", *PARALLEL_SIZE_KEYS))
            continue
        if have == world or (n.num_replicas > 1 and have == world * n.num_replicas):
            continue
        if have > world and not ctx.stage_kind_known(n):
            continue  # a stage type omni-pd does not know may use the extra devices
        src = " (from the global --tensor-parallel-size)" if "tensor_parallel_size" in ctx.cli else ""
        nested = isinstance(n.settings.get("parallel_config"), dict) and bool(n.settings.get("parallel_config"))
        entries = f"devices has {have} entr{'y' if have == 1 else 'ies'}"
        if nested or world != tp * pp * dp:
            what = "the effective parallel_config needs" if nested else "the stage's parallel sizes need"
            msg = f"stage {n.stage_id}: {what} {_devices(world)} ({how}){src}, but {entries}"
        else:
            msg = (f"stage {n.stage_id}: tensor_parallel_size {tp} x pipeline_parallel_size {pp} x data_parallel_size {dp} "
                   f"= {_devices(world)}{src}, but {entries}")
        if n.num_replicas > 1:
            per = per_replica(ctx, n)
            msg += (f"; with num_replicas {n.num_replicas}, {_runtime_word(ctx)} takes {per} entr{'y' if per == 1 else 'ies'} "
                    f"(one replica's template) or {per * n.num_replicas} (the pool of every replica)")
        yield r.diag(msg, ctx.sloc(n, "devices", value=True), help=_world_help(world, n.devices, taken(n)) if world != have else None,
                     reads=ctx.reads(n, "devices", "num_replicas", "parallel_config", *PARALLEL_SIZE_KEYS))


def _template_problem(ctx: Context, n: "StageNode", taken: frozenset = frozenset()) -> tuple[str, str] | None:
    """``(message, help)`` when stage ``n``'s ``devices`` have one replica's count (template
    mode of vllm-omni's ``split_devices_for_replicas``) but an entry is not an offset below
    it: ``devices: "1"`` with ``num_replicas: 2`` at TP 1 would put replica 1 on device 2,
    and vllm-omni raises ValueError "template-mode device offset(s) [1] out of range [0, 1)"
    instead (vllm_omni/engine/stage_init_utils.py). None otherwise (a length that is
    neither mode is OPD401's count message). The pool the help suggests avoids ``taken``
    (the devices of the other stages on the host)."""
    reps = max(1, int(n.num_replicas or 1))
    if reps == 1 or not isinstance(n.devices, tuple):
        return None
    per = per_replica(ctx, n)
    try:
        split_replica_devices(format_devices(n.devices), reps, per, n.stage_id)
        return None
    except ReplicaSplitError as e:
        if e.kind == "length":
            return None
        err = str(e)
    devs = format_devices(n.devices)
    who = ("vllm-omni refuses to start" if ctx.launcher != "vllm" else
           "omni-pd's launcher, which splits replicas by vllm-omni's rule, cannot place them")
    msg = (f"stage {n.stage_id}: num_replicas {reps} with devices \"{devs}\" ({_devices(per)} per replica) is a "
           f"per-replica template: replica r takes device r x {per} + each entry, so every entry must be below {per}; "
           f"{who} (vllm-omni 0.30 split_devices_for_replicas: ValueError: {err})")
    offsets = ",".join(map(str, range(per)))
    pool = ",".join(map(str, _suggested_devices(per * reps, n.devices, taken)))
    hlp = (f"write the template as offsets (devices: \"{offsets}\": replica r on "
           f"{'devices' if per > 1 else 'device'} r x {per} + each), or list every replica's devices, "
           f"{_devices(per * reps)} (the pool, e.g. devices: \"{pool}\")")
    return msg, hlp


def _runtime_word(ctx: Context) -> str:
    """Who splits a stage's devices among its replicas: ``vllm-omni``, or ``omni-pd's
    launcher`` on the plain ``vllm`` runtime (it follows vllm-omni's split)."""
    return "omni-pd's launcher" if ctx.launcher == "vllm" else "vllm-omni"


def _nnodes(ctx: Context, n: Any) -> int:
    """The hosts one instance of stage ``n`` spans: the stage's own value
    (:attr:`~omni_pd.compile.topology.StageNode.nnodes`), else a global ``--nnodes``."""
    if n.nnodes > 1 or ctx.cli.get("nnodes") is None:
        return n.nnodes
    try:
        return max(1, int(ctx.cli["nnodes"]))
    except (TypeError, ValueError):
        return 1


def _devices(count: int) -> str:
    """``1 device``, ``2 devices``."""
    return f"{count} device{'' if count == 1 else 's'}"


def _suggested_devices(world: int, keep: tuple = (), taken: frozenset = frozenset()) -> list[int]:
    """``world`` device indices for a stage that lists ``keep``: its own entries first (at
    most ``world``), then the free indices nearest to its first entry (the higher first on a tie), never
    one in ``taken`` (the devices other stages on its host use). Sorted."""
    picked = list(dict.fromkeys(i for i in keep if isinstance(i, int) and i >= 0))[:world]
    centre = picked[0] if picked else 0
    step = 0
    while len(picked) < world:
        for i in ((centre + step, centre - step) if step else (centre,)):
            if len(picked) < world and i >= 0 and i not in picked and i not in taken:
                picked.append(i)
        step += 1
    return sorted(picked)


def _world_help(world: int, keep: tuple = (), taken: frozenset = frozenset()) -> str:
    """What to write for ``world`` devices; the example list only for a plausible count
    (``tensor_parallel_size: 10**20`` must not build a 10**20-entry string). The example
    keeps the stage's own entries ``keep`` and avoids ``taken`` (:func:`_suggested_devices`):
    decode on "2" at TP 2 is told "2,3", not prefill's "0,1"."""
    if 1 <= world <= 64:
        return f"list {_devices(world)} here, e.g. devices: \"{','.join(map(str, _suggested_devices(world, keep, taken)))}\""
    return f"list {world} devices here, or lower the parallel sizes" if world > 64 else \
        "parallel sizes must be at least 1"


@rule("OPD402", "device-exists", Severity.ERROR,
      "a stage uses a device index the host does not have",
      fail="stages:\n  - {stage_id: 0, devices: \"0\"}\n  - {stage_id: 1, devices: \"1\"}\n",
      passing="stages:\n  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.4}\n  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.4}\n",
      example_context={"inventory": {"hosts": {"host-a": {"accelerator": "cuda", "count": 1, "memory_gib": 80}}}},
      labels=("DEV-EXISTS", "DEV-MAP", "DEV-OVERLAY"))
def device_exists(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Every logical device index must be below the number of visible devices: the
    launcher's visibility variable (``CUDA_VISIBLE_DEVICES``, ``ASCEND_RT_VISIBLE_DEVICES``
    ...) when given, else the host's ``count`` in ``--inventory``; every replica's devices
    (:func:`replica_layout`: a template's replica 1 runs on entries the file does not
    write). Checked after the
    platform overlay, which often moves stages (``platforms.npu`` puts Qwen3-Omni on
    three NPUs). Inventory format (``--inventory FILE``)::

        hosts:
          host-a: {accelerator: cuda, count: 8, memory_gib: 80, address: 10.0.0.1}
        placement: {all: host-a, 1: host-b}    # stage id (or `all`) -> host
        router: {relays_kv_transfer_params: true}   # optional
        allow_shared_devices: false                 # optional (OPD403)

    Sources: https://github.com/vllm-project/vllm-omni/issues/363,
    https://github.com/vllm-project/vllm-omni/issues/2898."""
    if ctx.topology is None:
        return
    for n in ctx.topology.stages:
        if not isinstance(n.devices, tuple):
            continue
        count, how = _count(ctx, n)
        if count is None:
            continue
        slots = _slots(ctx, n)
        bad = list(dict.fromkeys(i for _, i, _, _ in slots if i >= count))
        if bad:
            word = _accel_word(ctx, n)
            plat = f"{ctx.platform} overlay places" if ctx.platform and ctx.exists(("platforms", ctx.platform)) else "uses"
            vis = _visible(ctx, n)
            placed = sorted({r for r, i, _, _ in slots if r is not None and i in bad and i not in n.devices})
            if placed:  # template mode: a replica runs on a device the file does not write
                layout = replica_layout(ctx, n) or ()
                runs = "; ".join(f"replica {r} on {format_devices(layout[r])}" for r in range(len(layout)))
                what = (f"num_replicas {n.num_replicas} with devices \"{format_devices(n.devices)}\" is "
                        f"{_runtime_word(ctx)}'s per-replica template: {runs}")
            elif passed_through(n.devices, vis):
                what = (f"vllm-omni 0.30 reads a list with no entry below the {len(vis)} visible devices as physical "
                        f"ids: stage {n.stage_id} would run on physical {word} {', '.join(map(str, n.devices))}, "
                        f"not on entries of {_var(ctx, n)}={','.join(vis)}")
            elif vis is not None:
                what = f"vllm-omni drops the entries outside {_var(ctx, n)}={','.join(vis)} and starts on the rest"
            else:
                what = None
            who = f"stage {n.stage_id}" + (f" (replica {', '.join(map(str, placed))})" if placed else "")
            yield r.diag(f"{who} {plat} device {', '.join(map(str, bad))}, but only {count} {word}{'s' if count != 1 else ''} "
                         f"{'are' if count != 1 else 'is'} visible ({how} {count})",
                         ctx.sloc(n, "devices", value=True), notes=[what] if what else [],
                         help=f"use device indices 0..{count - 1}, or run on a host with more {word}s")


def _pair_shared(ctx: Context) -> tuple[set, "StageNode", "StageNode"] | None:
    pair = ctx.pd_pair
    if pair is None:
        return None
    p, d = pair
    if not (isinstance(p.devices, tuple) and isinstance(d.devices, tuple)) or ctx.host_of(p) != ctx.host_of(d):
        return None
    shared = _used_physicals(ctx, p) & _used_physicals(ctx, d)
    return (shared, p, d) if shared else None


def _used_physicals(ctx: Context, n: "StageNode") -> set[str]:
    """The physical devices some rank of stage ``n`` runs on (:func:`_slots`): each
    replica's entries up to TP x PP x DP (an entry past the world size is used by no
    worker, OPD401), without those vllm-omni drops (outside the visible set, OPD402).
    Every entry of a stage whose engine kind omni-pd does not know."""
    known = ctx.stage_kind_known(n)
    return {ph for _, _, ph, rank in _slots(ctx, n) if ph is not None and (rank is not None or not known)}


@rule("OPD403", "pd-shared-device", Severity.WARNING,
      "prefill and decode share a device: disaggregation gives no isolation",
      fail=("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
            "  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.4, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}}\n"
            "  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.4, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer}}\n"),
      passing=("pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
               "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer}}\n"
               "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer}}\n"),
      labels=("DEV-SHARED",))
def pd_shared_device(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Prefill and decode on the same physical device compete for compute and memory,
    which is what disaggregation exists to avoid (every replica counts, on the devices
    the runtime gives it: :func:`replica_layout`); it also makes the memory budget
    (OPD404) tight. A warning, silenced by ``allow_shared_devices: true`` in the
    inventory (for a single-GPU smoke test). Source:
    https://github.com/vllm-project/vllm/issues/25759."""
    if ctx.inventory is not None and ctx.inventory.allow_shared_devices:
        return
    found = _pair_shared(ctx)
    if found is None:
        return
    shared, p, d = found
    word = _accel_word(ctx, p)
    yield r.diag(f"prefill (stage {p.stage_id}) and decode (stage {d.stage_id}) share {word} {', '.join(sorted(shared))}; "
                 "disaggregation gives no isolation", ctx.sloc(d, "devices", value=True),
                 related=[ctx.sloc(p, "devices", value=True, label="prefill devices")],
                 help="give decode its own devices, or set `allow_shared_devices: true` in the inventory for a smoke test")


@rule("OPD404", "memory-budget", Severity.ERROR,
      "the gpu_memory_utilization of the stages on one device sums above 1.0",
      fail="stages:\n  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.8}\n  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.8}\n",
      passing="stages:\n  - {stage_id: 0, devices: \"0\", gpu_memory_utilization: 0.6}\n  - {stage_id: 1, devices: \"0\", gpu_memory_utilization: 0.3}\n",
      labels=("DEV-MEM-SUM",),
      examples=(
          Example("a replica placed by template mode counts on its own device",
                  "stages:\n  - {stage_id: 0, devices: \"0\", num_replicas: 2, gpu_memory_utilization: 0.9}\n"
                  "  - {stage_id: 1, devices: \"1\", gpu_memory_utilization: 0.6}\n"
                  "  - {stage_id: 2, devices: \"1\", gpu_memory_utilization: 0.3}\n", True,
                  contains="0.9 (stage 0, replica 1) + 0.6 (stage 1) + 0.3 (stage 2) = 1.80 > 1.0"),
          Example("a pool of two replicas, one device each",
                  "stages:\n  - {stage_id: 0, devices: \"0,1\", num_replicas: 2, gpu_memory_utilization: 0.9}\n"
                  "  - {stage_id: 1, devices: \"2\", gpu_memory_utilization: 0.6}\n"
                  "  - {stage_id: 2, devices: \"2\", gpu_memory_utilization: 0.3}\n", False),
      ))
def memory_budget(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Per physical device (per host): the sum of ``gpu_memory_utilization`` (a fraction
    of the device; vLLM default 0.9) of every stage that has a rank there (each TP rank
    counts on its own device; each replica of a stage with ``num_replicas`` on the
    devices the runtime gives it, :func:`replica_layout`: ``devices: "0"`` with two
    replicas puts replica 1 on device 1, vllm-omni's template mode) plus device-side connector buffers (P2pNccl
    ``kv_buffer_size`` bytes, when ``memory_gib`` is known) must not exceed 1.0. The
    ranks take a stage's entries in order, per DP replica and pool replica; an entry past
    the world size is used by no rank (OPD401 reports it) and an entry outside the
    visible set is dropped by vllm-omni (OPD402): neither counts. Logical entries map to
    physical devices by :mod:`omni_pd.compile.devices` (vllm-omni
    ``resolve_stage_physical_devices``, vLLM ``Worker.init_device``); with a visibility
    variable the message names the logical device and the physical one. Each
    engine reserves its fraction of the *total* memory, so two stages at 0.8 on one GPU
    cannot both start. A stage whose ``gpu_memory_utilization`` is written but is not a
    number (OPD101: the schema drops it, and vLLM refuses to start the engine) is not
    counted, neither at its value nor at the 0.9 default: its share is unknown until the
    value is fixed (``null`` is unset: the default). Sources: https://github.com/vllm-project/vllm-omni/issues/363,
    https://github.com/vllm-project/vllm-omni/issues/276,
    https://github.com/vllm-project/vllm/issues/25759."""
    if ctx.topology is None:
        return
    use: dict[tuple[str, str], list[tuple["StageNode", float, str, str | None]]] = {}
    for n in ctx.topology.stages:
        if not isinstance(n.devices, tuple):
            continue
        util = ctx.setting(n, "gpu_memory_utilization")
        at = ctx.stage_path(n, "gpu_memory_utilization")
        if util is None and at[-1:] == ("gpu_memory_utilization",) and ctx.raw_at(at) is not None:
            continue  # written but not a number: OPD101 reports it and vLLM would not start; not its 0.9 default
        if util is None and not ctx.stage_kind_known(n):
            continue  # not a vLLM engine we know: its default budget is not vLLM's 0.9
        try:
            u = float(util) if util is not None else DEFAULT_GPU_UTIL
        except (TypeError, ValueError):
            continue
        why = f"{u:g}" + (" (vLLM default)" if util is None else "")
        extra = _buffer_fraction(ctx, n)
        vis, var, word = _visible(ctx, n), _var(ctx, n), _accel_word(ctx, n)
        for rep, i, phys, rank in _slots(ctx, n):
            if phys is None:
                continue  # vllm-omni drops an entry outside the visible set (OPD402)
            if rank is None and ctx.stage_kind_known(n):
                continue  # past TP x PP x DP (OPD401): vLLM's workers never use this entry
            through = passed_through(_replica_list(ctx, n, rep), vis)
            name = device_name(i, vis, var, word, through) if vis is not None else None
            short = device_name(i, vis, var, word, through, short=True)
            tag = ", ".join(x for x in (f"stage {n.stage_id}", rank) if x)
            buf = f" + {extra:.2f} connector buffer" if extra else ""
            use.setdefault((ctx.host_of(n), phys), []).append((n, u + extra, (why, tag, buf, short), name))
    for (host, dev), items in sorted(use.items()):
        total = sum(u for _, u, _, _ in items)
        if total <= 1.0 + 1e-9 or len(items) < 1:
            continue
        # point at the key in the file being validated when one contributor is set there
        mine = [n for n, _, _, _ in items if ctx.sloc(n, "gpu_memory_utilization").file == ctx.doc.name]
        last = mine[-1] if mine else items[-1][0]
        word = _accel_word(ctx, last)
        hostword = f"{host}: " if host != "localhost" else ""
        names = {name for _, _, _, name in items}
        # no visibility variable: logical == physical, named once; one logical device of one
        # visible set: named once; else (several logical devices, or a pass-through list,
        # that are one physical device) each term names its own
        each = len(names) > 1
        head = names.pop() if len(names) == 1 and None not in names else f"physical {word} {dev}"
        parts = " + ".join(f"{why} ({tag}" + (f", {short}" if each else "") + f"){buf}"
                           for _, _, (why, tag, buf, short), _ in items)
        yield r.diag(f"{hostword}{head}: {parts} = {total:.2f} > 1.0",
                     ctx.sloc(last, "gpu_memory_utilization", value=True),
                     related=[ctx.sloc(n, "gpu_memory_utilization", value=True, label=f"stage {n.stage_id} reserves {u:g}")
                              for n, u, _, _ in items if n is not last],
                     help="lower gpu_memory_utilization so the stages on this device sum to at most 1.0, or move one to another device")


def _replica_list(ctx: Context, n: "StageNode", rep: int | None) -> tuple[int, ...]:
    """The logical devices of replica ``rep`` of ``n`` (None: the stage's list as written)."""
    layout = replica_layout(ctx, n) if rep is not None else None
    return layout[rep] if layout is not None else n.devices  # type: ignore[return-value]


def _buffer_fraction(ctx: Context, n: "StageNode") -> float:
    """vLLM's P2pNcclConnector's device-side ``kv_buffer_size`` (bytes) as a fraction of the
    device (vLLM ``v1/p2p/p2p_nccl_engine.py`` allocates it on the device); another package's
    class loaded under that name (``kv_connector_module_path``) is not counted."""
    from omni_pd.check.rules.capability import connector_row

    kv = n.kv or {}
    if connector_row(ctx, n) != "P2pNcclConnector" or kv.get("kv_buffer_size") is None:
        return 0.0
    if str(kv.get("kv_buffer_device") or "cuda") == "cpu" or ctx.inventory is None:
        return 0.0
    h = ctx.inventory.host(ctx.host_of(n))
    if h is None or not h.memory_gib:
        return 0.0
    try:
        return float(kv["kv_buffer_size"]) / (h.memory_gib * 2**30)
    except (TypeError, ValueError):
        return 0.0


_ = Location
