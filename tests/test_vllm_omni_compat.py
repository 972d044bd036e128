"""omni-pd's vllm-omni 0.30 PD compatibility layer against the real vllm-omni (issue 10).

Runs where the oracle venv exists (``OMNI_PD_ORACLE_PYTHON``, built by
``.ci/oracle_venv.sh``). ``tests/oracle/compat_probe.py`` runs twice in that venv, once
as installed and once with ``OMNI_PD_VLLM_OMNI_COMPAT=0`` (a fresh process each), over
``expand``'s outputs (Mooncake, NIXL, ``--tp 2``, Qwen2.5-Omni from the deploy file
vllm-omni ships, the Qwen3-Omni thinker-only pipeline). omni-pd reaches vllm-omni only
through its entry points. See the probe's docstring for what each section runs; the
layer itself is omni_pd/upstream/vllm_omni_compat.py, its pure parts are unit-tested in
tests/test_vllm_omni_compat_unit.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.io import parse_text
from omni_pd.resources import preset_path

ROOT = Path(__file__).resolve().parents[1]
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")
PROBE = ROOT / "tests" / "oracle" / "compat_probe.py"

pytestmark = pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")

PATCHES = ("pd_detect", "pd_validate", "pd_connector_info", "engine_bootstrap_addr", "decode_kv_params",
           "pd_prefill_rows", "talker_prefill_rows", "talker_prefill_merge",
           "stream_async_chunk_ok", "stream_decode_request", "stream_chunk0", "pd_request_params")
NONE_PATCHED = dict.fromkeys(PATCHES, False)
ALL_PATCHED = dict.fromkeys(PATCHES, True)
ON_LINE = (
    "omni-pd: vllm-omni 0.30.0 PD compatibility layer on (OMNI_PD_VLLM_OMNI_COMPAT=0 turns it off): "
    "PDDisaggregationMixin.detect_pd_separation_from_stage_configs (PD pair not detected on the serve path's "
    "typed stage configs); PDDisaggregationMixin._validate_pd_separation_config (_init_pd_state raises "
    "AttributeError 'engine_args' once the pair is detected); PDDisaggregationMixin._get_pd_connector_info "
    "(_init_pd_state raises AttributeError 'engine_args' once the pair is detected); "
    "OmniEngineBase._detect_pd_config (orchestrator gets bootstrap_addr None, Mooncake decode has no "
    "remote_bootstrap_addr); OrchestratorBase._build_pd_decode_params (every Mooncake request fails with "
    "'Missing prefill kv_transfer_params.remote_request_id', and with num_replicas > 1 on the prefill stage "
    "decode would pull KV from replica 0); OrchestratorBase._route_output (prefill's rows are never kept (the "
    "orchestrator reads RequestOutput.multimodal_output, always None)); thinker2talker_token_only (the Talker "
    "request carries no prompt rows under PD); Qwen3OmniMoeForConditionalGeneration.talker_preprocess_prefill "
    "(the Talker raises a size mismatch (answer shorter than the prompt) or is conditioned on the wrong rows "
    "under PD); _validate_async_chunk_support (vllm-omni refuses to start a PD pair with async_chunk on); "
    "build_engine_core_request_from_tokens (decode's engine has no prompt rows for the Talker's first chunk under "
    "PD); thinker2talker_async_chunk (under PD the Talker's first chunk waits P decode steps and carries answer "
    "rows as prompt rows); OmniOpenAIServingChat._build_sampling_params_list_from_request (under PD the answer "
    "ignores the request's max_tokens, temperature, ignore_eos ...: decode runs its deploy defaults (a 64-token "
    "request got 16 tokens, the CPU fixture's default))")

#: name -> (connector, TP, pipeline vllm-omni resolves, stage count)
FILES = {
    "mooncake": ("MooncakeConnector", 1, "qwen3_omni_moe_pd", 4),
    "nixl": ("NixlConnector", 1, "qwen3_omni_moe_pd", 4),
    "tp2": ("MooncakeConnector", 2, "qwen3_omni_moe_pd", 4),
    "qwen2_5_omni": ("MooncakeConnector", 1, "qwen2_5_omni_pd", 4),
    "thinker_only": ("MooncakeConnector", 1, "qwen3_omni_moe_thinker_only_pd", 2),
}
FLOWS = ("mooncake", "nixl")
#: flow name -> (file, prefill replicas, requests sent one after the other)
MORE_FLOWS = {"mooncake_2p": ("mooncake", 2, 2)}


def wheel_deploy_dir() -> Path:
    """``vllm_omni/deploy`` inside the oracle venv (the deploy files the wheel ships)."""
    code = "import importlib.util as u; print(u.find_spec('vllm_omni').submodule_search_locations[0])"
    out = subprocess.run([ORACLE, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return Path(out.stdout.strip()) / "deploy"


def expand_to(dest: Path, name: str, src: str, src_name: str, opts: ExpandOptions) -> Path:
    out = dest / f"{name}.yaml"
    out.write_text(expand_document(parse_text(src, src_name), opts).text)
    return out


def run_probe(spec: Path, **env: str) -> dict:
    proc = subprocess.run([ORACLE, str(PROBE), str(spec)], capture_output=True, text=True, timeout=900, cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **env})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("COMPAT-PROBE "))
    return json.loads(line[len("COMPAT-PROBE "):])


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """(layer on, layer off): one probe process each over the same files."""
    d = tmp_path_factory.mktemp("compat")
    q3 = preset_path("qwen3_omni_moe").read_text()
    wheel = wheel_deploy_dir()
    # expand refuses qwen2_5_omni's Talker under PD (OPD704: the layer cannot hand it prefill's rows);
    # here only PD detection of that pipeline is probed, which does not depend on it
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("omni_pd.compile.talker_pd.gap", lambda *a: None)
        q25 = expand_to(d, "qwen2_5_omni", (wheel / "qwen2_5_omni.yaml").read_text(), "qwen2_5_omni.yaml",
                        ExpandOptions())
    paths = {
        "mooncake": expand_to(d, "mooncake", q3, "qwen3_omni_moe.yaml", ExpandOptions(stream=False)),
        "nixl": expand_to(d, "nixl", q3, "qwen3_omni_moe.yaml", ExpandOptions(connector="NixlConnector", stream=False)),
        "tp2": expand_to(d, "tp2", q3, "qwen3_omni_moe.yaml", ExpandOptions(tp=2, stream=False)),
        "qwen2_5_omni": q25,
        "thinker_only": expand_to(d, "thinker_only", (wheel / "qwen3_omni_moe_thinking.yaml").read_text(),
                                  "qwen3_omni_moe_thinking.yaml", ExpandOptions()),
    }
    model_type = {"qwen2_5_omni": "qwen2_5_omni"}
    files = [{"name": n, "path": str(p), "model_type": model_type.get(n, "qwen3_omni_moe")} for n, p in paths.items()]
    spec = d / "spec.json"
    flows = [f for f in files if f["name"] in FLOWS]
    flows += [{**next(f for f in files if f["name"] == src), "name": name, "prefill_replicas": n, "requests": k}
              for name, (src, n, k) in MORE_FLOWS.items()]
    spec.write_text(json.dumps({"files": files, "flows": flows}))
    return run_probe(spec), run_probe(spec, OMNI_PD_VLLM_OMNI_COMPAT="0")


# --- gate and install order ---------------------------------------------------------


def test_gate_on_the_real_vllm_omni_patches_nothing_for_another_release_a_changed_signature_or_env_off(probes):
    g = probes[0]["gate"]
    assert g["other_release"] == ["not-needed", NONE_PATCHED]
    status, problems, state, log = g["changed_signature"]
    assert (status, state) == ("refused", NONE_PATCHED)
    assert problems == ["vllm_omni.entrypoints.pd_utils:PDDisaggregationMixin._validate_pd_separation_config: "
                        "signature (self), omni-pd expects (self, strict)"]
    assert [lvl for lvl, _ in log] == ["WARNING"] and "NOT installed, nothing patched" in log[0][1]
    assert g["env_off"] == ["off", NONE_PATCHED,
                            [["INFO", "omni-pd: vllm-omni PD compatibility layer off (OMNI_PD_VLLM_OMNI_COMPAT=off)"]]]


def test_serve_parser_installs_the_layer_through_vllms_plugin_loader_before_any_detection(probes):
    """`vllm serve --omni` builds its parser (vLLM loads `vllm.general_plugins`) before
    `AsyncOmni` exists; a recorder around the raw detector sees the layer at every call."""
    o = probes[0]["order"]
    assert (o["before"], o["after"]) == (NONE_PATCHED, ALL_PATCHED)
    assert o["log"] == [["INFO", ON_LINE]]
    # the whole process: the gate's two explicit calls, the one startup line, then one
    # line per engine start saying where the bootstrap address came from
    installs = [m for m in probes[0]["compat_log"] if m[1].startswith("omni-pd: vllm-omni")]
    assert [lvl for lvl, _ in installs] == ["WARNING", "INFO", "INFO"] and installs[-1] == ["INFO", ON_LINE]
    others = {m[1] for m in probes[0]["compat_log"] if m not in installs}
    addrs = {r["engine_pd_config"]["bootstrap_addr"] for r in probes[0]["files"].values()} - {None}
    assert others == {f"omni-pd compat: PD bootstrap address {a} (prefill stage-0 client's kv_connector_extra_config)"
                      for a in addrs} and addrs
    assert o["omni_group_loaded_by_parser"] is False
    assert o["log_after_omni_group"] == []  # vllm-omni's own group later: installs nothing twice
    assert o["layers"] == ["pd_detect", None]  # one wrapper, around the raw function
    assert o["detector_calls"] == 0
    assert o["detector_calls_total"] > 0 and o["all_detector_calls_saw_the_layer"] is True


def test_env_switch_off_in_a_fresh_process_patches_nothing(probes):
    o = probes[1]["order"]
    assert probes[1]["env"] == "0"
    assert o["after"] == NONE_PATCHED
    # one line for the whole process, though plugins were loaded many times
    # (the second line is the probe's own gate check with the value "off")
    assert probes[1]["compat_log"] == [
        ["INFO", "omni-pd: vllm-omni PD compatibility layer off (OMNI_PD_VLLM_OMNI_COMPAT=0)"],
        ["INFO", "omni-pd: vllm-omni PD compatibility layer off (OMNI_PD_VLLM_OMNI_COMPAT=off)"]]


# --- serve-path resolution ----------------------------------------------------------


@pytest.mark.parametrize("name", list(FILES))
def test_typed_configs_detect_validate_and_rewrite_prefill_with_the_layer(probes, name):
    connector, tp, pipeline, n = FILES[name]
    r = probes[0]["files"][name]
    assert r["pipeline"] == pipeline
    assert r["types"][:2] == ["VllmOmniARStageConfig", "VllmOmniARStageConfig"] and len(r["types"]) == n
    assert r["typed_has_engine_args"] is False  # nothing added to upstream's stage configs
    assert r["detect"] == [0, 1]
    assert r["init_pd_state"]["pair"] == [0, 1]
    assert r["prefill_sp"] == {"max_tokens": 1, "min_tokens": 1, "stop": [], "stop_token_ids": [],
                               "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                                      "transfer_id": "xfer-req-1"}}
    assert [kv and kv["kv_role"] for kv in r["replica_kv"][:2]] == ["kv_producer", "kv_consumer"]
    assert {kv["kv_connector"] for kv in r["replica_kv"][:2]} == {connector}


@pytest.mark.parametrize("name", list(FILES))
def test_raw_upstream_detector_still_misses_typed_configs(probes, name):
    """Canary: fails when vllm-omni detects PD on typed configs by itself. Then the
    layer's pd_detect/pd_validate/pd_connector_info rows can leave the 0.30 successor's
    list in presets/targets/vllm_omni_compat.yaml (docs/upstream/README.md)."""
    assert probes[0]["files"][name]["raw_detect"] is None


REPRO = ROOT / "docs" / "upstream" / "repro_pd_detection.py"
DETECTION_DRAFT = ROOT / "docs" / "upstream" / "vllm-omni-0.30-pd-detection.md"
#: runs the reproducer as ``__main__``, then says whether any omni_pd module got imported
RUN_REPRO = """
import runpy, sys
try:
    runpy.run_path(sys.argv[1], run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
print("OMNI-PD-MODULES", sorted(m for m in sys.modules if m.split(".")[0] == "omni_pd"))
"""
LOG_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR) \d\d-\d\d ")


def draft_output_block(text: str) -> list[str]:
    """The first ```text block of the issue draft: the reproducer's output as pasted."""
    start = text.index("```text\n") + len("```text\n")
    return text[start:text.index("```", start)].splitlines()


def test_upstream_only_reproducer_prints_what_the_detection_draft_shows():
    """Canary with no omni-pd in the process: docs/upstream/repro_pd_detection.py (vllm-omni
    and vLLM only, vLLM plugins off) prints, line for line, the output pasted in the issue
    draft, ending in the detector's ``None`` on typed stage configs. Fails when upstream
    starts detecting PD there (then see docs/upstream/README.md, "When upstream fixes it")
    or when the draft no longer shows what the script prints."""
    proc = subprocess.run([ORACLE, "-c", RUN_REPRO, str(REPRO)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env={**os.environ, "VLLM_PLUGINS": "", "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [x for x in proc.stdout.splitlines() if not LOG_LINE.match(x)]
    assert lines[-1] == "OMNI-PD-MODULES []"
    printed = lines[:-1]
    assert printed[-3:] == [
        "detect_pd_separation_from_stage_configs(typed stage configs) -> None",
        "detect_pd_separation_from_stage_configs(legacy-named views of the same fields) -> (0, 1)",
        "_validate_pd_separation_config(typed stage configs, pair (0, 1)) -> AttributeError: "
        "'VllmOmniARStageConfig' object has no attribute 'engine_args'"]
    assert printed == draft_output_block(DETECTION_DRAFT.read_text())


@pytest.mark.parametrize("name", [n for n, f in FILES.items() if f[0] == "MooncakeConnector"])
def test_engine_bootstrap_address_is_the_one_the_runtime_writes_and_decode_params_are_complete(probes, name):
    r = probes[0]["files"][name]
    prefill_kv = r["replica_kv"][0]
    written = prefill_kv["kv_connector_extra_config"]["bootstrap_addr"]
    port = prefill_kv["kv_connector_extra_config"]["bootstrap_port"]
    assert written == f"http://127.0.0.1:{port}"
    assert r["replica_env"][0] == {"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(port)}
    assert r["engine_pd_config"] == {"pd_pair": [0, 1], "bootstrap_addr": written,
                                     "prefill_engine_id": prefill_kv["engine_id"]}
    assert prefill_kv["engine_id"].endswith("-s0-r0")
    assert r["decode_kv_params"] == {"transfer_id": "xfer-req-1", "remote_bootstrap_addr": written,
                                     "remote_engine_id": prefill_kv["engine_id"], "num_transfer_tokens": 12,
                                     "remote_request_id": "req-1", "do_remote_prefill": True,
                                     "do_remote_decode": False}


def test_nixl_decode_params_are_what_the_prefill_engine_returned(probes):
    r = probes[0]["files"]["nixl"]
    engine_id = r["replica_kv"][0]["engine_id"]
    assert r["engine_pd_config"] == {"pd_pair": [0, 1], "bootstrap_addr": None, "prefill_engine_id": engine_id}
    assert r["decode_kv_params"] == {
        "transfer_id": "xfer-req-1", "remote_engine_id": engine_id, "do_remote_prefill": True,
        "do_remote_decode": False, "remote_block_ids": [0, 1], "remote_request_id": "req-1",
        "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1, "dcp_size": 1, "pp_size": 1,
        "remote_num_tokens": 12}


@pytest.mark.parametrize("name", list(FILES))
def test_without_the_layer_pd_never_switches_on(probes, name):
    r = probes[1]["files"][name]
    assert r["detect"] is None and r["init_pd_state"] == {"pair": None, "connector_info": None}
    assert r["prefill_sp"]["max_tokens"] == 2048 and r["prefill_sp"]["kv_transfer_params"] is None
    assert r["engine_pd_config"] is None


# --- the request through vllm-omni's orchestrator -----------------------------------


def pd_flow_problems(flow: dict) -> list[str]:
    """What is wrong with one request's flow for prefill/decode disaggregation; [] when
    prefill ran one token and handed KV params over, decode got the original prompt and
    those params, the Talker got decode's output and the client decode's text."""
    p, d, talker = (flow["stages"][i] for i in range(3))
    eos = flow["answer_eos"]
    problems = []
    if [r["max_tokens"] for r in p] != [1]:
        problems.append(f"prefill ran with max_tokens {[r['max_tokens'] for r in p]}, not 1")
    if len(d) != 1 or d[0]["prompt_token_ids"] != flow["prompt_token_ids"]:
        problems.append(f"decode's prompt is {[r['prompt_token_ids'] for r in d]}, not the original prompt")
    kv = (d[0]["kv_transfer_params"] or {}) if d else {}
    if not kv.get("do_remote_prefill"):
        problems.append("decode got no remote-prefill kv_transfer_params")
    if [r["prompt_token_ids"] for r in talker] != [flow["answer"] + [eos]]:
        problems.append("the Talker did not get decode's answer")
    text = [c["text"].strip() for c in flow["client"] if c.get("stage_id") == 1]
    if text != [flow["answer_text"]]:
        problems.append(f"the client got {text}, not decode's answer {flow['answer_text']!r}")
    return problems


@pytest.mark.parametrize("name", FLOWS)
def test_request_flow_is_prefill_then_decode_with_the_layer(probes, name):
    f = probes[0]["flows"][name]
    assert pd_flow_problems(f) == []
    assert f["stages"][0][0]["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False,
                                                       "transfer_id": "xfer-req-flow-1"}
    kv = f["stages"][1][0]["kv_transfer_params"]
    engine_id = f["pd_config"]["prefill_engine_id"]
    if name == "mooncake":  # what vLLM 0.30's MooncakeConnector reads on the decode side
        assert {k: kv[k] for k in ("remote_engine_id", "remote_bootstrap_addr", "transfer_id")} == {
            "remote_engine_id": engine_id, "remote_bootstrap_addr": f["pd_config"]["bootstrap_addr"],
            "transfer_id": "xfer-req-flow-1"}
        assert f["pd_config"]["bootstrap_addr"].startswith("http://127.0.0.1:")
    else:  # NIXL: the params its prefill side returned, passed through
        assert kv["remote_engine_id"] == engine_id and kv["remote_request_id"] == "req-flow-1"
        assert kv["remote_block_ids"] == [0, 1] and kv["remote_host"] == "127.0.0.1"
    assert f["client"][-1]["stage_id"] == 3 and f["client"][-1]["finished"] is True


def test_mooncake_decode_pulls_from_the_prefill_replica_that_ran_the_request(probes):
    """Two prefill replicas (ports bootstrap_port + r, engine ids ...-s0-r{r}, as the
    runtime writes them): each request's decode params name the replica that ran it."""
    f = probes[0]["flows"]["mooncake_2p"]
    reps = f["prefill_replicas"]
    assert [(r["replica"], r["requests"]) for r in reps] == [(0, ["req-flow-1"]), (1, ["req-flow-2"])]
    port0 = int(reps[0]["bootstrap_addr"].rsplit(":", 1)[1])
    assert reps[1]["bootstrap_addr"] == f"http://127.0.0.1:{port0 + 1}"
    assert reps[1]["engine_id"] == reps[0]["engine_id"][:-1] + "1"
    kv = {d["request_id"]: d["kv_transfer_params"] for d in f["stages"][1]}
    got = {rid: (p["remote_bootstrap_addr"], p["remote_engine_id"]) for rid, p in kv.items()}
    assert got == {r["requests"][0]: (r["bootstrap_addr"], r["engine_id"]) for r in reps}
    for req in f["requests"]:
        assert [c["text"].strip() for c in req["client"] if c.get("stage_id") == 1] == [req["answer_text"]]


@pytest.mark.parametrize("name", FLOWS)
def test_without_the_layer_the_thinker_runs_twice(probes, name):
    """The same request with OMNI_PD_VLLM_OMNI_COMPAT=0: the check above fails, because
    prefill generates a whole answer and decode continues from prefill's tokens."""
    f = probes[1]["flows"][name]
    answer = f["answer"] + [f["answer_eos"]]
    assert f["pd_config"] is None
    assert pd_flow_problems(f) == [
        "prefill ran with max_tokens [2048], not 1",
        f"decode's prompt is {[answer]}, not the original prompt",
        "decode got no remote-prefill kv_transfer_params",
        "the Talker did not get decode's answer",
        f"the client got {[f['twice_text']]}, not decode's answer {f['answer_text']!r}",
    ]


# --- the offline `Omni` path -------------------------------------------------------

OFFLINE = """
import json, logging, sys, tempfile
from pathlib import Path
logging.disable(logging.WARNING)
from omni_pd.upstream.vllm_oracle import _install_standins
_install_standins()
from vllm_omni.entrypoints.omni import Omni  # noqa: F401 - what `from vllm_omni import Omni` imports
from vllm_omni.config.config_factory import StageConfigFactory
from omni_pd.upstream.vllm_omni_compat import installed
tmp = tempfile.mkdtemp()
Path(tmp, "config.json").write_text(json.dumps({"model_type": "qwen3_omni_moe"}))
def resolve():  # OmniEngineBase.__init__'s first step
    try:
        return StageConfigFactory.get_pipeline_config(model=tmp, trust_remote_code=False,
                                                      deploy_config_path=sys.argv[1]).model_type
    except Exception as e:
        return type(e).__name__
out = {"before": [resolve(), sorted(k for k, v in installed().items() if v)]}
from vllm_omni.engine.stage_init_utils import prepare_engine_environment
prepare_engine_environment()  # StageRuntime._prepare_stage_plans' first call, before any PD detection
out["after_stage_setup"] = [resolve(), sorted(k for k, v in installed().items() if v)]
print("OFFLINE " + json.dumps(out))
"""


def test_offline_omni_installs_the_layer_before_detection_but_resolves_the_pipeline_too_early():
    """Offline ``Omni``: nothing loads plugins before ``OmniEngineBase.__init__`` resolves
    ``pipeline:``, so a ``*_pd`` deploy file needs ``vllm.plugins.load_general_plugins()``
    first (README, docs/upstream/README.md). Detection runs after
    ``StageRuntime._prepare_stage_plans`` -> ``prepare_engine_environment`` loads the
    plugin groups, which installs the layer on every path that starts an engine."""
    proc = subprocess.run([ORACLE, "-c", OFFLINE, str(ROOT / "tests" / "golden" / "qwen3_omni_moe_pd.yaml")],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("OFFLINE "))[len("OFFLINE "):])
    assert got == {"before": ["KeyError", []], "after_stage_setup": ["qwen3_omni_moe_pd", sorted(PATCHES)]}
