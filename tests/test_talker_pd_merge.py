"""omni_pd/upstream/talker_pd.py and the three Talker wrappers of the compat layer, without
vllm-omni or torch: row counts of the non-PD and PD payloads, the PD-shape decision, the
merge, the request keys, and each wrapper over a stand-in original shaped like vllm-omni
0.30.0's. The same wrappers over vllm-omni's real functions: tests/test_oracle_talker_pd.py.

Rows are stand-ins labelled by the Thinker position they belong to, so a merge is checked
row for row: the non-PD payload of a request is positions ``0 .. n_all - 3``."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace as NS

import pytest

from omni_pd.upstream import talker_pd as t
from omni_pd.upstream import compat_pd as cpd
from omni_pd.upstream import compat_stream as cst
from omni_pd.upstream import compat_table as ct
from omni_pd.upstream import vllm_omni_compat as c

P = 21  # the oracle probe's prompt


class Rows:
    """A [n, H] tensor stand-in: one position label per row."""

    def __init__(self, pos, itemsize=2, h=8):
        self.pos, self._itemsize, self._h = list(pos), itemsize, h

    @property
    def shape(self):
        return (len(self.pos), self._h)

    def __getitem__(self, sl):
        return Rows(self.pos[sl], self._itemsize, self._h)

    def __eq__(self, other):
        return isinstance(other, Rows) and self.pos == other.pos

    def __repr__(self):
        return f"Rows({self.pos})"

    def numel(self):
        return len(self.pos) * self._h

    def element_size(self):
        return self._itemsize


def cat(parts):
    return Rows([p for r in parts for p in r.pos])


@pytest.fixture(autouse=True)
def list_cat(monkeypatch):
    monkeypatch.setattr(t, "_torch_cat", cat)


def decode_payload(n_prompt, generated, accept=3):
    """What decode's ``thinker2talker_full_payload`` ships under PD (rows from the
    recomputed last prompt token on, the last accumulated row dropped)."""
    n_all = n_prompt + generated
    acc = list(range(n_prompt - 1, n_all - 1))
    rows = acc[:-1] if len(acc) > 1 else acc
    return {"embed": {"prefill": Rows(rows), "tts_bos": "bos"}, "hidden_states": {"output": Rows(rows)},
            "ids": {"all": list(range(n_all)), "prompt": list(range(n_prompt))}, "speaker": "ethan"}


@pytest.mark.parametrize("generated,non_pd,pd", [(7, 26, 6), (31, 50, 30), (1, P - 1, 1), (2, P, 1)])
def test_row_counts_of_the_two_payloads(generated, non_pd, pd):
    n_all = P + generated
    assert (t.non_pd_rows(n_all), t.pd_rows(n_all, P)) == (non_pd, pd)
    assert t.is_pd_shape(pd, n_all, P) and not t.is_pd_shape(non_pd, n_all, P)


def test_a_one_token_prompt_is_never_the_pd_shape():
    # with one prompt token decode computed the whole prompt: nothing is missing
    assert not t.is_pd_shape(t.pd_rows(8, 1), 8, 1)
    assert not t.is_pd_shape(0, 21, 21)  # no generated token: not a finished answer


@pytest.mark.parametrize("generated", [1, 2, 7, 31])
def test_merge_gives_the_non_pd_rows_position_for_position(generated):
    n_all = P + generated
    dec = decode_payload(P, generated)["embed"]["prefill"]
    assert t.merge_rows(Rows(range(P)), dec, n_all).pos == list(range(t.non_pd_rows(n_all)))


def test_prefill_layers_read_the_nested_and_the_flat_shapes():
    nested = {"hidden_states": {"layers": {0: Rows(range(3)), 24: Rows(range(3))}}, "latent": Rows(range(3))}
    assert t.prefill_layers(nested) == {0: Rows(range(3)), 24: Rows(range(3))}
    assert t.prefill_layers({"hidden_states.layer_0": Rows([1]), "hidden_states.layer_5": Rows([2])}) == {
        0: Rows([1]), 5: Rows([2])}
    assert t.prefill_layers(None) == {} and t.prefill_layers({"latent": Rows([0])}) == {}


def test_attach_adds_top_level_undotted_keys_only_for_the_prompt_rows():
    layers = {0: Rows(range(P)), 3: Rows(range(P))}
    info = t.attach({"speaker": "ethan"}, layers, P)
    assert info == {"speaker": "ethan", "omni_pd_prefill_layer_0": layers[0], "omni_pd_prefill_layer_3": layers[3]}
    assert all("." not in k for k in info)  # unflatten_payload would split a dotted key
    assert t.attach(None, layers, P + 1) is None  # not this request's prompt
    assert t.attach(None, {}, P) is None
    assert t.extra_bytes(layers) == 2 * P * 8 * 2  # 2 x P x H x bf16


def test_merge_payload_replaces_only_the_two_tensors_the_talker_reads():
    pay = {**decode_payload(P, 7), **t.attach(None, {0: Rows(range(P)), 3: Rows(range(100, 100 + P))}, P)}
    merged, why = t.merge_payload(pay, 3)
    assert why == "merged"
    assert merged["embed"]["prefill"].pos == list(range(26))
    assert merged["hidden_states"]["output"].pos == list(range(100, 100 + P)) + list(range(P, 26))
    assert merged["embed"]["tts_bos"] == "bos" and merged["ids"] == pay["ids"] and merged["speaker"] == "ethan"
    assert pay["embed"]["prefill"].pos == list(range(P - 1, 26))  # the input is not changed
    assert t.release(pay) == {"omni_pd_prefill_layer_0": None, "omni_pd_prefill_layer_3": None}


@pytest.mark.parametrize("change,why", [
    (lambda p: p.pop("omni_pd_prefill_layer_0") and p.pop("omni_pd_prefill_layer_3"), "no-prefill-rows"),
    (lambda p: p["embed"].update(prefill=Rows(range(26))) or p["hidden_states"].update(output=Rows(range(26))),
     "not-pd-shape"),  # upstream merged by itself
    (lambda p: p.pop("omni_pd_prefill_layer_3"), "missing-layer"),
    (lambda p: p.update(omni_pd_prefill_layer_0=Rows(range(P - 1))), "prompt-mismatch"),
])
def test_merge_payload_leaves_other_shapes_to_the_original(change, why):
    pay = {**decode_payload(P, 7), **t.attach(None, {0: Rows(range(P)), 3: Rows(range(P))}, P)}
    change(pay)
    assert t.merge_payload(pay, 3) == (None, why)


# --------------------------------------------------------------------------- wrappers


def test_route_output_wrapper_keeps_prefills_rows_from_the_completion_output():
    mm = {"hidden_states": {"layers": {0: Rows(range(P))}}}
    calls = []

    async def route(self, stage_id, replica_id, output, req_state, stage_metrics):
        calls.append(stage_id)
        if self._pd_pair is not None and stage_id == self._pd_pair[0] and output.finished:
            req_state.pd_prefill_multimodal_output = getattr(output, "multimodal_output", None)  # 0.30.0's read

    wrapped = cst._wrap_prefill_rows(route)
    me = NS(_pd_pair=(0, 1))
    out = NS(finished=True, outputs=[NS(multimodal_output=mm)])  # vLLM RequestOutput: no multimodal_output
    st = NS(pd_prefill_multimodal_output=None)
    asyncio.run(wrapped(me, 0, 0, out, st, None))
    assert st.pd_prefill_multimodal_output is mm and calls == [0]
    # decode's output, an unfinished prefill output and a fixed upstream are left alone
    for stage, fin in ((1, True), (0, False)):
        st = NS(pd_prefill_multimodal_output=None)
        asyncio.run(wrapped(me, stage, 0, NS(finished=fin, outputs=[NS(multimodal_output=mm)]), st, None))
        assert st.pd_prefill_multimodal_output is None
    fixed = NS(finished=True, multimodal_output={"upstream": 1}, outputs=[NS(multimodal_output=mm)])
    st = NS(pd_prefill_multimodal_output=None)
    asyncio.run(wrapped(me, 0, 0, fixed, st, None))
    assert st.pd_prefill_multimodal_output == {"upstream": 1}
    st = NS(pd_prefill_multimodal_output=None)
    asyncio.run(wrapped(NS(_pd_pair=None), 0, 0, out, st, None))  # not PD
    assert st.pd_prefill_multimodal_output is None


def token_only(source_outputs, prompt=None, requires_multimodal_data=False, streaming_context=None):
    """0.30.0's shape: one placeholder prompt per source output, speaker info only."""
    return [{"prompt_token_ids": [0] * 9, "additional_information": {"speaker": "ethan"}} for _ in source_outputs]


def test_talker_input_wrapper_attaches_the_bridge_rows_and_drops_the_bridge_entry():
    layers = {0: Rows(range(P)), 3: Rows(range(P))}
    ctx = NS(enabled=False, bridge_states={t.BRIDGE_KEY: {"r1": {"hidden_states": {"layers": layers}}}})
    wrapped = cst._wrap_talker_input(token_only)
    [tp] = wrapped([NS(request_id="r1", prompt_token_ids=list(range(P)))], None, False, ctx)
    assert tp["additional_information"] == {"speaker": "ethan", **{t.key_of(i): v for i, v in layers.items()}}
    assert ctx.bridge_states[t.BRIDGE_KEY] == {}  # released: the rows now travel with the request
    # no bridge entry (non-PD run, or the orchestrator patch off): upstream's prompt unchanged
    assert wrapped([NS(request_id="r2", prompt_token_ids=[1, 2])], None, False, ctx) == token_only([1])
    assert wrapped([NS(request_id="r2", prompt_token_ids=[1, 2])]) == token_only([1])


def test_talker_input_wrapper_keeps_the_signature_the_orchestrator_inspects():
    import inspect

    # StageEngineCoreClient._call_custom_process_input passes streaming_context by its name
    assert list(inspect.signature(cst._wrap_talker_input(token_only)).parameters) == [
        "source_outputs", "prompt", "requires_multimodal_data", "streaming_context"]


def fake_prefill(self, input_ids, input_embeds, payload):
    """Records what the original got; returns its row count like 0.30.0 returns embeds."""
    self.seen.append(payload)
    return "ids", payload["embed"]["prefill"], {"meta": {"prefill_consumed_text_tokens": 1}, "embed": {"decode": None}}


def test_talker_prefill_wrapper_feeds_the_original_the_non_pd_rows_and_releases_the_keys(caplog):
    me = NS(talker_config=NS(accept_hidden_layer=3), seen=[])
    pay = {**decode_payload(P, 7), **t.attach(None, {0: Rows(range(P)), 3: Rows(range(P))}, P)}
    with caplog.at_level(logging.INFO, logger=c.logger.name):
        ids, embeds, upd = cst._wrap_talker_prefill(fake_prefill)(me, "in", "emb", pay)
    assert embeds.pos == list(range(26)) and me.seen[0]["embed"]["prefill"].pos == list(range(26))
    assert upd["embed"] == {"decode": None, "prefill": Rows(range(26))}
    assert upd["hidden_states"] == {"output": Rows(range(26))}
    assert upd["omni_pd_prefill_layer_0"] is None and upd["omni_pd_prefill_layer_3"] is None
    # a later chunk of a chunked prefill sees the buffer after that update: passes through
    later = {**pay, **upd, "embed": {**pay["embed"], **upd["embed"]}, "hidden_states": upd["hidden_states"]}
    cst._wrap_talker_prefill(fake_prefill)(me, "in", "emb", later)
    assert me.seen[1] is later


def test_talker_prefill_wrapper_passes_non_pd_payloads_through_unchanged():
    me = NS(talker_config=NS(accept_hidden_layer=3), seen=[])
    plain = {"embed": {"prefill": Rows(range(26))}, "hidden_states": {"output": Rows(range(26))},
             "ids": {"all": list(range(28)), "prompt": list(range(P))}}
    _, embeds, upd = cst._wrap_talker_prefill(fake_prefill)(me, "in", "emb", plain)
    assert me.seen == [plain] and embeds.pos == list(range(26)) and "hidden_states" not in upd
    # PD shape but no prefill rows (orchestrator patches off): upstream's behaviour, unchanged
    pd = decode_payload(P, 7)
    cst._wrap_talker_prefill(fake_prefill)(me, "in", "emb", pd)
    assert me.seen[1] is pd


# --------------------------------------------------------------------------- install gate


def talker_table():
    rows = {
        "orch": {"target": "fake_orch:Orch._route_output", "kind": "function",
                 "signature": "(self, stage_id, replica_id, output, req_state, stage_metrics)",
                 "switch": "OMNI_PD_VLLM_OMNI_TALKER_PD", "why": "w", "source": "s"},
        "proc": {"target": "fake_proc:thinker2talker_token_only", "kind": "function",
                 "signature": "(source_outputs, prompt, requires_multimodal_data, streaming_context)",
                 "switch": "OMNI_PD_VLLM_OMNI_TALKER_PD", "why": "w", "source": "s"},
        "base": {"target": "fake_orch:Orch._build_pd_decode_params", "kind": "function",
                 "signature": "(self, req_id, sp)", "why": "w", "source": "s"},
    }
    return ct.parse_table({"patches": rows, "versions": {"0.30": {"patches": ["base", "orch", "proc"]}}})


def fake_modules():
    class Orch:
        async def _route_output(self, stage_id, replica_id, output, req_state, stage_metrics): ...

        def _build_pd_decode_params(self, req_id, sp): ...

    mods = {"fake_orch": NS(Orch=Orch), "fake_proc": NS(thinker2talker_token_only=token_only)}
    mods["fake_proc"].__dict__["thinker2talker_token_only"] = token_only
    return mods


def test_install_wraps_module_level_functions_and_the_talker_switch_skips_only_those(caplog):
    wrappers = {"orch": cst._wrap_prefill_rows, "proc": cst._wrap_talker_input, "base": cpd._wrap_decode_params}
    mods = fake_modules()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in wrappers.items():
            mp.setitem(c.WRAPPERS, k, v)
        rep = c.install(version="0.30.0", table=talker_table(), environ={}, importer=mods.__getitem__)
        assert rep.status == "patched" and rep.patched == ("base", "orch", "proc")
        assert getattr(mods["fake_proc"].thinker2talker_token_only, c.MARK) == "proc"
        assert c.installed(mods.__getitem__, talker_table()) == {"orch": True, "proc": True, "base": True}

        mods = fake_modules()
        with caplog.at_level(logging.INFO, logger=c.logger.name):
            rep = c.install(version="0.30.0", table=talker_table(), environ={"OMNI_PD_VLLM_OMNI_TALKER_PD": "0"},
                            importer=mods.__getitem__)
        assert rep.status == "patched" and rep.patched == ("base",)
        assert mods["fake_proc"].thinker2talker_token_only is token_only
        assert rep.message.endswith("; off by OMNI_PD_VLLM_OMNI_TALKER_PD=0: orch, proc")
        assert caplog.messages == [rep.message]  # one line


def test_a_talker_patch_that_cannot_resolve_leaves_out_its_group_but_not_pd_detection(caplog):
    # e.g. the Qwen3-Omni model module fails to import: the Talker rows go, PD detection stays
    wrappers = {"orch": cst._wrap_prefill_rows, "proc": cst._wrap_talker_input, "base": cpd._wrap_decode_params}
    mods = fake_modules()
    del mods["fake_proc"]
    with pytest.MonkeyPatch.context() as mp:
        for k, v in wrappers.items():
            mp.setitem(c.WRAPPERS, k, v)
        with caplog.at_level(logging.INFO, logger=c.logger.name):
            caplog.clear()
            rep = c.install(version="0.30.0", table=talker_table(), environ={}, importer=mods.__getitem__)
        assert rep.status == "patched" and rep.patched == ("base",)
        assert c.installed(mods.__getitem__, talker_table())["base"] is True
        assert getattr(mods["fake_orch"].Orch._route_output, c.MARK, None) is None  # its group-mate too
        assert rep.problems == ("fake_proc: cannot import (KeyError: 'fake_proc')",)
        assert rep.message.endswith("; orch, proc NOT installed (fake_proc: cannot import (KeyError: 'fake_proc'))")
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("WARNING", rep.message)]
