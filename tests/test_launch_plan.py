"""Launch plans (issue 5): exact argv, env, ports and health URLs, built from compiled
configs without starting anything."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omni_pd.compile.expand import expand_document
from omni_pd.diagnostics import OmniPdError
from omni_pd.io import load_file, parse_text
from omni_pd.launch.plan import LaunchOptions, engine_flags, plan_document
from omni_pd.launch.router.sizing import default_workers
from omni_pd.launch.spec import LaunchPlan
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.resources import preset_path

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"


def compiled(tmp_path: Path, src: Path, opts: ExpandOptions, pipeline: str | None = None) -> Path:
    res = expand_document(parse_text(src.read_text(), src.name), opts, pipeline=pipeline)
    out = tmp_path / "pd.yaml"
    out.write_text(res.text)
    return out


def plan_of(path: Path, **kw) -> LaunchPlan:
    planned = plan_document(load_file(path), str(path), LaunchOptions(**kw))
    assert planned.plan is not None, [d.message for d in planned.validation.diagnostics]
    return planned.plan


def ports(p) -> list[tuple[int, str]]:
    return [(u.port, u.purpose) for u in p.ports]


@pytest.mark.parametrize("connector,kv_ports", [
    ("MooncakeConnector", [(25201, "Mooncake bootstrap")]),  # decode (kv_consumer) binds no bootstrap port
    ("NixlConnector", [(5600, "NIXL side channel"), (5601, "NIXL side channel")]),
])
def test_vllm_omni_runtime_is_one_omni_serve_of_the_compiled_file(tmp_path, connector, kv_ports):
    cfg = compiled(tmp_path, preset_path("qwen3_omni_moe"), ExpandOptions(connector=connector))
    plan = plan_of(cfg, model="Qwen/Qwen3-Omni-30B-A3B-Instruct", vllm="/opt/venv/bin/vllm")
    assert plan.runtime == "vllm-omni" and plan.connector == connector
    assert plan.entrypoint == "http://127.0.0.1:8000"
    (p,) = plan.processes
    assert p.argv == ("/opt/venv/bin/vllm", "serve", "Qwen/Qwen3-Omni-30B-A3B-Instruct", "--omni",
                      "--deploy-config", str(cfg), "--host", "127.0.0.1", "--port", "8000",
                      "--served-model-name", "Qwen/Qwen3-Omni-30B-A3B-Instruct")
    assert dict(p.env) == {}
    assert ports(p) == [(8000, "http")] + kv_ports
    assert p.health.url == "http://127.0.0.1:8000/health" and p.health.timeout_s == 1200.0
    assert p.modules == ("vllm", "mooncake.engine" if connector == "MooncakeConnector" else "nixl", "vllm_omni", "omni_pd")
    assert p.python == "/opt/venv/bin/python"


def test_single_llm_1p1d_nixl_plan(tmp_path):
    cfg = compiled(tmp_path, LLM, ExpandOptions(connector="NixlConnector", kv_buffer_device="cpu"), "llm")
    plan = plan_of(cfg, model="/models/tiny", platform="cpu", env={"HF_TOKEN": "hf_abcdef"})
    assert plan.runtime == "vllm"
    pre, dec, router = plan.processes
    assert pre.argv == ("vllm", "serve", "/models/tiny", "--host", "127.0.0.1", "--port", "8100",
                        "--served-model-name", "/models/tiny", "--kv-transfer-config",
                        '{"kv_connector":"NixlConnector","engine_id":"llm-prefill","kv_buffer_device":"cpu",'
                        '"kv_role":"kv_producer","kv_connector_extra_config":{"kv_lease_duration":480}}',  # cpu lease
                        "--max-model-len", "1024", "--enforce-eager", "--no-async-scheduling", "--dtype", "float32")
    assert dict(pre.env) == {"HF_TOKEN": "hf_abcdef", "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                             "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"}
    assert dec.argv[6:11] == ("8200", "--served-model-name", "/models/tiny", "--kv-transfer-config",
                              '{"kv_connector":"NixlConnector","engine_id":"llm-decode","kv_buffer_device":"cpu",'
                              '"kv_role":"kv_consumer","kv_connector_extra_config":{"kv_lease_duration":480}}')
    assert "--no-async-scheduling" not in dec.argv
    assert dec.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    assert pre.device_env is None and dec.device_env is None  # cpu: no device selection
    assert ports(pre) == [(8100, "http"), (5600, "NIXL side channel")]
    assert ports(dec) == [(8200, "http"), (5601, "NIXL side channel")]
    assert router.argv == (sys.executable, "-m", "omni_pd.launch.router", "--connector", "NixlConnector",
                           "--host", "127.0.0.1", "--port", "8000", "--workers", str(default_workers()),
                           "--prefill", "http://127.0.0.1:8100", "--decode", "http://127.0.0.1:8200")
    assert router.depends_on == ("prefill-0", "decode-0")
    assert [p.health.url for p in plan.processes] == ["http://127.0.0.1:8100/health", "http://127.0.0.1:8200/health",
                                                      "http://127.0.0.1:8000/health"]
    shown = plan.to_json()
    assert shown["processes"][0]["env"]["HF_TOKEN"] == "***"
    assert "hf_abcdef" not in json.dumps(shown)


def test_single_llm_1p1d_mooncake_plan_on_cuda(tmp_path):
    cfg = compiled(tmp_path, LLM, ExpandOptions(), "llm")
    plan = plan_of(cfg, model="m", port=9000, engine_port_base=9100)
    pre, dec, router = plan.processes
    kv = json.loads(pre.argv[pre.argv.index("--kv-transfer-config") + 1])
    # plain vLLM reads only the env variable: no extra-config key for the port
    assert kv == {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer", "engine_id": "llm-prefill",
                  "kv_ip": "127.0.0.1"}
    assert dict(pre.env) == {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "25201", "CUDA_VISIBLE_DEVICES": "0"}
    assert dict(dec.env) == {"CUDA_VISIBLE_DEVICES": "1"}
    assert ports(dec) == [(9200, "http")]
    assert (pre.devices, dec.devices) == ("0", "1")
    assert ports(pre) == [(9100, "http"), (25201, "Mooncake bootstrap")]
    assert router.argv[-4:] == ("--prefill", "http://127.0.0.1:9100,25201", "--decode", "http://127.0.0.1:9200")


@pytest.mark.parametrize("replicas", [1, 3])
@pytest.mark.parametrize("tp", [1, 2])
def test_vllm_omni_preflight_lists_the_ports_each_prefill_replica_binds(tmp_path, replicas, tp):
    # vllm-omni 0.30 binds bootstrap_port + r on prefill replica r (stage_runtime.py
    # _prepare_replica_vllm_config); vLLM >= 0.18 runs one bootstrap server per engine, whatever its TP
    src = tmp_path / "qwen3_omni_moe.yaml"
    src.write_text(preset_path("qwen3_omni_moe").read_text().replace(
        "    devices: \"0\"\n", f"    devices: \"0\"\n    num_replicas: {replicas}\n", 1))
    cfg = compiled(tmp_path, src, ExpandOptions(tp=tp))
    (p,) = plan_of(cfg, model="m").processes
    want = [(25201 + r, "Mooncake bootstrap" + (f" replica {r}" if replicas > 1 else "")) for r in range(replicas)]
    assert ports(p) == [(8000, "http")] + want


def _pd_file(tmp_path, prefill_kv_extra: str, prefill_env: str = "", replicas: int = 1) -> Path:
    f = tmp_path / "hand.yaml"
    f.write_text(
        "pipeline: qwen3_omni_moe_pd\nasync_chunk: false\nstages:\n"
        f"  - {{stage_id: 0, devices: \"0\", num_replicas: {replicas}, async_scheduling: false,{prefill_env}"
        " kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p"
        f"{prefill_kv_extra}}}}}\n"
        "  - {stage_id: 1, devices: \"1\", kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_consumer,"
        " engine_id: d}}\n")
    return f


def test_vllm_omni_preflight_reads_the_key_the_runtime_reads_not_the_env(tmp_path):
    from omni_pd.io import load_file as lf
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.targets import target
    from omni_pd.compile.topology import resolve
    from omni_pd.launch.plan import build_plan

    def plan_ports(f):
        doc = lf(f)
        topo = resolve(parse_config(doc), load_catalogue().get("qwen3_omni_moe_pd"), None, doc)
        (p,) = build_plan(topo, str(f), LaunchOptions(model="m"), target("0.30")).processes
        return ports(p)[1:]

    # bootstrap_port decides; an env value in the file would be overwritten by vllm-omni
    assert plan_ports(_pd_file(tmp_path, ", kv_connector_extra_config: {bootstrap_port: 26000}",
                               " env: {VLLM_MOONCAKE_BOOTSTRAP_PORT: \"25201\"},", replicas=2)) == [
        (26000, "Mooncake bootstrap replica 0"), (26001, "Mooncake bootstrap replica 1")]
    # neither set: vllm-omni's default 8998 (not vLLM's env default read from this process)
    assert plan_ports(_pd_file(tmp_path, "")) == [
        (8998, "Mooncake bootstrap (kv_connector_extra_config.bootstrap_port default)")]
    # a recipe key nothing reads does not move the port
    assert plan_ports(_pd_file(tmp_path, ", kv_connector_extra_config: {mooncake_bootstrap_port: 25201}")) == [
        (8998, "Mooncake bootstrap (kv_connector_extra_config.bootstrap_port default)")]


def test_engine_flags_spelling():
    assert engine_flags({"max_num_seqs": 8, "enforce_eager": True, "enable_prefix_caching": False,
                         "compilation_config": {"level": 0}, "devices": "0", "env": {"A": "1"},
                         "kv_transfer_config": {"kv_role": "kv_producer"}, "quantization": None}) == [
        "--max-num-seqs", "8", "--enforce-eager", "--no-enable-prefix-caching",
        "--compilation-config", '{"level":0}']


def test_secret_argv_is_masked():
    from omni_pd.launch.spec import ProcessSpec

    p = ProcessSpec(name="x", argv=("vllm", "serve", "m", "--api-key", "sk-123", "--hf-token=abc", "--port", "1"))
    assert p.masked_argv() == ["vllm", "serve", "m", "--api-key", "***", "--hf-token=***", "--port", "1"]


def test_a_three_stage_config_is_refused_with_the_expand_hint():
    with pytest.raises(OmniPdError) as e:
        plan_document(load_file(LLM), str(LLM), LaunchOptions(model="m"))
    assert e.value.diagnostic.code == "OPD966"
    assert "omni-pd expand" in e.value.diagnostic.help


def test_dry_run_cli_prints_json_and_starts_nothing(tmp_path):
    cfg = compiled(tmp_path, LLM, ExpandOptions(connector="NixlConnector"), "llm")
    r = subprocess.run([sys.executable, "-m", "omni_pd.cli", "launch", str(cfg), "--model", "m", "--dry-run",
                        "--format", "json", "--vllm", "/nonexistent/vllm"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert [p["name"] for p in json.loads(r.stdout)["processes"]] == ["prefill-0", "decode-0", "router"]


@pytest.mark.parametrize("stage_port, clash", [
    # decode's side channel on the router's port (two processes)
    ('"5601"', "error[OPD510]: port 8000 on the shared host is planned for both decode-0 (NIXL side channel) "
               "and router (http, --port 8000)\n"),
    # prefill's side channel on its own HTTP port (one process, two listeners)
    ('"5600"', None),
])
def test_dry_run_reports_a_port_the_plan_uses_twice(tmp_path, stage_port, clash):
    """Launch refused these with preflight's OPD960 ("give each process its own port", no
    key); validate's OPD510 judges the same port plan first and names the key (issue 35
    item 7), so launch stops there."""
    cfg = compiled(tmp_path, LLM, ExpandOptions(connector="NixlConnector"), "llm")
    text = cfg.read_text()
    assert f"VLLM_NIXL_SIDE_CHANNEL_PORT: {stage_port}" in text
    new = "8000" if clash else "8100"
    cfg.write_text(text.replace(f"VLLM_NIXL_SIDE_CHANNEL_PORT: {stage_port}", f'VLLM_NIXL_SIDE_CHANNEL_PORT: "{new}"'))
    r = subprocess.run([sys.executable, "-m", "omni_pd.cli", "launch", str(cfg), "--model", "m", "--dry-run",
                        "--vllm", "/nonexistent/vllm"], capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    expect = clash or ("error[OPD510]: port 8100 on the shared host is planned for both prefill-0 (http, "
                       "--engine-port-base 8100) and prefill-0 (NIXL side channel)\n")
    assert r.stdout.startswith(expect), r.stdout
    stage = 1 if clash else 0
    assert (f"   = help: set env VLLM_NIXL_SIDE_CHANNEL_PORT of stage {stage} to a port no other process on the "
            f"shared host uses, e.g. {int(new) + 1}\n{cfg}: not launched (1 error, 0 warnings, 0 info)\n") in r.stdout
    assert "OPD960" not in r.stdout


def test_validation_errors_stop_the_launch(tmp_path):
    cfg = compiled(tmp_path, LLM, ExpandOptions(), "llm")
    cfg.write_text(cfg.read_text().replace("kv_role: kv_consumer", "kv_role: kv_producer"))
    r = subprocess.run([sys.executable, "-m", "omni_pd.cli", "launch", str(cfg), "--model", "m", "--dry-run"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert "error[OPD302]" in r.stdout and "not launched" in r.stdout


def test_preflight_reports_a_taken_port_and_a_missing_executable(tmp_path):
    import socket

    from omni_pd.launch.preflight import preflight

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    taken = s.getsockname()[1]
    try:
        cfg = compiled(tmp_path, LLM, ExpandOptions(connector="NixlConnector"), "llm")
        plan = plan_of(cfg, model="m", vllm="/nonexistent/vllm", port=taken, platform="cpu")
        diags = preflight(plan, "cpu")
    finally:
        s.close()
    msgs = [(d.code, d.message) for d in diags]
    assert ("OPD961", "prefill-0: executable `/nonexistent/vllm` not found") in msgs
    assert ("OPD962", "interpreter `/nonexistent/python` not found, so nixl, vllm cannot be checked") in msgs
    assert any(c == "OPD960" and m.startswith(f"port {taken} on 127.0.0.1 (router http) cannot be bound: EADDRINUSE")
               for c, m in msgs), msgs


def test_preflight_device_checks_use_the_gpu_inventory(tmp_path):
    from omni_pd.launch.preflight import check_devices

    cfg = compiled(tmp_path, LLM, ExpandOptions(prefill_devices=(0,), decode_devices=(3,)), "llm")
    plan = plan_of(cfg, model="m")
    assert [p.memory_fraction for p in plan.processes[:2]] == [0.9, 0.9]  # vLLM's default, none in the file
    gib = 1024
    diags = check_devices(plan, "cuda", inventory=[(0, 80 * gib, 10 * gib)])
    assert [(d.code, d.message) for d in diags] == [
        ("OPD963", "decode-0 is given GPU 3, this machine has [0]"),
        ("OPD964", "GPU 0: engines ask 72.0 GiB, 10.0 GiB of 80.0 GiB is free")]


def test_thinker_only_pipelines_launch_plain_vllm_engines_behind_the_router(tmp_path):
    # vLLM maps Qwen3OmniMoeForConditionalGeneration / Qwen2_5OmniForConditionalGeneration to their
    # Thinker classes (vllm/model_executor/models/registry.py), so a thinker-only PD pair is two plain
    # `vllm serve` engines + the router; the pipeline stays vllm-omni's (its `_pd` variant is registered)
    from omni_pd.compile.pipelines import load_catalogue

    cat = load_catalogue()
    for name in ("qwen3_omni_moe_thinker_only", "qwen2_5_omni_thinker_only"):
        for p in (cat.get(name), cat.get(name + "_pd")):
            assert (p.runtime, p.launcher) == ("vllm-omni", "vllm"), p.name
    assert cat.get("qwen3_omni_moe_pd").launcher == "vllm-omni"
    src = ROOT / "tests" / "fixtures" / "qwen3_omni_moe_thinker_only_cpu.yaml"
    cfg = compiled(tmp_path, src, ExpandOptions(connector="NixlConnector", kv_buffer_device="cpu"))
    plan = plan_of(cfg, model="/models/q3o", platform="cpu", served_model_name="tiny")
    assert plan.runtime == "vllm" and plan.entrypoint == "http://127.0.0.1:8000"
    pre, dec, router = plan.processes
    assert pre.argv == ("vllm", "serve", "/models/q3o", "--host", "127.0.0.1", "--port", "8100",
                        "--served-model-name", "tiny", "--kv-transfer-config",
                        '{"kv_connector":"NixlConnector","engine_id":"omni-thinker-prefill","kv_buffer_device":"cpu",'
                        '"kv_role":"kv_producer","kv_connector_extra_config":{"kv_lease_duration":480}}',  # cpu lease
                        "--max-num-seqs", "4", "--max-model-len", "2048", "--enforce-eager", "--no-async-scheduling",
                        "--dtype", "float32")
    assert dec.argv[:11] == ("vllm", "serve", "/models/q3o", "--host", "127.0.0.1", "--port", "8200",
                             "--served-model-name", "tiny", "--kv-transfer-config",
                             '{"kv_connector":"NixlConnector","engine_id":"omni-thinker-decode",'
                             '"kv_buffer_device":"cpu","kv_role":"kv_consumer",'
                             '"kv_connector_extra_config":{"kv_lease_duration":480}}')
    assert dict(pre.env) == {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"}
    assert pre.modules == dec.modules == ("vllm", "nixl")  # no vllm_omni needed in the engines' env
    assert router.argv[2:] == ("omni_pd.launch.router", "--connector", "NixlConnector", "--host", "127.0.0.1",
                               "--port", "8000", "--workers", str(default_workers()), "--prefill",
                               "http://127.0.0.1:8100", "--decode", "http://127.0.0.1:8200")


def test_single_llm_engines_get_the_pipeline_wide_deploy_keys(tmp_path):
    """Top-level deploy keys reach every stage's engine (vllm-omni config/stage_config.py
    ``_build_engine_args``: ``_PIPELINE_WIDE_ENGINE_FIELDS`` first, stage keys override);
    the plain-vLLM runtime must pass them as ``vllm serve`` flags (issue 16)."""
    src = tmp_path / "llm.yaml"
    src.write_text("trust_remote_code: true\ndtype: bfloat16\nquantization: fp8\ndata_parallel_size: 2\n"
                   "stages:\n  - stage_id: 0\n    max_model_len: 1024\n")
    cfg = compiled(tmp_path, src, ExpandOptions(), "llm")
    pre, dec, _ = plan_of(cfg, model="m").processes
    assert (pre.devices, dec.devices) == ("0,1", "2,3")  # expand sized both for DP 2
    kv = pre.argv.index("--kv-transfer-config") + 2
    assert pre.argv[kv:] == ("--trust-remote-code", "--dtype", "bfloat16", "--quantization", "fp8",
                             "--data-parallel-size", "2", "--max-model-len", "1024", "--no-async-scheduling",
                             "--data-parallel-rpc-port", "8400")
    kv = dec.argv.index("--kv-transfer-config") + 2
    assert dec.argv[kv:] == ("--trust-remote-code", "--dtype", "bfloat16", "--quantization", "fp8",
                             "--data-parallel-size", "2", "--max-model-len", "1024", "--data-parallel-rpc-port", "8500")


def test_a_stage_key_overrides_the_pipeline_wide_key(tmp_path):
    src = tmp_path / "llm.yaml"
    src.write_text("dtype: bfloat16\ntrust_remote_code: true\n"
                   "stages:\n  - stage_id: 0\n    dtype: float32\n    trust_remote_code: false\n")
    cfg = compiled(tmp_path, src, ExpandOptions(), "llm")
    pre, dec, _ = plan_of(cfg, model="m").processes
    for p in (pre, dec):
        flags = p.argv[p.argv.index("--kv-transfer-config") + 2:]
        assert flags[:3] == ("--no-trust-remote-code", "--dtype", "float32")
        assert "bfloat16" not in flags and "--trust-remote-code" not in flags


def test_launch_plan_leaves_out_exactly_the_deploy_only_keys():
    from omni_pd.check.serve_flags import DEPLOY_ONLY_KEYS
    from omni_pd.launch import plan

    assert plan.NON_ENGINE_KEYS is DEPLOY_ONLY_KEYS


# --- ports from options are TCP ports (issue 16: --engine-port-base 65500 planned 65600, preflight exit 3) ---

@pytest.mark.parametrize("args,option,value", [
    (["--engine-port-base", "70000"], "--engine-port-base", "70000"),
    (["--engine-port-base", "0"], "--engine-port-base", "0"),
    (["--port", "65536"], "--port", "65536"),
    (["--port", "-1"], "--port", "-1"),
])
def test_launch_refuses_a_port_option_outside_the_tcp_range(tmp_path, capsys, args, option, value):
    from omni_pd.cli import main

    cfg = compiled(tmp_path, LLM, ExpandOptions(), "llm")
    rc = main(["launch", str(cfg), "--model", "m", "--dry-run", *args])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "")
    assert err == (f"error[OPD006]: {option} {value}: not a TCP port (1..65535)\n"
                   f"  = help: pass {option} with a port from 1 to 65535\n")


def test_expand_refuses_a_port_base_outside_the_tcp_range(tmp_path, capsys):
    from omni_pd.cli import main

    out_file = tmp_path / "pd.yaml"
    rc = main(["expand", str(LLM), "--pipeline", "llm", "--port-base", "70000", "-o", str(out_file)])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "")
    assert err == ("error[OPD006]: --port-base 70000: not a TCP port (1..65535)\n"
                   "  = help: pass --port-base with a port from 1 to 65535\n")
    assert not out_file.exists()


def test_an_engine_port_base_whose_decode_port_overflows_is_a_plan_error(tmp_path, capsys):
    from omni_pd.cli import main

    cfg = compiled(tmp_path, LLM, ExpandOptions(), "llm")
    with pytest.raises(OmniPdError) as e:
        plan_of(cfg, model="m", engine_port_base=65500)
    d = e.value.diagnostic
    assert (d.code, e.value.exit_code) == ("OPD006", 2)
    assert d.message == "--engine-port-base 65500: decode-0 would listen on HTTP port 65600, above 65535"
    assert d.help == ("pass --engine-port-base 65435 or lower (prefill instances listen on it +0.., "
                      "decode on +100.., the encoder on +200)")
    assert plan_of(cfg, model="m", engine_port_base=65435).process("decode-0").ports[0].port == 65535
    rc = main(["launch", str(cfg), "--model", "m", "--engine-port-base", "65500"])  # not --dry-run: preflight too
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "")
    assert err.startswith("error[OPD006]: --engine-port-base 65500: decode-0 would listen on HTTP port 65600")


@pytest.mark.parametrize("name,port,message,help", [
    ("prefill-0", 65536, "{cfg}: prefill-0 would bind NIXL side channel port 65536 (from the config), outside 1..65535",
     "re-run `omni-pd expand` with a lower --port-base"),
    ("router", 0, "--port 8000: router would listen on port 0, outside 1..65535", "pass --port with a port from 1 to 65535"),
])
def test_check_ports_names_where_an_out_of_range_port_came_from(tmp_path, name, port, message, help):
    """The plan-level check on its own (validate and the CLI stop these earlier; an API
    caller building LaunchOptions by hand does not pass through either)."""
    from dataclasses import replace

    from omni_pd.launch.plan import check_ports
    from omni_pd.launch.spec import PortUse

    cfg = compiled(tmp_path, LLM, ExpandOptions(connector="NixlConnector", kv_buffer_device="cpu"), "llm")
    opts = LaunchOptions(model="m", platform="cpu")
    plan = plan_of(cfg, model="m", platform="cpu")
    assert check_ports(plan, opts) is plan
    bad = replace(plan, processes=tuple(
        replace(p, ports=tuple(PortUse(port, u.purpose, u.host) if u.purpose != "http" or p.role == "router" else u
                               for u in p.ports)) if p.name == name else p for p in plan.processes))
    with pytest.raises(OmniPdError) as e:
        check_ports(bad, opts)
    assert (e.value.diagnostic.code, e.value.diagnostic.message, e.value.diagnostic.help) == (
        "OPD006", message.format(cfg=cfg), help)


def test_launch_refuses_a_host_that_is_no_address(tmp_path, capsys):
    from omni_pd.cli import main

    cfg = compiled(tmp_path, LLM, ExpandOptions(), "llm")
    rc = main(["launch", str(cfg), "--model", "m", "--dry-run", "--host", "a b"])
    out, err = capsys.readouterr()
    assert (rc, out) == (2, "")
    assert err.startswith("error[OPD006]: --host 'a b': not an IP address or host name\n")


# --- data parallel: vLLM's own DP ports (issue 16) ---------------------------------------------------

DP2 = "data_parallel_size: 2\nstages:\n  - stage_id: 0\n    max_model_len: 1024\n"
DP_RPC = "data-parallel RPC (--data-parallel-rpc-port)"


def test_dp_engines_get_their_own_data_parallel_rpc_port(tmp_path):
    """vLLM 0.30 gives every engine the same default ``--data-parallel-rpc-port`` 29550
    (vllm/config/parallel.py:143) and binds it, on the DP head's address, as soon as a DP
    rank is not local (vllm/v1/engine/utils.py:1196-1217). Each DP > 1 engine gets its own,
    its HTTP port + 300, in the argv and among the ports it binds (so preflight try-binds
    it and the plan's clash check sees it); DP 1 engines get neither."""
    src = tmp_path / "llm.yaml"
    src.write_text(DP2)
    plan = plan_of(compiled(tmp_path, src, ExpandOptions(prefill_replicas=2), "llm"), model="m")
    p0, p1, d0, router = plan.processes
    tail = ("--data-parallel-size", "2", "--max-model-len", "1024")
    assert p0.argv[p0.argv.index("--kv-transfer-config") + 2:] == tail + ("--no-async-scheduling",
                                                                         "--data-parallel-rpc-port", "8400")
    assert p1.argv[p1.argv.index("--kv-transfer-config") + 2:] == tail + ("--no-async-scheduling",
                                                                         "--data-parallel-rpc-port", "8401")
    assert d0.argv[d0.argv.index("--kv-transfer-config") + 2:] == tail + ("--data-parallel-rpc-port", "8500")
    assert ports(p0) == [(8100, "http"), (25201, "Mooncake bootstrap instance 0"), (8400, DP_RPC)]
    assert ports(p1) == [(8101, "http"), (25202, "Mooncake bootstrap instance 1"), (8401, DP_RPC)]
    assert ports(d0) == [(8200, "http"), (8500, DP_RPC)]
    assert ports(router) == [(8000, "http")]
    from omni_pd.launch.preflight import plan_checks

    assert plan_checks(plan) == []
    moved = plan_of(compiled(tmp_path, src, ExpandOptions(), "llm"), model="m", engine_port_base=9100)
    assert [ports(p)[-1] for p in moved.processes[:2]] == [(9400, DP_RPC), (9500, DP_RPC)]


def test_dp_1_engines_get_no_data_parallel_rpc_port(tmp_path):
    plan = plan_of(compiled(tmp_path, LLM, ExpandOptions(prefill_replicas=2), "llm"), model="m")
    for p in plan.processes:
        assert "--data-parallel-rpc-port" not in p.argv and DP_RPC not in [u.purpose for u in p.ports], p.name


def test_a_stage_data_parallel_rpc_port_is_kept_per_instance_and_its_clash_reported(tmp_path):
    """A stage's own ``data_parallel_rpc_port`` wins (instance r of ``num_replicas`` N binds
    it + r); written on the source stage it reaches prefill and decode alike, and the
    plan's clash check says so instead of vLLM's second engine dying at startup."""
    from omni_pd.launch.preflight import plan_checks

    src = tmp_path / "llm.yaml"
    src.write_text(DP2 + "    data_parallel_rpc_port: 29600\n")
    plan = plan_of(compiled(tmp_path, src, ExpandOptions(prefill_replicas=2), "llm"), model="m")
    p0, p1, d0, _ = plan.processes
    for p, port in ((p0, "29600"), (p1, "29601"), (d0, "29600")):
        assert p.argv.count("--data-parallel-rpc-port") == 1, p.name
        assert p.argv[p.argv.index("--data-parallel-rpc-port") + 1] == port, p.name
        assert ports(p)[-1] == (int(port), DP_RPC)
    assert [(d.code, d.message) for d in plan_checks(plan)] == [
        ("OPD960", f"port 29600 on 127.0.0.1 is planned for both prefill-0 ({DP_RPC}) and decode-0 ({DP_RPC})")]


def test_an_engine_port_base_whose_dp_rpc_port_overflows_is_a_plan_error(tmp_path):
    src = tmp_path / "llm.yaml"
    src.write_text(DP2)
    cfg = compiled(tmp_path, src, ExpandOptions(), "llm")
    with pytest.raises(OmniPdError) as e:
        plan_of(cfg, model="m", engine_port_base=65200)
    d = e.value.diagnostic
    assert (d.code, d.message) == ("OPD006", "--engine-port-base 65200: decode-0 would bind its data-parallel RPC "
                                             "port 65600 (its HTTP port + 300), above 65535")
    assert d.help == ("pass --engine-port-base 65135 or lower (a data_parallel_size > 1 engine binds its HTTP "
                      "port + 300 for vLLM's data-parallel RPC)")
    assert plan_of(cfg, model="m", engine_port_base=65135).process("decode-0").ports[-1] == \
        __import__("omni_pd.launch.spec", fromlist=["PortUse"]).PortUse(65535, DP_RPC, "127.0.0.1")


def test_two_dp_engines_drawing_from_one_vllm_port_are_refused(tmp_path):
    """With ``VLLM_PORT`` set, vLLM draws a DP engine's 5 data-parallel process-group ports
    upward from it when the engine starts (vllm/config/parallel.py:910-927,
    vllm/utils/network_utils.py:197-208) and binds them later: two DP engines given the
    same ``VLLM_PORT`` (``--env`` reaches every process) pick the same ports."""
    from omni_pd.launch.preflight import plan_checks

    src = tmp_path / "llm.yaml"
    src.write_text(DP2)
    cfg = compiled(tmp_path, src, ExpandOptions(), "llm")
    plan = plan_of(cfg, model="m", env={"VLLM_PORT": "30000"})
    assert [(d.code, d.message, d.help) for d in plan_checks(plan)] == [(
        "OPD960", "prefill-0 (VLLM_PORT=30000) and decode-0 (VLLM_PORT=30000) have data_parallel_size > 1 on "
                  "127.0.0.1: vLLM draws each one's data-parallel ports from VLLM_PORT upward (5 of them) before "
                  "binding them, so both pick the same ports",
        "leave VLLM_PORT unset for these engines (vLLM then asks the kernel for free ports), or set it per stage "
        "(the stage's env) at least 5 apart")]
    assert plan_checks(plan_of(compiled(tmp_path, LLM, ExpandOptions(), "llm"), model="m",
                               env={"VLLM_PORT": "30000"})) == []  # DP 1: nothing drawn at startup


def test_router_workers_are_planned_into_the_router_argv(tmp_path, monkeypatch):
    """``--router-workers N`` reaches the router's command line; without it the router gets
    the default for the host's CPUs (1 up to 7, a quarter from 8, at most 8); a
    decode-first (push) front gets none (it keeps its metaserver state in one process)."""
    from omni_pd.launch.router import sizing

    cfg = compiled(tmp_path, LLM, ExpandOptions(connector="NixlConnector"), "llm")
    router = plan_of(cfg, model="m", router_workers=3).processes[-1]
    assert router.argv[2:] == ("omni_pd.launch.router", "--connector", "NixlConnector", "--host", "127.0.0.1",
                               "--port", "8000", "--workers", "3", "--prefill", "http://127.0.0.1:8100",
                               "--decode", "http://127.0.0.1:8200")
    for cpus, workers in ((1, 1), (2, 1), (7, 1), (8, 2), (16, 4), (64, 8)):
        monkeypatch.setattr(sizing, "usable_cpus", lambda cpus=cpus: cpus)
        argv = plan_of(cfg, model="m").processes[-1].argv
        assert argv[argv.index("--workers") + 1] == str(workers), cpus
    from omni_pd.launch.plan import _router_workers_args

    assert _router_workers_args("MooncakeLayerwiseConnector", LaunchOptions(model="m", router_workers=4)) == []
    r = subprocess.run([sys.executable, "-m", "omni_pd.cli", "launch", str(cfg), "--model", "m", "--dry-run",
                        "--format", "json", "--router-workers", "2"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    argv = json.loads(r.stdout)["processes"][-1]["argv"]
    assert argv[argv.index("--workers") + 1] == "2"
    r = subprocess.run([sys.executable, "-m", "omni_pd.cli", "launch", str(cfg), "--model", "m", "--dry-run",
                        "--router-workers", "0"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and "--router-workers" in r.stdout + r.stderr


def test_a_dp_encoder_gets_its_own_data_parallel_rpc_port(tmp_path):
    """E (``--engine-port-base`` + 200) with data_parallel_size 2 binds + 500; P and D
    with DP 1 get none."""
    text = (ROOT / "tests" / "golden" / "encoder" / "qwen3_omni_thinker_1e1p1d.yaml").read_text()
    text = text.replace('    devices: "2"\n', '    devices: "2,3"\n    data_parallel_size: 2\n', 1)
    f = tmp_path / "epd.yaml"
    f.write_text(text)
    plan = plan_of(f, model="m", platform="cpu")
    e = plan.process("encoder-0")
    assert e.argv[-2:] == ("--data-parallel-rpc-port", "8600")
    assert ports(e) == [(8300, "http"), (8600, DP_RPC)]
    assert [DP_RPC in [u.purpose for u in p.ports] for p in plan.processes] == [False, False, True, False]


# --- branches the end-to-end plans above do not reach (issue 16 mutation run) -------------------------

def _node(**kw):
    from omni_pd.compile.topology import StageNode

    d = dict(stage_id=0, role="llm", pd_role="prefill", input_sources=(), final_output=True, final_output_type=None,
             index=0, devices=(0, 1, 2, 3), tp=2, pp=1, dp=1, num_replicas=2,
             kv={"kv_connector": "NixlConnector", "kv_role": "kv_producer", "engine_id": "p"},
             env={"VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"}, settings={})
    d.update(kw)
    return StageNode(**d)


def test_connector_ports_label_each_rank_of_a_range_and_each_replica():
    """vLLM 0.11's NIXL binds side-channel port + rank for TP x DP ranks (span 2 at TP 2):
    every port of the range is listed, labelled ``[i]``; on vllm-omni each replica gets the
    stage's env unchanged (the same ports, which expand's OPD805 refuses), on ``vllm`` the
    contract's ``base + r * span``."""
    from omni_pd.compile.targets import target
    from omni_pd.launch.plan import _connector_ports
    from omni_pd.launch.spec import PortUse

    nixl = "NIXL side channel"
    assert _connector_ports(_node(), target("0.11"), "h", "vllm-omni") == tuple(
        PortUse(port, f"{nixl} replica {r}[{i}]", "h") for r, i, port in ((0, 0, 5600), (0, 1, 5601),
                                                                          (1, 0, 5600), (1, 1, 5601)))
    assert _connector_ports(_node(), target("0.11"), "h") == tuple(
        PortUse(5600 + k, f"{nixl} replica {k // 2}[{k % 2}]", "h") for k in range(4))
    assert _connector_ports(_node(num_replicas=1), target("0.11"), "h", "vllm-omni") == (
        PortUse(5600, f"{nixl}[0]", "h"), PortUse(5601, f"{nixl}[1]", "h"))
    assert _connector_ports(_node(), target("0.30"), "h", "vllm-omni") == (
        PortUse(5600, f"{nixl} replica 0", "h"), PortUse(5600, f"{nixl} replica 1", "h"))
    assert _connector_ports(_node(), None, "h") == ()  # no target: no port rules
    assert _connector_ports(_node(kv={"kv_connector": "NoSuchConnector"}), target("0.11"), "h") == ()
    # a Mooncake consumer binds nothing, a producer its bootstrap port + replica (vllm-omni 0.30)
    moon = {"kv_connector": "MooncakeConnector", "kv_role": "kv_producer"}
    assert _connector_ports(_node(pd_role="decode", kv={**moon, "kv_role": "kv_consumer"}, env={}), target("0.30"),
                            "h", "vllm-omni") == ()
    assert _connector_ports(_node(kv={**moon, "kv_connector_extra_config": {"bootstrap_port": 25201}}, env={}),
                            target("0.30"), "h", "vllm-omni") == (
        PortUse(25201, "Mooncake bootstrap replica 0", "h"), PortUse(25202, "Mooncake bootstrap replica 1", "h"))


def test_hccl_port_moves_each_instance_by_its_ranks_reserved_ports():
    """``HCCL_IF_BASE_PORT`` + replica x 16 ports per rank (presets/targets/vllm_ascend.yaml
    ``rules.hccl``); no base or one that is not a number: None and the env untouched."""
    from omni_pd.launch.plan import _hccl_port

    for env in ({}, {"HCCL_IF_BASE_PORT": "abc"}):
        before = dict(env)
        assert _hccl_port(env, _node(dp=2), 1) is None and env == before
    env = {"HCCL_IF_BASE_PORT": "60000", "OTHER": "x"}
    assert _hccl_port(env, _node(tp=2, dp=2), 1) == 60064 and env == {"HCCL_IF_BASE_PORT": "60064", "OTHER": "x"}
    env = {"HCCL_IF_BASE_PORT": "60000"}
    assert _hccl_port(env, _node(tp=1, dp=1, pp=2), 3) == 60096 and env == {"HCCL_IF_BASE_PORT": "60096"}
    assert _hccl_port({"HCCL_IF_BASE_PORT": "60000"}, _node(tp=1, dp=1), 0) == 60000


def test_a_topology_without_a_pd_pair_is_not_planned():
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve
    from omni_pd.launch.plan import build_plan

    doc = parse_text(LLM.read_text(), "llm.yaml")
    topo = resolve(parse_config(doc), load_catalogue().get("llm"), None, doc)
    with pytest.raises(ValueError) as e:
        build_plan(topo, "llm.yaml", LaunchOptions(model="m"))
    assert str(e.value) == "the config has no prefill/decode pair: run `omni-pd expand` first"


def test_a_tp_the_stage_sets_under_engine_args_becomes_the_tp_flag(tmp_path):
    """``engine_args.tensor_parallel_size`` is flattened into the stage's keys the way
    vllm-omni reads it (topology.effective_stage), so it reaches the engine flags once.
    (The stage's TP is only ever read from that key: the plan's separate "add the TP flag
    when the key is missing" branch could not run and was removed.)"""
    src = tmp_path / "llm.yaml"
    src.write_text(LLM.read_text().replace("  - stage_id: 0\n", "  - stage_id: 0\n    engine_args: {tensor_parallel_size: 2}\n")
                   .replace('devices: "0"', 'devices: "0,1"'))
    pre, dec, _ = plan_of(compiled(tmp_path, src, ExpandOptions(connector="NixlConnector"), "llm"), model="m").processes
    assert pre.argv[pre.argv.index("--kv-transfer-config") + 2:] == (
        "--max-model-len", "1024", "--enforce-eager", "--no-async-scheduling", "--dtype", "float32",
        "--tensor-parallel-size", "2")
    assert dec.argv[dec.argv.index("--kv-transfer-config") + 2:] == (
        "--max-model-len", "1024", "--enforce-eager", "--dtype", "float32", "--tensor-parallel-size", "2")
    assert (pre.env["CUDA_VISIBLE_DEVICES"], dec.env["CUDA_VISIBLE_DEVICES"]) == ("0,1", "2,3")


def test_encoder_process_on_cuda_cpu_and_without_an_ec_contract():
    """E's own env and devices (device env only where the platform selects devices), its
    stage's ``data_parallel_rpc_port`` as written (E is one instance: replica 0), the stage
    keys over the pipeline-wide ones; an EC connector without a contract: its name as
    written, no shared directory."""
    from omni_pd.launch.plan import DP_RPC, _encoder_process
    from omni_pd.launch.spec import PortUse

    enc = _node(role="encoder", pd_role=None, devices=(2, 3), tp=1, dp=2, num_replicas=1, kv=None, env={"A": 1},
                settings={"data_parallel_size": 2, "data_parallel_rpc_port": 29700, "gpu_memory_utilization": 0.5})
    wide = {"dtype": "float32", "data_parallel_size": 1}
    argv = ("vllm", "serve", "m", "--host", "127.0.0.1", "--port", "8300", "--served-model-name", "s", "--dtype",
            "float32", "--data-parallel-size", "2", "--gpu-memory-utilization", "0.5", "--data-parallel-rpc-port", "29700")
    for platform, devices, dev_env in (("cuda", "2,3", {"CUDA_VISIBLE_DEVICES": "2,3"}), ("cpu", None, {})):
        e, name, storage, note = _encoder_process(enc, LaunchOptions(model="m", platform=platform), "s",
                                                  {"HF": "x"}, "/py", wide)
        assert note is None  # no visibility variable: nothing remapped
        assert (e.argv, dict(e.env), e.devices, e.device_env) == (
            argv, {"HF": "x", "A": "1", **dev_env}, devices, "CUDA_VISIBLE_DEVICES" if devices else None), platform
        assert e.ports == (PortUse(8300, "http", "127.0.0.1"), PortUse(29700, DP_RPC, "127.0.0.1"))
        assert (e.memory_fraction, e.python, e.modules, e.writable_dirs, name, storage) == (
            0.5, "/py", ("vllm",), (), None, None)
    odd = _node(role="encoder", pd_role=None, devices=None, tp=1, dp=1, num_replicas=1, kv=None, env={},
                settings={"ec_transfer_config": {"ec_connector": "NoSuchEC", "ec_role": "ec_producer"}})
    e, name, storage, note = _encoder_process(odd, LaunchOptions(model="m"), "s", {}, None)
    assert (note, name, storage, e.writable_dirs, e.memory_fraction, e.devices, dict(e.env)) == (
        None, "NoSuchEC", None, (), 0.9, None, {})
    assert e.argv[-2:] == ("--ec-transfer-config", '{"ec_connector":"NoSuchEC","ec_role":"ec_producer"}')


def test_encoder_process_on_another_host_and_an_ec_connector_spelt_in_lower_case():
    """The host reaches E's argv, ports and health URL; ``ready_timeout_s`` its health
    check; a case-insensitive EC connector name resolves to its contract's own spelling
    and shared directory; no devices on cuda: no device env at all."""
    from omni_pd.launch.plan import _encoder_process
    from omni_pd.launch.spec import PortUse

    enc = _node(role="encoder", pd_role=None, devices=None, tp=1, dp=2, num_replicas=1, kv=None, env={},
                settings={"data_parallel_size": 2, "ec_transfer_config": {
                    "ec_connector": "ecexampleconnector", "ec_role": "ec_producer",
                    "ec_connector_extra_config": {"shared_storage_path": "/srv/ec"}}})
    e, name, storage, note = _encoder_process(enc, LaunchOptions(model="m", host="10.0.0.5", ready_timeout_s=77.0),
                                              "s", {}, None)
    assert (note, name, storage, e.writable_dirs) == (None, "ECExampleConnector", "/srv/ec", ("/srv/ec",))
    assert e.argv[3:7] == ("--host", "10.0.0.5", "--port", "8300")
    assert e.ports == (PortUse(8300, "http", "10.0.0.5"), PortUse(8600, DP_RPC, "10.0.0.5"))
    assert (e.health.url, e.health.timeout_s) == ("http://10.0.0.5:8300/health", 77.0)
    assert (e.devices, e.device_env, dict(e.env)) == (None, None, {})


def test_connector_ports_take_the_side_from_the_stage_when_kv_names_no_role():
    """A kv_transfer_config without ``kv_role``: the contract falls back to the side
    (prefill: producer, binds its bootstrap port; decode: consumer, binds none)."""
    from omni_pd.compile.targets import target
    from omni_pd.launch.plan import _connector_ports
    from omni_pd.launch.spec import PortUse

    kv = {"kv_connector": "MooncakeConnector", "kv_connector_extra_config": {"bootstrap_port": 25201}}
    one = dict(kv=kv, env={}, num_replicas=1)
    assert _connector_ports(_node(pd_role="prefill", **one), target("0.30"), "h", "vllm-omni") == (
        PortUse(25201, "Mooncake bootstrap", "h"),)
    assert _connector_ports(_node(pd_role="decode", **one), target("0.30"), "h", "vllm-omni") == ()


def test_instance_devices_splits_only_a_device_tuple_that_divides_evenly():
    from omni_pd.launch.plan import instance_devices

    assert instance_devices((0, 1, 2, 3), 2, 1) == (2, 3)
    assert instance_devices((0, 1, 2, 3, 4, 5), 3, 2) == (4, 5)
    assert instance_devices((0, 1, 2), 2, 1) == (0, 1, 2)  # uneven: shared as written
    assert instance_devices((0, 1), 1, 0) == (0, 1)
    assert instance_devices("cpu", 3, 1) == "cpu"
    assert instance_devices(None, 2, 0) is None


def test_instances_without_a_target_or_a_contract_bind_no_connector_port():
    from omni_pd.compile.targets import target
    from omni_pd.launch.plan import instances

    for node, tgt in ((_node(), None), (_node(kv={"kv_connector": "NoSuchConnector", "engine_id": "p"}), target("0.30"))):
        got = instances(node, tgt)
        assert [(i.replica, i.devices, i.env, i.ports, i.bootstrap_port, i.kv["engine_id"]) for i in got] == [
            (0, "0,1", {}, (), None, "p-r0"), (1, "2,3", {}, (), None, "p-r1")]


def test_instances_take_the_side_from_the_stage_when_kv_names_no_role():
    from omni_pd.compile.targets import target
    from omni_pd.launch.plan import instances
    from omni_pd.launch.spec import PortUse

    moon = {"kv_connector": "MooncakeConnector", "engine_id": "x"}
    env = {"VLLM_MOONCAKE_BOOTSTRAP_PORT": "25201"}
    pre = instances(_node(pd_role="prefill", kv=moon, env=env), target("0.30"))
    assert [(i.env, i.ports, i.bootstrap_port) for i in pre] == [
        ({"VLLM_MOONCAKE_BOOTSTRAP_PORT": str(p)}, (PortUse(p, f"Mooncake bootstrap instance {r}"),), p)
        for r, p in ((0, 25201), (1, 25202))]
    dec = instances(_node(pd_role="decode", kv=moon, env=env), target("0.30"))
    assert [(i.env, i.ports, i.bootstrap_port) for i in dec] == [({}, (), None), ({}, (), None)]


def test_a_single_instance_keeps_the_stages_env_as_written():
    """One instance: the connector's port variable is not written (the engine reads the
    stage's own env, or its default when the stage sets none)."""
    from omni_pd.compile.targets import target
    from omni_pd.launch.plan import instances

    (one,) = instances(_node(num_replicas=1, kv={"kv_connector": "MooncakeConnector", "kv_role": "kv_producer",
                                                 "engine_id": "p"}, env={}), target("0.30"))
    assert (one.env, one.bootstrap_port, one.kv["engine_id"]) == ({}, 8998, "p")


def test_connector_modules_and_the_engines_python():
    from omni_pd.launch.plan import _python_of, connector_modules

    assert connector_modules("NixlConnector") == ("nixl",)
    assert connector_modules("MooncakeConnector") == ("mooncake.engine",)
    assert connector_modules("NoSuchConnector") == ()
    assert (_python_of("/opt/v/bin/vllm"), _python_of("vllm")) == ("/opt/v/bin/python", None)


def test_the_vllm_omni_server_binds_its_ports_on_the_given_host(tmp_path):
    from omni_pd.launch.spec import PortUse

    cfg = compiled(tmp_path, preset_path("qwen3_omni_moe"), ExpandOptions())
    (p,) = plan_of(cfg, model="m", host="10.0.0.5").processes
    assert p.ports == (PortUse(8000, "http", "10.0.0.5"), PortUse(25201, "Mooncake bootstrap", "10.0.0.5"))


def test_check_ports_accepts_port_1_and_names_the_omni_servers_own_port_option(tmp_path):
    from dataclasses import replace

    from omni_pd.launch.plan import check_ports
    from omni_pd.launch.spec import PortUse

    cfg = compiled(tmp_path, preset_path("qwen3_omni_moe"), ExpandOptions())
    plan = plan_of(cfg, model="m")
    low = replace(plan, processes=(replace(plan.processes[0], ports=(PortUse(1, "http"),)),))
    assert check_ports(low, LaunchOptions(model="m", port=1)) is low
    bad = replace(plan, processes=(replace(plan.processes[0], ports=(PortUse(70000, "http"),)),))
    with pytest.raises(OmniPdError) as e:
        check_ports(bad, LaunchOptions(model="m", port=70000))
    assert (e.value.diagnostic.message, e.value.diagnostic.help) == (
        "--port 70000: omni would listen on port 70000, outside 1..65535", "pass --port with a port from 1 to 65535")


def test_a_config_port_at_http_plus_300_is_reported_as_the_configs(tmp_path):
    """Only a port planned as the DP RPC port is blamed on --engine-port-base; a connector
    port from the file that happens to sit at HTTP + 300 is the config's."""
    from dataclasses import replace

    from omni_pd.launch.plan import check_ports
    from omni_pd.launch.spec import PortUse

    cfg = compiled(tmp_path, LLM, ExpandOptions(connector="NixlConnector"), "llm")
    opts = LaunchOptions(model="m", engine_port_base=65300)
    plan = plan_of(cfg, model="m", engine_port_base=65300)
    pre = plan.processes[0]
    bad = replace(plan, processes=(replace(pre, ports=(pre.ports[0], PortUse(65600, "NIXL side channel"))),
                                   *plan.processes[1:]))
    with pytest.raises(OmniPdError) as e:
        check_ports(bad, opts)
    assert e.value.diagnostic.message == (f"{cfg}: prefill-0 would bind NIXL side channel port 65600 (from the "
                                          "config), outside 1..65535")


def test_an_engine_port_base_below_1_is_refused_as_too_low(tmp_path):
    """An API caller's ``engine_port_base`` 0 planned prefill on port 0 and was told it was
    "above 65535" and to pass 65435 or lower... (issue 16 mutation run): now "below 1"."""
    cfg = compiled(tmp_path, LLM, ExpandOptions(), "llm")
    with pytest.raises(OmniPdError) as e:
        plan_of(cfg, model="m", engine_port_base=0)
    d = e.value.diagnostic
    assert (d.code, d.message, d.help) == (
        "OPD006", "--engine-port-base 0: prefill-0 would listen on HTTP port 0, below 1",
        "pass --engine-port-base 1 or higher (prefill instances listen on it +0.., decode on +100.., the encoder "
        "on +200)")
    assert plan_of(cfg, model="m", engine_port_base=1).processes[0].ports[0].port == 1


def test_the_highest_engine_port_base_offered_fits_the_dp_rpc_ports_too(tmp_path):
    """With data_parallel_size 2 each engine also binds its HTTP port + 300: the base the
    help offers must fit those (it offered 65435, whose decode DP RPC port is 65835)."""
    src = tmp_path / "llm.yaml"
    src.write_text(DP2)
    cfg = compiled(tmp_path, src, ExpandOptions(), "llm")
    with pytest.raises(OmniPdError) as e:
        plan_of(cfg, model="m", engine_port_base=65536)
    d = e.value.diagnostic
    assert (d.message, d.help) == (
        "--engine-port-base 65536: prefill-0 would listen on HTTP port 65536, above 65535",
        "pass --engine-port-base 65135 or lower (prefill instances listen on it +0.., decode on +100.., the "
        "encoder on +200)")
    assert plan_of(cfg, model="m", engine_port_base=65135).process("decode-0").ports[-1].port == 65535


def test_the_vllm_omni_plan_exactly(tmp_path):
    from omni_pd.launch.spec import PortUse

    cfg = compiled(tmp_path, preset_path("qwen3_omni_moe"), ExpandOptions())
    plan = plan_of(cfg, model="m", host="10.0.0.5", port=9000, env={"HF_TOKEN": "t"})
    (p,) = plan.processes
    assert (plan.runtime, plan.model, plan.config, plan.entrypoint, plan.notes) == (
        "vllm-omni", "m", str(cfg), "http://10.0.0.5:9000",
        ("vllm-omni starts every stage engine and routes prefill -> decode itself",))
    assert (p.name, p.role, dict(p.env), p.devices, p.device_env) == ("omni", "omni", {"HF_TOKEN": "t"}, None, None)
    assert p.ports == (PortUse(9000, "http", "10.0.0.5"), PortUse(25201, "Mooncake bootstrap", "10.0.0.5"))


def _hand_llm_pd(tmp_path, prefill: str) -> Path:
    f = tmp_path / "hand_llm.yaml"
    f.write_text(
        "pipeline: llm_pd\nstages:\n"
        f"  - {{stage_id: 0, async_scheduling: false, {prefill}kv_transfer_config: {{kv_connector: NixlConnector, "
        "kv_role: kv_producer, engine_id: p}, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5600\", HCCL_IF_BASE_PORT: \"61000\"}}\n"
        "  - {stage_id: 1, kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer, engine_id: d},"
        " env: {VLLM_NIXL_SIDE_CHANNEL_PORT: \"5601\"}}\n")
    return f


def test_engines_without_devices_on_cuda_get_no_device_env_and_hccl_is_npu_only(tmp_path):
    """No ``devices`` on the stage: no CUDA_VISIBLE_DEVICES (the engine sees every GPU) and
    no device env named; an ``HCCL_IF_BASE_PORT`` off npu is passed as written and is no
    planned port; ``gpu_memory_utilization`` is the engine's memory share (0.9 without);
    the host reaches every port the engines bind."""
    from omni_pd.launch.spec import PortUse

    f = _hand_llm_pd(tmp_path, "gpu_memory_utilization: 0.5, ")
    pre, dec, _ = plan_of(f, model="m", host="10.0.0.5").processes
    assert (pre.devices, pre.device_env, dec.devices, dec.device_env) == (None, None, None, None)
    assert dict(pre.env) == {"VLLM_NIXL_SIDE_CHANNEL_PORT": "5600", "HCCL_IF_BASE_PORT": "61000"}
    assert pre.ports == (PortUse(8100, "http", "10.0.0.5"), PortUse(5600, "NIXL side channel", "10.0.0.5"))
    assert (pre.memory_fraction, dec.memory_fraction) == (0.5, 0.9)


def test_engines_on_cpu_name_no_devices(tmp_path):
    cfg = compiled(tmp_path, LLM, ExpandOptions(connector="NixlConnector"), "llm")
    pre, dec, _ = plan_of(cfg, model="m", platform="cpu").processes
    assert (pre.devices, pre.device_env, dec.devices, dec.device_env) == (None, None, None, None)
    assert "CUDA_VISIBLE_DEVICES" not in pre.env and None not in pre.env


def test_the_vllm_runtime_plan_carries_host_timeouts_env_and_notes_everywhere(tmp_path):
    """Every planned port is on ``--host``; engines wait ``ready_timeout_s``, the router 60 s;
    the router gets the user's env; the plan names its model, connector and the router note."""
    from omni_pd.launch.spec import PortUse

    src = tmp_path / "llm.yaml"
    src.write_text(DP2)
    plan = plan_of(compiled(tmp_path, src, ExpandOptions(connector="NixlConnector"), "llm"), model="m",
                   host="10.0.0.5", ready_timeout_s=77.0, env={"HF_TOKEN": "t"})
    pre, dec, router = plan.processes
    h = "10.0.0.5"
    nixl = "NIXL side channel"  # one side-channel port per DP rank
    assert pre.ports == (PortUse(8100, "http", h), PortUse(5600, f"{nixl}[0]", h), PortUse(5601, f"{nixl}[1]", h),
                         PortUse(8400, DP_RPC, h))
    assert dec.ports == (PortUse(8200, "http", h), PortUse(5602, f"{nixl}[0]", h), PortUse(5603, f"{nixl}[1]", h),
                         PortUse(8500, DP_RPC, h))
    assert router.ports == (PortUse(8000, "http", h),)
    assert [(p.health.url, p.health.timeout_s) for p in plan.processes] == [
        ("http://10.0.0.5:8100/health", 77.0), ("http://10.0.0.5:8200/health", 77.0),
        ("http://10.0.0.5:8000/health", 60.0)]
    assert dict(router.env) == {"HF_TOKEN": "t"}
    assert (plan.model, plan.connector, plan.entrypoint, plan.notes) == (
        "m", "NixlConnector", "http://10.0.0.5:8000",
        ("router: omni_pd.launch.router (prefill leg max_tokens=1, min_tokens/stop cleared; NixlConnector routing "
         "fields relayed to decode)",))


def test_plan_document_refusals_and_answer_exactly(tmp_path):
    """OPD966 (an error, exact message and help) for a config that is not PD (an encoder +
    one instance layout is planned: tests/test_epd_launch.py); the --engine-arg flags reach
    validation (OPD107 stops the plan); a planned document carries the validation result and
    the topology."""
    from omni_pd.diagnostics import Severity

    with pytest.raises(OmniPdError) as e:
        plan_document(load_file(LLM), str(LLM), LaunchOptions(model="m"))
    d = e.value.diagnostic
    assert (d.code, d.severity, d.message, d.help) == (
        "OPD966", Severity.ERROR, f"{LLM} is not a PD config (pipeline `llm`)",
        f"compile it first: `omni-pd expand {LLM} -o pd.yaml`, then launch pd.yaml")
    cfg = compiled(tmp_path, LLM, ExpandOptions(connector="NixlConnector"), "llm")
    bad = plan_document(load_file(cfg), str(cfg), LaunchOptions(model="m", extra_args=("--no-such-flag",)))
    assert bad.plan is None and bad.topology is None
    assert [(x.code, x.message) for x in bad.validation.diagnostics] == [
        ("OPD107", "--no-such-flag is not a `vllm serve` flag in vLLM 0.30 (assumed: no --vllm-version given; pass --vllm-version X.Y)")]
    ok = plan_document(load_file(cfg), str(cfg), LaunchOptions(model="m", extra_args=("--max-num-seqs", "4")))
    assert ok.plan.processes[0].argv[-2:] == ("--max-num-seqs", "4")
    assert (ok.validation.pipeline_name, ok.validation.diagnostics, ok.topology.pipeline.name) == ("llm_pd", [], "llm_pd")
