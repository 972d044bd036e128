"""Property tests: the PD split over generated three-stage deploy configs (issue 2).

The strategies build the YAML *text* of a Qwen3-Omni-shaped deploy config (Thinker
-> Talker -> Code2Wav) with random devices (multi-device, non-contiguous), TP, DP,
connector, CLI device overrides, platform overlays, edges, unknown engine keys with
nested dicts, comments and ports the file already uses, and expand it for a random
vLLM version. The assertions read the output back with ``parse_text`` +
``parse_config`` and ``resolve`` it per platform.

Example counts: ``dev`` profile numbers below; ``HYPOTHESIS_PROFILE=ci|long`` raises
them (see conftest.py).
"""

from __future__ import annotations

import json
import re
from unittest import mock
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from conftest import example_budget
from omni_pd.compile.expand import ExpandResult, expand_document
from omni_pd.diagnostics import OmniPdError
from omni_pd.io import parse_text
from omni_pd.compile.parse import parse_config, to_plain
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.compile.pipelines import IdMap
from omni_pd.compile.targets import target as make_target
from omni_pd.compile.topology import resolve

VERSIONS = ("0.11", "0.13", "0.18", "0.24", "0.30", "0.32", "0.33", "0.34")
#: --vllm-version values whose vllm-omni release (0.30, also the newest before 0.32-0.34) has
#: omni-pd's Talker handoff fix for qwen3_omni_moe_pd (presets/targets/vllm_omni_compat.yaml
#: talker_pipelines): the only targets where a Qwen3-Omni PD split with its Talker is written
TALKER_COVERED = ("0.30", "0.32", "0.33", "0.34")
#: vLLM minors before 0.30 (a generated --vllm-version): no vllm-omni release, or one the layer
#: does not cover, so expand refuses the split with OPD704 (issue 21)
UNCOVERED = st.integers(11, 29).map(lambda m: f"0.{m}")
#: vllm-omni releases (presets/targets/vllm.yaml vllm_omni_releases), written out here as the oracle
OMNI_RELEASES = ("0.14", "0.16", "0.18", "0.20", "0.22", "0.24", "0.26", "0.28", "0.30")
PLATFORMS = ("npu", "xpu", "rocm", "cuda")
LEGACY_KV = ("kv_ip", "kv_rank", "kv_parallel_size", "kv_buffer_size")
CONN_KEYS = ("input_connectors", "output_connectors")
FILE_NAME = "generated.yaml"


# --- the generated case ---------------------------------------------------------------

@dataclass
class Case:
    """One generated input: its YAML text, the plain data it encodes, the comment
    texts it carries, the expand options and the vLLM version."""

    text: str
    data: dict[str, Any]
    comments: list[str]
    opts: ExpandOptions
    version: str
    extra_ports: list[int] = field(default_factory=list)

    def __repr__(self) -> str:  # hypothesis prints this for a falsifying example
        return f"Case(version={self.version!r}, opts={self.opts!r}, text=\n{self.text})"


class _Writer:
    """Emit a plain dict as block YAML, sprinkling comments (each text unique)."""

    def __init__(self, draw):
        self.draw = draw
        self.lines: list[str] = []
        self.comments: list[str] = []

    def comment(self) -> str | None:
        """Maybe a fresh comment text (never empty, never a YAML-significant char)."""
        if not self.draw(st.integers(0, 4)) == 0:
            return None
        text = f"note-{len(self.comments)}-" + self.draw(st.sampled_from(["keep", "why", "tuned", "ops"]))
        self.comments.append(text)
        return text

    def scalar(self, v: Any) -> str:
        """YAML for a scalar (JSON spelling is valid YAML)."""
        return json.dumps(v)

    def mapping(self, d: dict[str, Any], indent: int, first_prefix: str | None = None) -> None:
        """Write ``d`` at ``indent``; ``first_prefix`` replaces the first key's indent
        (``"  - "`` for a list item)."""
        for i, (k, v) in enumerate(d.items()):
            pad = first_prefix if (i == 0 and first_prefix is not None) else " " * indent
            c = self.comment()
            eol = f"  # {c}" if c else ""
            if isinstance(v, dict) and v:
                self.lines.append(f"{pad}{k}:{eol}")
                self.mapping(v, indent + 2)
            elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                self.lines.append(f"{pad}{k}:{eol}")
                for item in v:
                    self.mapping(item, indent + 4, first_prefix=" " * (indent + 2) + "- ")
            else:
                self.lines.append(f"{pad}{k}: {self.scalar(v)}{eol}")

    def full_line(self, indent: int = 0) -> None:
        """Maybe a whole-line comment."""
        c = self.comment()
        if c:
            self.lines.append(" " * indent + f"# {c}")


_key = st.sampled_from(["x_alpha", "x_beta", "x_gamma", "custom_knob", "hf_overrides", "speculative_tweak"])
_leaf = st.one_of(st.integers(-5, 100), st.booleans(), st.sampled_from(["a", "b c", "on", "0.5", "null-ish"]),
                  st.floats(0.05, 0.95).map(lambda f: round(f, 2)))
_nested = st.recursive(_leaf, lambda ch: st.dictionaries(st.sampled_from(["k1", "k2", "deep", "opt"]), ch,
                                                          min_size=1, max_size=3), max_leaves=6)
_extras = st.dictionaries(_key, _nested, max_size=3)


#: Typed values a platform overlay may set on any stage.
_OVERLAY_KEYS = {
    "enforce_eager": st.booleans(),
    "gpu_memory_utilization": st.sampled_from([0.3, 0.6]),
    "max_cudagraph_capture_size": st.sampled_from([0, 16]),
    "compilation_config": st.just({"cudagraph_mode": "PIECEWISE"}),
    "hf_overrides": st.just({"quantization_config": "bf16"}),
}


def _devices(draw, n: int, pool: int = 10) -> tuple[int, ...]:
    """``n`` distinct device indices below ``pool`` (unsorted / non-contiguous allowed)."""
    return tuple(draw(st.lists(st.integers(0, pool - 1), min_size=n, max_size=n, unique=True)))


def _fmt(d: tuple[int, ...]) -> str:
    return ",".join(map(str, d))


@st.composite
def cases(draw, versions=st.sampled_from(TALKER_COVERED), pipeline: str = "qwen3_omni_moe") -> Case:
    """A three-stage ``pipeline`` (Thinker -> Talker -> Code2Wav) deploy config and how to
    expand it, for a version drawn from ``versions`` (default: where the split is valid)."""
    version = draw(versions)
    opt_conn = draw(st.sampled_from([None, "MooncakeConnector", "NixlConnector"]))
    if make_target(version).version < (0, 13) and opt_conn != "NixlConnector":
        opt_conn = "NixlConnector"  # MooncakeConnector exists from vLLM 0.13
    tp = draw(st.sampled_from([1, 2, 4]))
    dp = draw(st.sampled_from([1, 1, 2]))
    opt_tp = draw(st.sampled_from([None, None, 1, 2, 4]))
    world = (opt_tp or tp) * dp

    thinker: dict[str, Any] = {"stage_id": 0, "max_num_seqs": draw(st.integers(1, 64))}
    if draw(st.booleans()):
        thinker["devices"] = _fmt(_devices(draw, tp * dp))
    if tp > 1 or draw(st.booleans()):
        thinker["tensor_parallel_size"] = tp
    if dp > 1:
        thinker["data_parallel_size"] = dp
    thinker.update(draw(_extras))
    # replicas: only where the runtime gives each one its own port (Mooncake prefill on vllm-omni
    # >= 0.30, decode binds none); elsewhere expand refuses them (test_expand.py, OPD805)
    if opt_conn != "NixlConnector" and version >= "0.30" and draw(st.integers(0, 2)) == 0:
        thinker["num_replicas"] = draw(st.sampled_from([2, 3, 4]))
    if draw(st.booleans()):
        thinker["output_connectors"] = {"to_stage_1": "shm"}
    thinker["default_sampling_params"] = {"temperature": 0.0, "max_tokens": 2048}

    extra_ports: list[int] = []
    talker: dict[str, Any] = {"stage_id": 1, "gpu_memory_utilization": 0.6}
    if draw(st.booleans()):
        talker["devices"] = _fmt(_devices(draw, draw(st.integers(1, 2))))
    if draw(st.booleans()):
        port = draw(st.sampled_from([25201, 25202, 5600, 5601, 5557, 8998]))
        talker["env"] = {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(port)}
        extra_ports.append(port)
    talker.update(draw(_extras))
    talker["input_connectors"] = {"from_stage_0": "shm"}
    if draw(st.booleans()):
        talker["output_connectors"] = {"to_stage_2": "shm"}
    talker["default_sampling_params"] = {"seed": 42, "temperature": 0.9}

    c2w: dict[str, Any] = {"stage_id": 2, "enforce_eager": draw(st.booleans())}
    if draw(st.booleans()):
        c2w["devices"] = draw(st.sampled_from([talker.get("devices", "1"), _fmt(_devices(draw, 1))]))
    c2w.update(draw(_extras))
    c2w["input_connectors"] = {"from_stage_1": "shm"}

    data: dict[str, Any] = {"pipeline": pipeline, "async_chunk": draw(st.booleans())}
    shm_extra: dict[str, Any] = {"codec_chunk_frames": 25}
    if draw(st.booleans()):
        zp = draw(st.sampled_from([25201, 25202, 25203, 5600, 5601]))
        shm_extra["zmq_port"] = zp
        extra_ports.append(zp)
    data["connectors"] = {"shm": {"name": "SharedMemoryConnector", "extra": shm_extra}}
    data["stages"] = [thinker, talker, c2w]
    if draw(st.booleans()):
        data["edges"] = [{"from": 0, "to": 1}, {"from": 1, "to": 2}]
        if draw(st.booleans()):
            for e in data["edges"]:
                e["window_size"] = 4

    plats: dict[str, Any] = {}
    for p in draw(st.lists(st.sampled_from(PLATFORMS), unique=True, max_size=3)):
        entries = []
        for sid in sorted(draw(st.sets(st.integers(0, 2), min_size=1, max_size=3))):
            e: dict[str, Any] = {"stage_id": sid}
            if sid == 0 and draw(st.booleans()):
                otp = draw(st.sampled_from([1, 2, 4]))
                e["tensor_parallel_size"] = otp
                e["devices"] = _fmt(_devices(draw, otp * dp, pool=12))
            elif sid != 0 and draw(st.booleans()):
                e["devices"] = _fmt(_devices(draw, 1, pool=12))
            e.update(draw(st.fixed_dictionaries({}, optional=_OVERLAY_KEYS)))
            entries.append(e)
        plats[p] = {"stages": entries}
    if plats:
        data["platforms"] = plats

    # CLI device overrides (valid ones: disjoint, each the side's devices as written: `world`
    # per engine x the Thinker's num_replicas, the pool; a one-engine list with replicas would
    # be vllm-omni 0.30's per-replica template and is refused, tests/test_replica_layout_rules.py)
    side = world * int(thinker.get("num_replicas", 1))
    pool = list(range(2 * side + 4))
    pre = dec = down = None
    if draw(st.integers(0, 3)) == 0:
        chosen = draw(st.permutations(pool))
        pre = tuple(sorted(chosen[:side]))
        if draw(st.booleans()):
            dec = tuple(sorted(chosen[side:2 * side]))
        if draw(st.booleans()):
            down = (chosen[2 * side],)
    opts = ExpandOptions(connector=opt_conn, tp=opt_tp, prefill_devices=pre, decode_devices=dec,
                         downstream_devices=down)

    w = _Writer(draw)
    w.full_line()
    for k in ("pipeline", "async_chunk"):
        c = w.comment()
        w.lines.append(f"{k}: {w.scalar(data[k])}" + (f"  # {c}" if c else ""))
    w.lines.append("connectors:")
    w.mapping(data["connectors"], 2)
    w.full_line()
    w.lines.append("stages:")
    for s in data["stages"]:
        w.full_line(2)
        w.mapping(s, 4, first_prefix="  - ")
    if "edges" in data:
        w.lines.append("edges:")
        for e in data["edges"]:
            w.lines.append("  - {" + ", ".join(f"{k}: {v}" for k, v in e.items()) + "}")
    if plats:
        w.lines.append("platforms:")
        for p, ov in plats.items():
            w.lines.append(f"  {p}:")
            w.lines.append("    stages:")
            for e in ov["stages"]:
                w.mapping(e, 8, first_prefix="      - ")
    return Case(text="\n".join(w.lines) + "\n", data=data, comments=w.comments, opts=opts, version=version,
                extra_ports=extra_ports)


def expand(case: Case, text: str | None = None) -> ExpandResult:
    """Expand ``case`` (or ``text`` with its options) the way the CLI does."""
    return expand_document(parse_text(text if text is not None else case.text, FILE_NAME), case.opts,
                           vllm_version=case.version, schema_ref="omni-pd-deploy.schema.json")


def reparse(res: ExpandResult):
    """The output text read back into a DeployConfig."""
    return parse_config(parse_text(res.text, "out.yaml"))


def platforms_of(case: Case) -> list[str | None]:
    """None (the base/CUDA layout) plus every platform overlay of the input."""
    return [None, *(case.data.get("platforms") or {})]


def bound_ports(node, version: tuple[int, int], connector: str) -> list[int]:
    """Every port the engines of one PD stage bind, one entry per (replica, port), recomputed
    here from the upstream code read, NOT through omni-pd's connector contracts, target facts or
    allocator (an independent oracle for them). Duplicates mean replicas binding the same port.

    * vllm-omni starts ``num_replicas`` engines per stage (vllm_omni/engine/stage_runtime.py
      ``_build_logical_stage_init_plans``), each with the stage's env.
    * NIXL: ``VLLM_NIXL_SIDE_CHANNEL_PORT`` (5557 on vLLM 0.11, 5600 after) + i, i < dp x tp on
      0.11, i < dp from 0.13 (v1/nixl_connector.py); vllm-omni never rewrites it.
    * Mooncake: a kv_consumer binds nothing (MooncakeConnectorWorker starts the bootstrap server
      only when not a consumer). vllm-omni >= 0.30: replica r binds
      ``int(kv_connector_extra_config.get("bootstrap_port", 8998)) + r``
      (``_prepare_replica_vllm_config``). Older: ``VLLM_MOONCAKE_BOOTSTRAP_PORT`` (8998), plus
      ``dp_rank * tp + tp_rank`` on vLLM 0.13.
    """
    kv, env, reps = node.kv or {}, node.env or {}, max(node.num_replicas, 1)
    out: list[int] = []
    if connector in ("MooncakeConnectorV1", "MooncakeLayerwiseConnector"):
        # vllm-ascend: side channel kv_port + dp_rank*tp*pp (pull) / dp_rank*tp (layerwise), handshake
        # + device index / tp rank (kv_p2p/mooncake*_connector.py); every replica reads the same kv_port.
        # HCCL listens from HCCL_IF_BASE_PORT (CANN) when the engine has more than one rank.
        span = node.dp * node.tp * (node.pp if connector == "MooncakeConnectorV1" else 1)
        for _ in range(reps):
            out += [int(kv["kv_port"]) + i for i in range(span)]
            if node.dp * node.tp * node.pp > 1:
                out.append(int(env["HCCL_IF_BASE_PORT"]))
        return out
    if connector == "NixlConnector":
        base = int(env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", 5557 if version < (0, 13) else 5600))
        per = node.dp * node.tp if version < (0, 13) else node.dp
        for _ in range(reps):
            out += [base + i for i in range(per)]
        return out
    if kv.get("kv_role") == "kv_consumer":
        return []
    if version >= (0, 30):
        base = int((kv.get("kv_connector_extra_config") or {}).get("bootstrap_port", 8998))
        return [base + r for r in range(reps)]
    base = int(env.get("VLLM_MOONCAKE_BOOTSTRAP_PORT", 8998))
    per = node.dp * node.tp if version < (0, 18) else 1
    for _ in range(reps):
        out += [base + i for i in range(per)]
    return out


# --- properties -------------------------------------------------------------------------

PROPS = settings(max_examples=example_budget(80), deadline=None)


@PROPS
@given(cases())
def test_ids_chain_and_edges(case: Case) -> None:
    res = expand(case)
    cfg = reparse(res)
    n = len(res.plan.target_pipeline.stages)
    assert n == 4
    assert [s.stage_id for s in cfg.stages] == [0, 1, 2, 3]
    for s in res.plan.target_pipeline.stages:
        assert s.input_sources == ((s.stage_id - 1,) if s.stage_id else ())
    # streaming kept (vllm-omni 0.30, the input's async_chunk on or unset): no 0 -> 1 stage edge
    streams = case.data.get("async_chunk") is not False
    assert [(e.from_, e.to) for e in cfg.edges or []] == ([(1, 2), (2, 3)] if streams else [(0, 1), (1, 2), (2, 3)])
    assert cfg.pipeline == "qwen3_omni_moe_pd" and cfg.async_chunk is streams
    # every connector key points along the chain
    for s in cfg.stages:
        assert set((s.input_connectors or {})) <= {f"from_stage_{s.stage_id - 1}"}
        assert set((s.output_connectors or {})) <= {f"to_stage_{s.stage_id + 1}"}
    for pov in (cfg.platforms or {}).values():
        ids = [o.stage_id for o in (pov.stages if pov else None) or []]
        assert ids == sorted(set(ids)) and set(ids) <= {0, 1, 2, 3}


@PROPS
@given(cases())
def test_prefill_decode_devices_and_tp_per_platform(case: Case) -> None:
    res = expand(case)
    cfg = reparse(res)
    for plat in platforms_of(case):
        topo = resolve(cfg, res.plan.target_pipeline, plat)
        p, d = topo.stages[0], topo.stages[1]
        assert isinstance(p.devices, tuple) and isinstance(d.devices, tuple), plat
        assert len(p.devices) == len(d.devices) > 0, plat
        assert not set(p.devices) & set(d.devices), (plat, p.devices, d.devices)
        assert p.tp == d.tp, plat
        if plat is None and case.opts.tp:
            assert p.tp == case.opts.tp
        if plat is None and case.opts.prefill_devices:
            assert p.devices == case.opts.prefill_devices
        if plat is None and case.opts.decode_devices:
            assert d.devices == case.opts.decode_devices
        if plat is None and case.opts.downstream_devices:
            assert topo.stages[2].devices in (None, case.opts.downstream_devices)


@PROPS
@given(cases())
def test_kv_transfer_config_roles_and_version_fields(case: Case) -> None:
    res = expand(case)
    cfg = reparse(res)
    legacy_free = make_target(case.version).version >= (0, 32)
    for plat in platforms_of(case):
        topo = resolve(cfg, res.plan.target_pipeline, plat)
        p, d = topo.stages[0], topo.stages[1]
        assert p.kv["kv_role"] == "kv_producer" and d.kv["kv_role"] == "kv_consumer"
        # on npu the pair runs vllm-ascend's connector (expand's npu pass)
        want = case.opts.npu_connector if plat == "npu" else res.plan.connector
        assert p.kv["kv_connector"] == d.kv["kv_connector"] == want
        assert p.kv["engine_id"] and d.kv["engine_id"] and p.kv["engine_id"] != d.kv["engine_id"]
        if case.opts.connector:
            assert res.plan.connector == case.opts.connector
        for node in (p, d):
            if legacy_free:
                assert not set(LEGACY_KV) & set(node.kv), node.kv
        for s in topo.stages[2:]:
            assert s.kv is None  # downstream stages get no KV connector


@PROPS
@given(cases(versions=st.sampled_from(VERSIONS)))
def test_connector_ports_unique_per_host(case: Case) -> None:
    """What the runtime will bind (recomputed by :func:`bound_ports`) never overlaps between
    prefill and decode or with any port the input already uses; a Mooncake prefill on vllm-omni
    >= 0.30 gets one distinct port per replica and the env says replica 0's port. Every version:
    on releases before 0.30 the Thinker's port facts are pinned with the Talker check stubbed
    (expand refuses those splits, :func:`test_uncovered_talker_handoff_is_refused_with_opd704`)."""
    if case.version in TALKER_COVERED:
        res = expand(case)
    else:
        with mock.patch("omni_pd.compile.talker_pd.gap", return_value=None):
            res = expand(case)
    cfg = reparse(res)
    version = make_target(case.version).version
    for plat in platforms_of(case):
        topo = resolve(cfg, res.plan.target_pipeline, plat)
        p, d = topo.stages[0], topo.stages[1]
        conn = p.kv["kv_connector"]  # vllm-ascend's on npu (expand's npu pass)
        pp, dp_ = bound_ports(p, version, conn), bound_ports(d, version, conn)
        assert pp, plat
        assert not set(pp) & set(dp_), (plat, pp, dp_)
        assert not (set(pp) | set(dp_)) & set(case.extra_ports), (plat, pp, dp_, case.extra_ports)
        if conn == "MooncakeConnector":
            extra = p.kv.get("kv_connector_extra_config") or {}
            assert "mooncake_bootstrap_port" not in extra and not d.kv.get("kv_connector_extra_config")
            assert "VLLM_MOONCAKE_BOOTSTRAP_PORT" not in (d.env or {})  # decode binds none
            assert p.env["VLLM_MOONCAKE_BOOTSTRAP_PORT"] == str(pp[0])   # the env says what replica 0 binds
            if version >= (0, 30):
                assert len(set(pp)) == len(pp) == p.num_replicas        # a range, no replica collides
            else:
                assert "bootstrap_port" not in extra                    # the env decides there


@PROPS
@given(cases())
def test_non_thinker_fields_and_comments_preserved(case: Case) -> None:
    res = expand(case)
    out = to_plain(parse_text(res.text, "out.yaml").tree)
    ids = IdMap(0)
    by_id = {s["stage_id"]: s for s in out["stages"]}
    drop = {"stage_id", "devices", *CONN_KEYS}
    for src in case.data["stages"][1:]:
        new = by_id[ids.shift(src["stage_id"])]
        assert {k: v for k, v in new.items() if k not in drop} == {k: v for k, v in src.items() if k not in drop}
        for kind, fn in (("input_connectors", ids.as_source), ("output_connectors", ids.as_dest)):
            want = {f"{k.rsplit('_', 1)[0]}_{fn(int(k.rsplit('_', 1)[1]))}": v
                    for k, v in (src.get(kind) or {}).items()}
            assert (new.get(kind) or {}) == want
    # the Thinker's own fields reach both halves
    thinker = case.data["stages"][0]
    for new in (by_id[0], by_id[1]):
        for k, v in thinker.items():
            if k not in drop | {"tensor_parallel_size"}:
                assert new[k] == v, k
    # overlay entries of non-Thinker stages keep their keys
    for pname, pov in (case.data.get("platforms") or {}).items():
        out_entries = {e["stage_id"]: e for e in out["platforms"][pname]["stages"]}
        for e in pov["stages"]:
            if e["stage_id"] == 0:
                # npu: expand's npu pass adds the vllm-ascend kv_transfer_config and HCCL_IF_BASE_PORT
                skip = ("stage_id", "devices") + (("kv_transfer_config", "env") if pname == "npu" else ())
                want = {k: v for k, v in e.items() if k not in skip}
                if pname == "npu" and int(thinker.get("num_replicas") or 1) > 1 and "num_replicas" not in e:
                    # vllm-omni 0.30 gives every replica the same kv_port (only the Mooncake bootstrap
                    # port gets + replica id), so on one npu host a side runs one replica (OPD904)
                    want["num_replicas"] = 1
                for half in (0, 1):
                    got = {k: v for k, v in out_entries[half].items() if k not in skip}
                    assert got == want
                    if pname == "npu":
                        env = dict(out_entries[half]["env"])
                        env.pop("HCCL_IF_BASE_PORT")
                        assert env == (e.get("env") or {})
                continue
            got = out_entries[ids.shift(e["stage_id"])]
            assert {k: v for k, v in got.items() if k not in ("stage_id", "devices")} == \
                {k: v for k, v in e.items() if k not in ("stage_id", "devices")}
    for c in case.comments:  # the text survives (a Thinker label may precede it)
        assert re.search(rf"#.*(?<![\w-]){re.escape(c)}(?![\w-])", res.text), c
    for c in case.data.get("connectors", {}):
        assert out["connectors"][c] == case.data["connectors"][c]


@PROPS
@given(cases())
def test_deterministic_reparses_and_refuses_second_split(case: Case) -> None:
    res = expand(case)
    assert expand(case).text == res.text
    assert reparse(res) == res.config
    with pytest.raises(OmniPdError) as e:
        expand(case, res.text)
    assert e.value.diagnostic.code == "OPD803"


def _omni_release(version: str) -> str:
    """``runtime_release('vllm-omni', ...)``'s wording, from :data:`OMNI_RELEASES`."""
    v = make_target(version).version
    older = [r for r in OMNI_RELEASES if make_target(r).version <= v]
    if not older:
        return f"vllm-omni (no release for vLLM {version}; the first is {OMNI_RELEASES[0]})"
    return f"vllm-omni {older[-1]}" + ("" if older[-1] == version else
                                       f" (the newest release before vLLM {version})")


@PROPS
@given(st.one_of(cases(versions=UNCOVERED),
                 cases(versions=st.one_of(UNCOVERED, st.sampled_from(TALKER_COVERED)), pipeline="qwen2_5_omni")))
def test_uncovered_talker_handoff_is_refused_with_opd704(case: Case) -> None:
    """Every Talker pipeline the compatibility layer cannot hand prefill's rows is refused
    (issue 21: the PD output's audio would be wrong): Qwen3-Omni on a target before 0.30
    (no vllm-omni release, or one without the Talker patches), Qwen2.5-Omni on any target
    (its decode engine withholds the Talker's payload). Error OPD704, exit 2, at the
    file's ``pipeline:`` value, nothing returned."""
    with pytest.raises(OmniPdError) as e:
        expand(case)
    d = e.value.diagnostic
    # the release is judged before the pipeline: Qwen2.5-Omni before 0.30 reads as Qwen3-Omni there
    if make_target(case.version).version < (0, 30):
        why = f"omni-pd's compatibility layer does not cover the Talker handoff on {_omni_release(case.version)}"
        help_ = "target a release it covers (`--vllm-version 0.30`), or serve the three-stage pipeline without PD"
    else:
        why = ("omni-pd's compatibility layer fixes the Talker handoff for qwen3_omni_moe_pd only "
               "(qwen2_5_omni_pd: the decode engine withholds or shifts the Talker's payload)")
        help_ = "serve the three-stage pipeline without PD"
    line = case.text.splitlines().index(next(x for x in case.text.splitlines() if x.startswith("pipeline:"))) + 1
    assert (e.value.exit_code, d.code, d.severity.value, d.message, d.help) == (
        2, "OPD704", "error",
        f"the Talker (stage 2) is conditioned by the PD decode stage 1, which computes no prompt rows, and {why}: "
        "audio answers fail or are conditioned on the wrong rows",
        f"{help_}; for text only: `omni-pd expand <three-stage file> --pipeline {case.data['pipeline']}_thinker_only` "
        "(the Thinker alone as a PD pair)")
    assert (d.location.file, d.location.line, d.location.column) == (FILE_NAME, line, len("pipeline: ") + 1)


#: a stage that can send KV and one that can receive it (vLLM config/kv_transfer.py role sets)
KV_PAIRS = [(p, c) for p in ("kv_producer", "kv_both") for c in ("kv_consumer", "kv_both")]


@PROPS
@given(cases(), st.sampled_from(KV_PAIRS), st.sampled_from([(0, 1), (0, 2), (1, 2), (2, 0)]))
def test_a_config_that_already_has_a_kv_pair_is_refused(case: Case, roles, where) -> None:
    """Re-expansion is refused for every input that already has a KV producer/consumer
    pair, not only for expand's own output (``pipeline: *_pd``): the generated non-PD
    config gets the pair on two of its stages (issue 16: a kv_both Thinker with a
    kv_consumer Talker was split again into two kv_consumer stages)."""
    data = json.loads(json.dumps(case.data))
    conn = case.opts.connector or "NixlConnector"
    for sid, role in zip(where, roles):
        data["stages"][sid]["kv_transfer_config"] = {"kv_connector": conn, "kv_role": role}
    assert not data["pipeline"].endswith("_pd")
    with pytest.raises(OmniPdError) as e:
        expand(case, json.dumps(data, indent=1))  # JSON is YAML
    assert e.value.diagnostic.code == "OPD803"


@PROPS
@given(cases(), st.data())
def test_overlapping_or_uneven_device_overrides_are_refused(case: Case, data) -> None:
    """--prefill-devices/--decode-devices that overlap or differ in count never reach the output."""
    res = expand(case)
    p = res.plan.base_devices[0]
    assume(isinstance(p, tuple))
    bad = data.draw(st.sampled_from(["overlap", "uneven"]))
    if bad == "overlap":
        dec = (p[0],) + tuple(range(100, 100 + len(p) - 1))
    else:
        dec = tuple(range(100, 100 + len(p) + 1))
    opts = ExpandOptions(connector=case.opts.connector, tp=case.opts.tp, prefill_devices=p, decode_devices=dec)
    with pytest.raises(OmniPdError) as e:
        expand_document(parse_text(case.text, FILE_NAME), opts, vllm_version=case.version)
    assert e.value.diagnostic.code == "OPD805"
    if bad == "overlap":
        assert "overlap" in str(e.value)
    else:
        # expand's option check (f0bbc25) names the option and the count decode's TP x PP x DP needs;
        # a list of num_replicas x that passes it (pool mode), and the split's pairing check refuses it
        msg = str(e.value)
        assert (msg.startswith(f"--decode-devices lists {len(dec)} device(s); decode needs ")
                or msg.endswith(f'but decode has {len(dec)} ("{_fmt(dec)}"); both halves need the same count')), msg


# --- xPyD with per-side TP (issue 15) ----------------------------------------------------
#
# A single-LLM deploy config (launched as plain `vllm serve` engines, one per instance)
# expanded with --prefill-replicas/--decode-replicas, --prefill-tp/--decode-tp and
# --prefill-dp/--decode-dp (issue 26). The
# oracles below are written from the upstream facts (vllm_kv_connectors.md §3.1, §3.2 and
# the vLLM sources it cites), never through omni-pd's connector contracts, tp_pairs table,
# target facts or allocator.


def tp_pair_allowed(connector: str, version: tuple[int, int], p: int, d: int) -> bool:
    """Whether vLLM ``version`` pairs prefill TP ``p`` with decode TP ``d`` over ``connector``:
    NIXL 0.11-0.13 decode TP a multiple of prefill TP (\"Decode TP cannot be smaller than
    prefill TP\"), from 0.18 either direction when the larger is divisible by the smaller;
    Mooncake equal TP before 0.22 (0.13 pairs ranks' ports, 0.18 raises NotImplementedError),
    then divisible either way."""
    if p == d:
        return True
    big, small = max(p, d), min(p, d)
    if connector == "NixlConnector":
        return d % p == 0 if version < (0, 18) else big % small == 0
    return version >= (0, 22) and big % small == 0


def engine_ports(connector: str, version: tuple[int, int], side: str, tp: int, dp: int) -> int:
    """Consecutive connector ports one engine binds from its base: NIXL one ZMQ listener per
    TP worker on 0.11 (``base + dp_rank*tp + tp_rank``), one per engine (per DP rank) from
    0.13; a Mooncake prefill one bootstrap port per TP x DP rank on 0.13, one per engine from
    0.18; a Mooncake decode (kv_consumer) none."""
    if connector == "NixlConnector":
        return tp * dp if version < (0, 13) else dp
    if side == "decode":
        return 0
    return tp * dp if version < (0, 18) else 1


@dataclass
class PerSideCase:
    text: str
    version: str
    opts: ExpandOptions
    thinker_tp: int
    dp: int

    def __repr__(self) -> str:
        return f"PerSideCase(version={self.version!r}, opts={self.opts!r}, text=\n{self.text})"


@st.composite
def per_side_cases(draw) -> PerSideCase:
    version = draw(st.sampled_from(VERSIONS))
    conn = "NixlConnector" if version == "0.11" else draw(st.sampled_from(["NixlConnector", "MooncakeConnector"]))
    thinker_tp, dp = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 1, 2]))
    lines = ["pipeline: llm", "stages:", "  - stage_id: 0", "    max_model_len: 1024",
             f"    tensor_parallel_size: {thinker_tp}"]
    if dp > 1:
        lines.append(f"    data_parallel_size: {dp}")
    if draw(st.booleans()):
        lines.append(f'    devices: "{_fmt(_devices(draw, thinker_tp * dp))}"')
    tps = st.sampled_from([None, 1, 2, 3, 4])
    kvbd = "cpu" if conn == "NixlConnector" and version != "0.11" and draw(st.booleans()) else None
    dps = st.sampled_from([None, None, 1, 2, 3])
    opts = ExpandOptions(connector=conn, prefill_tp=draw(tps), decode_tp=draw(tps), kv_buffer_device=kvbd,
                         prefill_dp=draw(dps), decode_dp=draw(dps),
                         prefill_replicas=draw(st.integers(1, 3)), decode_replicas=draw(st.integers(1, 3)),
                         port_base=draw(st.sampled_from([None, 20000, 30011])))
    return PerSideCase("\n".join(lines) + "\n", version, opts, thinker_tp, dp)


@settings(max_examples=example_budget(60), deadline=None)
@given(per_side_cases())
def test_per_side_tp_xpyd_devices_ports_and_refusals(case: PerSideCase) -> None:
    from omni_pd.check.validate import ValidateOptions, validate_document
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.launch.plan import LaunchOptions, plan_document

    o = case.opts
    version = make_target(case.version).version
    p_tp, d_tp = o.prefill_tp or case.thinker_tp, o.decode_tp or case.thinker_tp
    src = parse_text(case.text, FILE_NAME)
    if not tp_pair_allowed(o.connector, version, p_tp, d_tp):
        with pytest.raises(OmniPdError) as e:
            expand_document(src, o, vllm_version=case.version)
        assert e.value.diagnostic.code == "OPD603", e.value.diagnostic
        event("refused (OPD603)")
        return
    event("unequal TP" if p_tp != d_tp else "equal TP")
    res = expand_document(src, o, vllm_version=case.version)
    out = parse_text(res.text, "pd.yaml")
    assert [(x.code, x.message) for x in validate_document(out, ValidateOptions(vllm_version=case.version)).errors] == []
    topo = resolve(parse_config(out), load_catalogue().get("llm_pd"), None)
    p, d = topo.stages[0], topo.stages[1]
    n, m = o.prefill_replicas, o.decode_replicas
    p_dp, d_dp = o.prefill_dp or case.dp, o.decode_dp or case.dp  # a side's option, else the Thinker's
    # devices: every instance TP x DP of its own side, the two pools disjoint
    assert (p.tp, d.tp, p.dp, d.dp, p.num_replicas, d.num_replicas) == (p_tp, d_tp, p_dp, d_dp, n, m)
    assert len(p.devices) == n * p_tp * p_dp and len(d.devices) == m * d_tp * d_dp
    assert not set(p.devices) & set(d.devices) and len(set(p.devices)) == len(p.devices)
    # connector ports: instance r of a side binds [base + r*per, base + (r+1)*per) on one host,
    # base from the env the engine reads (plain vllm serve: no runtime rewrites it)
    env_key = "VLLM_NIXL_SIDE_CHANNEL_PORT" if o.connector == "NixlConnector" else "VLLM_MOONCAKE_BOOTSTRAP_PORT"
    # first fit from the base (--port-base, else NIXL's default side-channel port: 5557 on vLLM
    # 0.11, 5600 from 0.13; omni-pd's Mooncake base 25201): the input binds no port, so
    # prefill's range starts there and decode's right after prefill's last instance
    want: dict[tuple[str, int], list[int]] = {}
    nixl_default = 5557 if version < (0, 13) else 5600
    expect = o.port_base or (nixl_default if o.connector == "NixlConnector" else 25201)
    for side, node, reps, tp, dp in (("prefill", p, n, p_tp, p_dp), ("decode", d, m, d_tp, d_dp)):
        per = engine_ports(o.connector, version, side, tp, dp)
        if per == 0:
            assert env_key not in (node.env or {})
            continue
        base = int(node.env[env_key])
        assert base == expect, (side, base, expect)
        expect = base + reps * per
        for r in range(reps):
            want[(side, r)] = list(range(base + r * per, base + (r + 1) * per))
    flat = [x for ports in want.values() for x in ports]
    assert len(flat) == len(set(flat)), want
    if version < (0, 18):
        return  # the launch plan computes ports for the vLLM it launches (0.30 facts)
    event("launch plan compared")
    planned = plan_document(out, "pd.yaml", LaunchOptions(model="m", vllm="/v/bin/vllm"))
    assert planned.plan is not None
    engines = [x for x in planned.plan.processes if x.role in ("prefill", "decode")]
    assert [x.name for x in engines] == [f"prefill-{r}" for r in range(n)] + [f"decode-{r}" for r in range(m)]
    seen_devices: list[str] = []
    for proc in engines:
        side, r = proc.role, int(proc.name.rsplit("-", 1)[1])
        tp, dp, pool = (p_tp, p_dp, p.devices) if side == "prefill" else (d_tp, d_dp, d.devices)
        devs = proc.env["CUDA_VISIBLE_DEVICES"].split(",")
        assert devs == [str(x) for x in pool[r * tp * dp:(r + 1) * tp * dp]], (proc.name, devs)
        seen_devices += devs
        assert proc.argv[proc.argv.index("--tensor-parallel-size") + 1] == str(tp)
        kv_ports = sorted(u.port for u in proc.ports if u.purpose.startswith(("NIXL", "Mooncake")))
        assert kv_ports == want.get((side, r), []), (proc.name, proc.ports)
        # a DP engine: --data-parallel-size and its own RPC port, its HTTP port + 300 (docs/launch.md)
        http = proc.ports[0].port
        rpc = [u.port for u in proc.ports if u.purpose.startswith("data-parallel RPC")]
        assert rpc == ([http + 300] if dp > 1 else []), (proc.name, proc.ports)
        flag = proc.argv[proc.argv.index("--data-parallel-size") + 1] if "--data-parallel-size" in proc.argv else None
        assert flag == str(dp) if dp > 1 else flag in (None, "1"), (proc.name, proc.argv)
    assert len(seen_devices) == len(set(seen_devices))


@PROPS
@given(cases(), st.sampled_from([(1, 2), (2, 1), (2, 4), (4, 2), (2, 2)]))
def test_per_side_tp_on_the_vllm_omni_runtime(case: Case, tps) -> None:
    """vllm-omni's PD validator requires equal TP whatever the connector (vllm_omni/
    entrypoints/pd_utils.py): unequal per-side TPs are refused (OPD306); equal ones are
    exactly ``--tp``."""
    o = case.opts
    opts = ExpandOptions(connector=o.connector, prefill_tp=tps[0], decode_tp=tps[1])
    src = parse_text(case.text, FILE_NAME)
    if tps[0] != tps[1]:
        with pytest.raises(OmniPdError) as e:
            expand_document(src, opts, vllm_version=case.version)
        assert e.value.diagnostic.code == "OPD306"
        return
    same = ExpandOptions(connector=o.connector, tp=tps[0])
    try:
        want = expand_document(parse_text(case.text, FILE_NAME), same, vllm_version=case.version).text
    except OmniPdError as e:
        with pytest.raises(OmniPdError) as got:
            expand_document(src, opts, vllm_version=case.version)
        assert got.value.diagnostic == e.diagnostic
        return
    assert expand_document(src, opts, vllm_version=case.version).text == want
