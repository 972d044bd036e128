"""omni_pd/upstream/vllm_omni_compat.py without vllm-omni: the table, the pure
decision helpers, the wrappers over stand-in originals shaped like vllm-omni 0.30.0's,
and the install gate (version, signature, env switch, idempotence) over a fake module.
The same layer against the real vllm-omni is tests/test_vllm_omni_compat.py."""

from __future__ import annotations

import logging
import types
from types import SimpleNamespace as NS

import pytest

from omni_pd.upstream import compat_pd as cpd
from omni_pd.upstream import compat_table as ct
from omni_pd.upstream import vllm_omni_compat as c

ALL = ("pd_detect", "pd_validate", "pd_connector_info", "engine_bootstrap_addr", "decode_kv_params",
       "pd_prefill_rows", "talker_prefill_rows", "talker_prefill_merge",
       "stream_async_chunk_ok", "stream_decode_request", "stream_chunk0", "pd_request_params")


def typed(stage_id, inputs=(), extras=None, kv=None, tp=1):
    """A stage shaped like vllm-omni 0.30's typed ``VllmOmniARStageConfig``."""
    return NS(stage_id=stage_id, input_sources=tuple(inputs), stage_pipeline_config=NS(extras=extras or {}),
              connector_config=NS(kv_transfer_config=kv), parallel_config=NS(tensor_parallel_size=tp))


def legacy_detect(stage_configs):
    """The reading pattern of 0.30.0's detector (entrypoints/pd_utils.py)."""
    prefill = {i: i for i, s in enumerate(stage_configs) if getattr(s, "is_prefill_only", False)}
    for j, s in enumerate(stage_configs):
        if getattr(s, "is_decode_only", False):
            for src in getattr(s, "engine_input_source", []):
                if src in prefill:
                    return (prefill[src], j)
    return None


PD4 = [typed(0, (), {"is_prefill_only": True}, {"kv_role": "kv_producer"}, 2),
       typed(1, (0,), {"is_decode_only": True}, {"kv_role": "kv_consumer"}, 2), typed(2, (1,)), typed(3, (2,))]


def test_bundled_table_says_0_30_needs_all_twelve_patches_and_later_releases_none():
    t = c.load_table()
    assert tuple(p.name for p in t.needed("0.30.0")) == ALL
    assert tuple(p.name for p in t.needed("0.30.1rc2")) == ALL
    assert t.needed("0.31.0") == () and t.needed("0.29.9") == ()
    assert t.patches["decode_kv_params"].target == (
        "vllm_omni.engine.orchestrator:OrchestratorBase._build_pd_decode_params")
    assert t.patches["decode_kv_params"].signature == "(self, req_id, sp)"
    assert all(p.source and p.why for p in t.patches.values())
    # the Talker handoff has its own switch; the PD detection patches have none
    assert {n for n, p in t.patches.items() if p.switch == "OMNI_PD_VLLM_OMNI_TALKER_PD"} == set(ALL[5:8])
    # streaming PD (issue 34) has its own switch, the chat request's parameters another
    assert {n for n, p in t.patches.items() if p.switch == "OMNI_PD_VLLM_OMNI_STREAM_PD"} == set(ALL[8:11])
    assert {n for n, p in t.patches.items() if p.switch == "OMNI_PD_VLLM_OMNI_REQUEST_PARAMS"} == {"pd_request_params"}


def test_table_with_an_unknown_patch_name_is_refused():
    with pytest.raises(ValueError, match=r"version 0.30 lists unknown patches \['nope'\]"):
        ct.parse_table({"patches": {}, "versions": {"0.30": {"patches": ["nope"]}}})


def test_signature_of_renders_names_only():
    def f(self, a: int, b=2, *args, k, **kw) -> None: ...
    def g(self, *, k): ...
    assert ct.signature_of(f) == "(self, a, b, *args, k, **kw)"
    assert ct.signature_of(g) == "(self, *, k)"


def test_legacy_views_map_the_typed_fields_and_are_read_only():
    views = cpd.legacy_views(PD4)
    assert views[0] == cpd.LegacyStageView(0, True, False, (), cpd.EngineArgsView({"kv_role": "kv_producer"}, 2))
    assert views[1].engine_input_source == (0,) and views[1].is_decode_only
    assert views[1].engine_args.kv_transfer_config is PD4[1].connector_config.kv_transfer_config  # not a copy
    assert views[3] == cpd.LegacyStageView(3, False, False, (2,), cpd.EngineArgsView(None, 1))
    with pytest.raises(AttributeError):
        views[0].is_prefill_only = False  # frozen
    assert not hasattr(PD4[0], "engine_args")  # nothing added to the typed config


def test_legacy_views_leave_legacy_stage_lists_to_the_original():
    assert cpd.legacy_views([{"stage_id": 0, "is_prefill_only": True}, NS(stage_id=1, engine_args={})]) is None
    assert cpd.legacy_views([]) is None


def test_detect_wrapper_finds_the_pair_only_through_the_views_and_keeps_upstream_answers():
    detect = cpd._wrap_detect(legacy_detect)
    assert legacy_detect(PD4) is None  # the 0.30.0 bug, reproduced
    assert detect(PD4) == (0, 1)
    assert detect([typed(0), typed(1, (0,)), typed(2, (1,))]) is None  # 3-stage pipeline: still no pair
    legacy = [NS(is_prefill_only=True), NS(is_decode_only=True, engine_input_source=[0])]
    assert detect(legacy) == (0, 1)
    calls = []
    upstream_fixed = cpd._wrap_detect(lambda s: calls.append(s) or (0, 1))
    assert upstream_fixed(PD4) == (0, 1) and len(calls) == 1  # the original answered: no second run


def test_over_views_wrapper_steps_in_only_on_engine_args_attribute_errors():
    seen = []

    def validate(self):
        seen.append(self.stage_configs)
        return self.stage_configs[0].engine_args.tensor_parallel_size, self.name

    host = NS(stage_configs=PD4, name="AsyncOmni")
    assert cpd._wrap_over_views(validate)(host) == (2, "AsyncOmni")
    assert seen[0] is PD4 and isinstance(seen[1][0], cpd.LegacyStageView)
    assert host.stage_configs is PD4  # self untouched

    def other_error(self):
        raise AttributeError("'X' object has no attribute 'kv_role'")
    with pytest.raises(AttributeError, match="kv_role"):
        cpd._wrap_over_views(other_error)(host)

    def writes(self):
        self.stage_configs[0].engine_args  # noqa: B018 - raises on the typed config
        return None
    with pytest.raises(AttributeError, match="read-only"):
        cpd._ViewedSelf(host, []).anything = 1
    assert cpd._wrap_over_views(writes)(host) is None


def test_repair_prefill_kv_params_only_for_the_mooncake_shape():
    moon = {"transfer_id": "xfer-r1", "num_transfer_tokens": 17}
    assert cpd.repair_prefill_kv_params("r1", moon) == {**moon, "remote_request_id": "r1"}
    assert "remote_request_id" not in moon
    assert cpd.repair_prefill_kv_params("r1", {"remote_request_id": "p-r1", "transfer_id": "x"}) is None  # NIXL
    assert cpd.repair_prefill_kv_params("r1", {"num_transfer_tokens": 3}) is None
    assert cpd.repair_prefill_kv_params("r1", None) is None


def upstream_build_decode(self, req_id, sp):
    """0.30.0's OrchestratorBase._build_pd_decode_params, reduced to its contract."""
    kv = self._pd_kv_params.pop(req_id, None)
    if not kv or "remote_request_id" not in kv:
        raise RuntimeError(f"[Orchestrator][PD] Missing prefill kv_transfer_params.remote_request_id for req={req_id}")
    return {"transfer_id": f"xfer-{req_id}", "remote_bootstrap_addr": self._pd_bootstrap_addr, **kv,
            "do_remote_prefill": True, "do_remote_decode": False}


def test_decode_params_wrapper_supplies_remote_request_id_and_reruns_the_original():
    orch = NS(_pd_kv_params={"r1": {"transfer_id": "xfer-r1", "num_transfer_tokens": 5}},
              _pd_bootstrap_addr="http://10.0.0.1:8998")
    with pytest.raises(RuntimeError):  # what every Mooncake request hits without the layer
        upstream_build_decode(NS(_pd_kv_params=dict(orch._pd_kv_params), _pd_bootstrap_addr=None), "r1", None)
    got = cpd._wrap_decode_params(upstream_build_decode)(orch, "r1", None)
    assert got == {"transfer_id": "xfer-r1", "num_transfer_tokens": 5, "remote_request_id": "r1",
                   "remote_bootstrap_addr": "http://10.0.0.1:8998", "do_remote_prefill": True,
                   "do_remote_decode": False}
    assert orch._pd_kv_params == {}  # consumed once, as upstream does
    empty = NS(_pd_kv_params={}, _pd_bootstrap_addr=None)
    with pytest.raises(RuntimeError, match="remote_request_id"):  # no transfer_id: upstream's error stands
        cpd._wrap_decode_params(upstream_build_decode)(empty, "r2", None)


def mooncake_client(addr, engine_id, connector="MooncakeConnector"):
    return NS(vllm_config=NS(kv_transfer_config=NS(kv_connector=connector, engine_id=engine_id,
                                                    kv_connector_extra_config={"bootstrap_addr": addr})))


def test_retarget_decode_params_only_replaces_the_orchestrators_single_defaults():
    r0, r1 = ("http://h:8998", "e-s0-r0"), ("http://h:8999", "e-s0-r1")
    moon = {"transfer_id": "x", "remote_bootstrap_addr": r0[0], "remote_engine_id": r0[1]}
    assert cpd.retarget_decode_params(moon, r1, *r0) == {**moon, "remote_bootstrap_addr": r1[0],
                                                       "remote_engine_id": r1[1]}
    assert cpd.retarget_decode_params(moon, r0, *r0) is None  # replica 0: nothing to change
    fixed_upstream = {**moon, "remote_bootstrap_addr": r1[0], "remote_engine_id": r1[1]}
    assert cpd.retarget_decode_params(fixed_upstream, r1, *r0) is None
    nixl = {"remote_engine_id": "n-s0-r1", "remote_host": "h", "remote_port": 5601}
    assert cpd.retarget_decode_params(nixl, None, None, "n-s0-r0") is None
    assert cpd.mooncake_endpoint(mooncake_client(*r1)) == r1
    assert cpd.mooncake_endpoint(mooncake_client(*r1, connector="NixlConnector")) is None
    assert cpd.mooncake_endpoint(NS(vllm_config=None)) is None


def test_decode_params_wrapper_points_decode_at_the_bound_prefill_replica():
    pool = NS(clients=[mooncake_client("http://h:8998", "e-s0-r0"), mooncake_client("http://h:8999", "e-s0-r1")],
              bound={"a": 0, "b": 1})
    pool.get_bound_replica_id = pool.bound.get
    orch = NS(_pd_pair=(0, 1), stage_pools=[pool], _pd_bootstrap_addr="http://h:8998",
              _pd_prefill_engine_id="e-s0-r0",
              _pd_kv_params={k: {"transfer_id": f"xfer-{k}"} for k in "ab"})

    def orig(self, req_id, sp):
        kv = upstream_build_decode(self, req_id, sp)
        return NS(extra_args={"kv_transfer_params": {**kv, "remote_engine_id": self._pd_prefill_engine_id}})

    wrapped = cpd._wrap_decode_params(orig)
    a, b = (wrapped(orch, k, None).extra_args["kv_transfer_params"] for k in "ab")
    assert (a["remote_bootstrap_addr"], a["remote_engine_id"]) == ("http://h:8998", "e-s0-r0")
    assert (b["remote_bootstrap_addr"], b["remote_engine_id"]) == ("http://h:8999", "e-s0-r1")
    assert b["remote_request_id"] == "b" and b["transfer_id"] == "xfer-b"


def test_engine_bootstrap_wrapper_takes_the_address_the_runtime_wrote():
    kv = NS(kv_connector_extra_config={"bootstrap_port": 8998, "bootstrap_addr": "http://127.0.0.1:8998"})
    eng = NS(stage_clients=[NS(vllm_config=NS(kv_transfer_config=kv)), NS(vllm_config=None)])
    orig = lambda self: {"pd_pair": (0, 1), "bootstrap_addr": None, "prefill_engine_id": "e-s0-r0"}  # noqa: E731
    assert cpd._wrap_engine_bootstrap(orig)(eng) == {"pd_pair": (0, 1), "bootstrap_addr": "http://127.0.0.1:8998",
                                                   "prefill_engine_id": "e-s0-r0"}
    assert cpd._wrap_engine_bootstrap(lambda self: None)(eng) is None
    fixed = {"pd_pair": (0, 1), "bootstrap_addr": "http://h:1"}
    assert cpd._wrap_engine_bootstrap(lambda self: fixed)(eng) is fixed
    assert cpd.prefill_bootstrap_addr(eng.stage_clients, 1) is None  # NIXL / no client config
    assert cpd.prefill_bootstrap_addr([], 0) is None


# --- the install gate, over a fake upstream module ------------------------------------


def fake_upstream(signature_b=("self",)):
    mod = types.ModuleType("fake_vllm_omni_pd")

    class Mixin:
        @staticmethod
        def detect(stage_configs):
            return legacy_detect(stage_configs)

    exec(f"def validate({', '.join(signature_b)}):\n    return 'orig'\n", vars(mod))
    Mixin.validate = vars(mod)["validate"]
    mod.Mixin = Mixin
    return mod


def fake_table():
    return c.CompatTable(
        {"pd_detect": c.Patch("pd_detect", "fake_vllm_omni_pd:Mixin.detect", "staticmethod", "(stage_configs)",
                              "why-detect", "src"),
         "pd_validate": c.Patch("pd_validate", "fake_vllm_omni_pd:Mixin.validate", "function", "(self)",
                                "why-validate", "src")},
        {"0.30": ("pd_detect", "pd_validate")})


def run_install(mod, caplog, version="0.30.0", environ=None):
    log = logging.getLogger("omni_pd.test.compat")
    with caplog.at_level(logging.DEBUG, logger="omni_pd.test.compat"):
        caplog.clear()
        rep = c.install(version=version, table=fake_table(), environ=environ or {},
                        importer=lambda name: {"fake_vllm_omni_pd": mod}[name], log=log)
    return rep, [r for r in caplog.records if r.name == "omni_pd.test.compat"]


def test_install_patches_the_listed_release_once_with_one_log_line(caplog):
    mod = fake_upstream()
    orig_detect, orig_validate = mod.Mixin.__dict__["detect"].__func__, mod.Mixin.validate
    rep, logs = run_install(mod, caplog)
    assert rep.status == "patched" and rep.patched == ("pd_detect", "pd_validate")
    assert [(r.levelname, r.getMessage()) for r in logs] == [(
        "INFO", "omni-pd: vllm-omni 0.30.0 PD compatibility layer on (OMNI_PD_VLLM_OMNI_COMPAT=0 turns it off): "
                "Mixin.detect (why-detect); Mixin.validate (why-validate)")]
    assert isinstance(mod.Mixin.__dict__["detect"], staticmethod)
    assert mod.Mixin.detect(PD4) == (0, 1) and mod.Mixin().detect(PD4) == (0, 1)
    rep2, logs2 = run_install(mod, caplog)
    assert rep2.status == "already" and logs2 == []
    assert mod.Mixin.__dict__["detect"].__func__.__wrapped__ is orig_detect  # wrapped once, not twice
    assert mod.Mixin.validate.__wrapped__ is orig_validate
    assert c.installed(lambda n: mod, fake_table()) == {"pd_detect": True, "pd_validate": True}


def test_install_leaves_other_releases_alone(caplog):
    mod = fake_upstream()
    before = dict(vars(mod.Mixin))
    rep, logs = run_install(mod, caplog, version="0.31.0")
    assert rep.status == "not-needed" and dict(vars(mod.Mixin)) == before
    assert [r.levelname for r in logs] == ["DEBUG"]


def test_install_refuses_with_one_warning_when_a_wrapped_function_changed(caplog):
    mod = fake_upstream(signature_b=("self", "strict"))
    before = dict(vars(mod.Mixin))
    rep, logs = run_install(mod, caplog)
    assert rep.status == "refused" and rep.patched == ()
    assert rep.problems == ("fake_vllm_omni_pd:Mixin.validate: signature (self, strict), omni-pd expects (self)",)
    assert dict(vars(mod.Mixin)) == before  # the unchanged detect is not patched either
    assert [r.levelname for r in logs] == ["WARNING"]
    assert "NOT installed, nothing patched: fake_vllm_omni_pd:Mixin.validate: signature (self, strict)" in (
        logs[0].getMessage())


def test_install_refuses_when_a_wrapped_function_is_missing(caplog):
    mod = fake_upstream()
    del mod.Mixin.validate
    before = dict(vars(mod.Mixin))
    rep, logs = run_install(mod, caplog)
    assert rep.status == "refused" and rep.problems == ("fake_vllm_omni_pd:Mixin.validate: validate is missing",)
    assert dict(vars(mod.Mixin)) == before and [r.levelname for r in logs] == ["WARNING"]


@pytest.mark.parametrize("value", ["0", "false", "OFF"])
def test_env_switch_turns_the_layer_off(caplog, value):
    mod = fake_upstream()
    before = dict(vars(mod.Mixin))
    rep, logs = run_install(mod, caplog, environ={c.ENV_SWITCH: value})
    assert rep.status == "off" and dict(vars(mod.Mixin)) == before
    assert [r.getMessage() for r in logs] == [f"omni-pd: vllm-omni PD compatibility layer off "
                                              f"(OMNI_PD_VLLM_OMNI_COMPAT={value})"]
    rep2, logs2 = run_install(mod, caplog, environ={c.ENV_SWITCH: value})  # plugins load again: no second line
    assert rep2.status == "off" and logs2 == []


# --- the plugin entry point -----------------------------------------------------------


def test_plugin_register_installs_the_layer_first_and_never_raises(monkeypatch, caplog):
    """``register`` (both entry points end there) installs the layer before it registers
    any ``*_pd`` pipeline, so a process that can resolve a ``*_pd`` deploy file has the
    layer; a failing install is logged, never raised into vllm-omni's plugin loader."""
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.upstream import vllm_plugin

    events = []
    names = {p.name + "_pd" for p in load_catalogue().pipelines.values()}
    registry = types.ModuleType("vllm_omni.config.pipeline_registry")
    registry.OMNI_PIPELINES = {n: object() for n in names if n != "qwen3_omni_moe_pd"}
    registry.register_pipeline = lambda cfg, name: events.append(("register", name))
    monkeypatch.setitem(__import__("sys").modules, "vllm_omni.config.pipeline_registry", registry)
    monkeypatch.setattr(vllm_plugin, "find_upstream_pipeline", lambda name: events.append(("find", name)))
    monkeypatch.setattr(c, "install", lambda: events.append(("install",)))
    vllm_plugin.register()
    assert events[0] == ("install",) and ("find", "qwen3_omni_moe") in events

    def broken():
        raise ValueError("vllm_omni_compat.yaml: version 0.30 lists unknown patches ['x']")
    monkeypatch.setattr(c, "install", broken)
    with caplog.at_level(logging.ERROR, logger="omni_pd.upstream.vllm_plugin"):
        vllm_plugin.register()
    assert [r.getMessage() for r in caplog.records if r.name == "omni_pd.upstream.vllm_plugin"] == [
        "omni-pd: vllm-omni PD compatibility layer failed to install"]
