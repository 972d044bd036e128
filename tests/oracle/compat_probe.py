"""Runs inside the vllm-omni oracle venv (``python tests/oracle/compat_probe.py SPEC``);
tests/test_vllm_omni_compat.py starts it once with the layer on and once with
``OMNI_PD_VLLM_OMNI_COMPAT=0`` and asserts on the one JSON object it prints.

omni-pd is present only through its entry points: the layer is installed by vLLM's
plugin loader while the real ``vllm serve --omni`` parser is built (as ``vllm serve``
does before ``AsyncOmni`` exists), never by calling omni-pd here. What it checks, all
with vllm-omni 0.30.0's own code:

* ``gate``: ``install`` refuses a release not in the table, a changed signature and the
  env switch, patching nothing (the real modules, before any plugin ran).
* ``order``: a recorder wrapped around the raw detector sees the layer in place at every
  call; after the parser, nothing has called the detector yet; one log line.
* ``files``: each deploy file through ``resolve_omni_config`` (the serve path's
  resolver), the detector on the typed configs (with the layer, and raw), the
  frontend's ``_init_pd_state`` + prefill sampling rewrite (``AsyncOmni``), the
  engine's ``_detect_pd_config`` over replica configs written by
  ``StageRuntime._prepare_replica_vllm_config`` for real, and the orchestrator's
  ``_build_pd_decode_params`` on the connector's own prefill-params shape.
* ``flows``: one request through vllm-omni's real ``Orchestrator`` and ``StagePool``s,
  the engines replaced by fake stage clients (a ``StageEngineCoreClientBase`` subclass,
  so ``process_engine_inputs`` is upstream's) and vLLM's output processing by
  vllm-omni's real ``MultimodalOutputProcessor`` with a word-level tokenizer.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace as NS

from omni_pd.upstream.vllm_oracle import _install_standins

_install_standins()

RECORDS: list[logging.LogRecord] = []


class _Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        RECORDS.append(record)


import vllm_omni.engine.orchestrator as orch_mod  # noqa: E402
from vllm_omni.entrypoints.pd_utils import PDDisaggregationMixin as M  # noqa: E402

from omni_pd.upstream import vllm_omni_compat as compat  # noqa: E402

# vLLM's dictConfig resets the handlers of existing ``vllm.*`` loggers, so listen on
# ``vllm`` itself (configured by now; the layer logs to its child ``vllm.omni_pd.compat``).
logging.getLogger("vllm").addHandler(_Keep())

DETECT = "detect_pd_separation_from_stage_configs"
CALLS: list[bool] = []
_raw_detect = vars(M)[DETECT].__func__


def _recording_detect(stage_configs):
    """The raw upstream detector, noting whether the layer wraps it at each call."""
    CALLS.append(compat.installed()["pd_detect"])
    return _raw_detect(stage_configs)


M.detect_pd_separation_from_stage_configs = staticmethod(_recording_detect)


def _msgs(since: int) -> list[list[str]]:
    return [[r.levelname, r.getMessage()] for r in RECORDS[since:] if r.name == compat.logger.name]


def gate() -> dict:
    out: dict = {}
    table = compat.load_table()
    n = len(RECORDS)
    out["other_release"] = [compat.install(version="0.31.0").status, compat.installed()]
    changed = compat.CompatTable({**table.patches, "pd_validate": compat.Patch(
        **{**vars(table.patches["pd_validate"]), "signature": "(self, strict)"})}, table.versions)
    rep = compat.install(table=changed)
    out["changed_signature"] = [rep.status, list(rep.problems), compat.installed(), _msgs(n)]
    n = len(RECORDS)
    out["env_off"] = [compat.install(environ={compat.ENV_SWITCH: "off"}).status, compat.installed(), _msgs(n)]
    return out


def serve_parser() -> dict:
    """Build the real `vllm serve --omni` parser: vLLM loads `vllm.general_plugins` here."""
    import vllm_omni.entrypoints.cli.serve as serve
    import vllm_omni.plugins as omni_plugins
    from vllm_omni.utils.tracking_parser import TrackingArgumentParser

    n = len(RECORDS)
    before = compat.installed()
    parser = TrackingArgumentParser()
    serve._ensure_vllm_platform()
    serve.OmniServeCommand().subparser_init(parser.add_subparsers())
    after = compat.installed()
    lines = _msgs(n)
    m = len(RECORDS)
    omni_group_before = omni_plugins.omni_plugins_loaded
    omni_plugins.load_omni_general_plugins()  # what OmniEngineArgs / prepare_engine_environment run later
    wrapped = vars(M)[DETECT].__func__
    return {"before": before, "after": after, "log": lines, "omni_group_loaded_by_parser": omni_group_before,
            "log_after_omni_group": _msgs(m), "detector_calls": len(CALLS),
            "layers": [getattr(wrapped, compat.MARK, None),
                       getattr(getattr(wrapped, "__wrapped__", None), compat.MARK, None)]}


def kv_dict(kv) -> dict:
    return {k: getattr(kv, k) for k in ("kv_connector", "kv_role", "engine_id", "kv_ip",
                                         "kv_connector_extra_config")}


def prefill_params(connector: str, req_id: str, engine_id: str, n_prompt: int) -> dict:
    """What a prefill engine returns in ``kv_transfer_params`` on vLLM 0.30 + vllm-omni 0.30.

    Mooncake: ``MooncakeConnector.request_finished`` returns none; vllm-omni's
    ``OmniARScheduler`` (core/sched/omni_ar_scheduler.py) adds ``transfer_id`` and
    ``num_transfer_tokens``. NIXL: ``NixlConnectorScheduler.request_finished``
    (kv_connector/v1/nixl/pull_scheduler.py) returns this dict."""
    if connector == "MooncakeConnector":
        return {"transfer_id": f"xfer-{req_id}", "num_transfer_tokens": n_prompt}
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [0, 1],
            "remote_engine_id": engine_id, "remote_request_id": req_id, "remote_host": "127.0.0.1",
            "remote_port": 5600, "tp_size": 1, "dcp_size": 1, "pp_size": 1, "remote_num_tokens": n_prompt}


def replica_configs(typed: list) -> list:
    """Per stage: replica 0's vllm_config stand-in (its ``kv_transfer_config`` from the
    resolved typed config), passed through the real ``_prepare_replica_vllm_config``."""
    from vllm_omni.engine.stage_runtime import StageRuntime

    out = []
    for i, s in enumerate(typed):
        kv = getattr(getattr(s, "connector_config", None), "kv_transfer_config", None)
        base = NS(kv_transfer_config=copy.deepcopy(kv),
                  model_config=NS(max_model_len=4096, model_stage=getattr(s, "model_stage", None)))
        if kv is None:
            out.append((base, None))
            continue
        replica_cfg = copy.deepcopy(s)
        meta = NS(stage_id=i, replica_id=0, runtime_cfg=None)
        rv = StageRuntime._prepare_replica_vllm_config(base, replica_cfg, meta, native_kv=True)
        out.append((rv, dict(replica_cfg.runtime_config.env or {})))
    return out


def frontend(typed: list):
    from vllm_omni.entrypoints.async_omni import AsyncOmni

    fe = AsyncOmni.__new__(AsyncOmni)
    fe.__dict__["_name"] = "AsyncOmni"
    fe.__dict__["engine"] = NS(stage_configs=typed)
    return fe


def engine(typed: list, clients: list):
    from vllm_omni.engine.async_omni_engine import AsyncOmniEngine

    eng = AsyncOmniEngine.__new__(AsyncOmniEngine)
    eng.stage_configs = typed
    eng.stage_clients = clients
    return eng


def err(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def check_file(spec: dict) -> dict:
    from vllm import SamplingParams
    from vllm_omni.config.resolver import resolve_omni_config

    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "config.json").write_text(json.dumps({"model_type": spec["model_type"]}))
        res = resolve_omni_config(tmp, trust_remote_code=False, cli_overrides={}, deploy_config_path=spec["path"],
                                  stage_overrides=None, strategy_config_path=None)
    typed = list(res.stage_configs)
    out["pipeline"] = res.pipeline_config.model_type
    out["types"] = [type(s).__name__ for s in typed]
    pair = M.detect_pd_separation_from_stage_configs(typed)
    out["detect"] = list(pair) if pair else None
    raw = _raw_detect(typed)
    out["raw_detect"] = list(raw) if raw else None
    out["typed_has_engine_args"] = any(hasattr(s, "engine_args") for s in typed)

    fe = frontend(typed)
    try:
        fe._init_pd_state()
        out["init_pd_state"] = {"pair": list(fe._pd_separation_pair) if fe._pd_separation_pair else None,
                                "connector_info": fe._pd_connector_info}
    except Exception as e:  # the answer vllm-omni gives, whatever it is
        out["init_pd_state"] = {"error": err(e)}
    sp = SamplingParams(max_tokens=2048, min_tokens=3, stop=["</s>"], stop_token_ids=[7], temperature=0.0)
    p = fe._get_pd_separation_pair() if "error" not in out["init_pd_state"] else None
    if p is not None:  # async_omni.py AsyncOmni.generate: the prefill stage's params, rewritten per request
        sp = fe._prepare_prefill_sampling_params("req-1", sp)
    out["prefill_sp"] = {"max_tokens": sp.max_tokens, "min_tokens": sp.min_tokens, "stop": sp.stop,
                         "stop_token_ids": sp.stop_token_ids,
                         "kv_transfer_params": (sp.extra_args or {}).get("kv_transfer_params")}

    reps = replica_configs(typed)
    clients = [NS(vllm_config=rv) for rv, _ in reps]
    out["replica_kv"] = [kv_dict(rv.kv_transfer_config) if rv.kv_transfer_config is not None else None
                         for rv, _ in reps]
    out["replica_env"] = [env for _, env in reps]
    try:
        cfg = engine(typed, clients)._detect_pd_config()
        out["engine_pd_config"] = cfg and {**cfg, "pd_pair": list(cfg["pd_pair"])}
    except Exception as e:
        out["engine_pd_config"] = {"error": err(e)}
        cfg = None
    if cfg:
        orch = orch_mod.Orchestrator.__new__(orch_mod.Orchestrator)
        orch._pd_bootstrap_addr = cfg.get("bootstrap_addr")
        orch._pd_prefill_engine_id = cfg.get("prefill_engine_id")
        conn = typed[cfg["pd_pair"][0]].connector_config.kv_transfer_config.kv_connector
        orch._pd_kv_params = {"req-1": prefill_params(conn, "req-1", str(cfg.get("prefill_engine_id")), 12)}
        try:
            dsp = orch._build_pd_decode_params("req-1", SamplingParams(max_tokens=64))
            out["decode_kv_params"] = dsp.extra_args["kv_transfer_params"]
        except Exception as e:
            out["decode_kv_params"] = {"error": err(e)}
    return out


# --- the request flow through the real orchestrator ----------------------------------


def word_tokenizer():
    """A real ``PreTrainedTokenizerFast`` over the words w0..w1999 (built locally)."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(2000)}
    vocab["[UNK]"] = 2000
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def thinker_answer(prompt_ids: list[int], n: int) -> list[int]:
    """The fake Thinker's greedy answer to a prompt: a fixed function of the prompt."""
    s = sum(prompt_ids)
    return [100 + (s * 7 + 13 * k) % 800 for k in range(n)]


ANSWER_LEN = 5
EOS = 1999  # the fake Thinker's end-of-sequence token (w1999)


def make_fake_client_class():
    from vllm.v1.engine import FinishReason
    from vllm_omni.engine import OmniEngineCoreOutput, OmniEngineCoreOutputs
    from vllm_omni.engine.stage_engine_core_client import StageEngineCoreClientBase

    class FakeStageClient(StageEngineCoreClientBase):
        """A stage client whose engine is a Python function; upstream's
        ``process_engine_inputs`` and metadata handling stay as they are."""

        def respond(self, req) -> OmniEngineCoreOutput:
            sp = req.sampling_params
            kvp = dict((sp.extra_args or {}).get("kv_transfer_params") or {})
            prompt = list(req.prompt_token_ids)
            self.received.append({"request_id": req.request_id, "prompt_token_ids": prompt, "max_tokens": sp.max_tokens,
                                  "kv_transfer_params": kvp or None})
            out_kv = None
            if self.role == "thinker":  # greedy: the answer, then EOS, unless max_tokens cuts it
                toks = (thinker_answer(prompt, ANSWER_LEN) + [EOS])[:sp.max_tokens]
                finish = FinishReason.STOP if toks[-1] == EOS else FinishReason.LENGTH
                if kvp.get("do_remote_decode") and finish == FinishReason.LENGTH:
                    out_kv = prefill_params(self.connector, req.request_id, self.engine_id, len(prompt))
            else:  # talker / code2wav: echo what they were given, shifted
                toks = [t + 1 for t in prompt][:sp.max_tokens]
                finish = FinishReason.STOP
            return OmniEngineCoreOutput(request_id=req.request_id, new_token_ids=toks, finish_reason=finish,
                                        kv_transfer_params=out_kv)

        async def add_request_async(self, request) -> None:
            self.pending.append(request)

        async def get_output_async(self):
            if not self.pending:
                await asyncio.sleep(0.001)
                return OmniEngineCoreOutputs(outputs=[])
            return OmniEngineCoreOutputs(outputs=[self.respond(self.pending.pop(0))])

        async def abort_requests_async(self, request_ids) -> None:
            self.aborted.extend(request_ids)

        def check_health(self) -> None:
            return None

        def shutdown(self) -> None:
            return None

    return FakeStageClient


def run_flow(spec: dict) -> dict:
    """``spec["requests"]`` requests (default 1), one after the other, through the real
    orchestrator; the prefill stage gets ``spec["prefill_replicas"]`` fake replicas
    (default 1), each with the vllm_config ``_prepare_replica_vllm_config`` writes for it."""
    from vllm import SamplingParams
    from vllm_omni.config.resolver import resolve_omni_config
    from vllm_omni.engine.messages import OutputMessage, StageSubmissionMessage
    from vllm_omni.engine.orchestrator import Orchestrator, build_engine_core_request_from_tokens
    from vllm_omni.engine.stage_pool import StagePool
    from vllm_omni.engine.stage_runtime import StageRuntime
    from vllm_omni.outputs.output_processor import MultimodalOutputProcessor

    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "config.json").write_text(json.dumps({"model_type": spec["model_type"]}))
        res = resolve_omni_config(tmp, trust_remote_code=False, cli_overrides={}, deploy_config_path=spec["path"],
                                  stage_overrides=None, strategy_config_path=None)
    typed = list(res.stage_configs)
    reps = replica_configs(typed)
    Fake = make_fake_client_class()
    tok = word_tokenizer()
    n_prefill = int(spec.get("prefill_replicas", 1))
    pools, by_stage = [], []
    roles = ["thinker", "thinker", "talker", "code2wav"]
    for i, s in enumerate(typed):
        replicas = []
        for r in range(n_prefill if i == 0 else 1):
            vcfg = reps[i][0]
            if r:  # replica r of the prefill stage: what the runtime writes for it
                kv0 = s.connector_config.kv_transfer_config
                vcfg = StageRuntime._prepare_replica_vllm_config(
                    NS(kv_transfer_config=copy.deepcopy(kv0), model_config=reps[i][0].model_config),
                    copy.deepcopy(s), NS(stage_id=i, replica_id=r, runtime_cfg=None), native_kv=True)
            kv = vcfg.kv_transfer_config
            c = object.__new__(Fake)
            c.__dict__.update(
                stage_id=i, replica_id=r, stage_type="llm", model_stage=s.model_stage, is_comprehension=i < 2,
                requires_multimodal_data=False, engine_input_source=list(s.input_sources),
                final_output=i in (1, 3), final_output_type="text", default_sampling_params=None,
                prompt_transform_func=None, prompt_expand_func=None, custom_process_input_func=None,
                vllm_config=vcfg, engine_outputs=None, role=roles[i],
                connector=getattr(kv, "kv_connector", None), engine_id=getattr(kv, "engine_id", None),
                pending=[], received=[], aborted=[], _payload_sender_info=None, _kv_sender_info=None,
                _kv_sender_initialized=True)
            replicas.append(c)
        by_stage.append(replicas)
        pools.append(StagePool(i, replicas, output_processor=MultimodalOutputProcessor(tok, log_stats=False),
                               stage_vllm_config=reps[i][0]))
    clients = [replicas[0] for replicas in by_stage]  # OmniEngineBase.stage_clients: one per logical stage
    pd_config = engine(typed, clients)._detect_pd_config()
    fe = frontend(typed)
    fe._init_pd_state()

    def sampling(req_id: str) -> list:
        sp_list = [SamplingParams(max_tokens=2048, temperature=0.0), SamplingParams(max_tokens=2048, temperature=0.0),
                   SamplingParams(max_tokens=64), SamplingParams(max_tokens=64)]
        pair = fe._get_pd_separation_pair()
        if pair is not None:  # async_omni.py AsyncOmni.generate
            sp_list[pair[0]] = fe._prepare_prefill_sampling_params(req_id, sp_list[pair[0]])
        return sp_list

    prompts = [[11 + k + 3 * n for k in range(12)] for n in range(int(spec.get("requests", 1)))]

    async def one(orch, req_id: str, prompt_ids: list[int]) -> list:
        sp_list = sampling(req_id)
        request = build_engine_core_request_from_tokens(req_id, {"prompt_token_ids": prompt_ids}, sp_list[0],
                                                        model_config=reps[0][0].model_config)
        request.external_req_id = req_id  # as the frontend's input processing sets it
        await orch.request_async_queue.put(StageSubmissionMessage(
            type="add_request", request_id=req_id, prompt=request, original_prompt={"prompt_token_ids": prompt_ids},
            output_prompt_text=None, sampling_params_list=sp_list, final_stage_id=3, preprocess_ms=0.0,
            request_timestamp=time.time(), enqueue_ts=0.0, final_output_stage_ids=[1, 3]))
        got = []
        try:
            while True:  # a deadlock guard, not a timing assertion
                msg = await asyncio.wait_for(orch.output_async_queue.get(), timeout=30)
                if isinstance(msg, OutputMessage):
                    eo = msg.engine_outputs
                    got.append({"stage_id": msg.stage_id, "finished": msg.finished,
                                "token_ids": list(eo.outputs[0].token_ids), "text": eo.outputs[0].text})
                    if msg.finished:
                        return got
                else:
                    got.append({"message": type(msg).__name__, "error": getattr(msg, "error", None)})
                    if getattr(msg, "error", None):
                        return got
        except asyncio.TimeoutError:
            got.append({"message": "timeout"})
        return got

    async def drive() -> list:
        orch = Orchestrator(asyncio.Queue(), asyncio.Queue(), asyncio.Queue(), pools, pd_config=pd_config)
        # run()'s two loops, without run()'s teardown (which cancels every task on the loop)
        tasks = [asyncio.create_task(orch._request_handler()),
                 asyncio.create_task(orch._orchestration_output_handler())]
        outs = [await one(orch, f"req-flow-{n + 1}", p) for n, p in enumerate(prompts)]
        orch._shutdown_event.set()
        for t in tasks:
            if t.done() and t.exception() is not None:
                import traceback
                outs[-1].append({"message": "orchestrator task failed", "error": err(t.exception()),
                                 "where": traceback.format_exception(t.exception())[-3:]})
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return outs

    outs = asyncio.run(drive())
    requests = [{"prompt_token_ids": p, "answer": thinker_answer(p, ANSWER_LEN),
                 "answer_text": tok.decode(thinker_answer(p, ANSWER_LEN)),
                 # what a Thinker answers when its prompt is its own earlier answer (no PD)
                 "twice_text": tok.decode(thinker_answer(thinker_answer(p, ANSWER_LEN) + [EOS], ANSWER_LEN)),
                 "client": o} for p, o in zip(prompts, outs)]
    return {"pd_config": pd_config and {**pd_config, "pd_pair": list(pd_config["pd_pair"])}, "answer_eos": EOS,
            **requests[0], "requests": requests,
            "stages": [[{**x, "replica": c.replica_id} for c in replicas for x in c.received] for replicas in by_stage],
            "prefill_replicas": [{"replica": c.replica_id, "engine_id": c.engine_id,
                                  "bootstrap_addr": (c.vllm_config.kv_transfer_config.kv_connector_extra_config or {})
                                  .get("bootstrap_addr"), "requests": [x["request_id"] for x in c.received]}
                                 for c in by_stage[0]]}


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out: dict = {"env": os.environ.get(compat.ENV_SWITCH)}
    out["gate"] = gate()
    out["order"] = serve_parser()
    out["files"] = {s["name"]: check_file(s) for s in spec["files"]}
    out["flows"] = {s["name"]: run_flow(s) for s in spec["flows"]}
    out["order"]["all_detector_calls_saw_the_layer"] = CALLS and all(CALLS)
    out["order"]["detector_calls_total"] = len(CALLS)
    out["compat_log"] = _msgs(0)  # every line the layer logged in this process
    print("COMPAT-PROBE " + json.dumps(out, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
