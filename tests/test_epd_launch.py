"""`omni-pd launch` of an encoder split (E -> P -> D and E -> PD): the plan (exact argv/env),
preflight of the shared directory (OPD967), and the smoke check's encoder proof against a
fake entrypoint."""

from __future__ import annotations

import io
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from omni_pd.diagnostics import OmniPdError
from omni_pd.io import load_file
from omni_pd.launch.plan import LaunchOptions, plan_document
from omni_pd.launch.preflight import check_dirs
from omni_pd.launch.router.sizing import default_workers
from omni_pd.launch.smoke import SmokeTarget, ec_smoke_check, smoke_target, stored_items, tiny_png

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden" / "encoder"
OPTS = LaunchOptions(model="/m/q3o", vllm="/venv/bin/vllm", platform="cpu", served_model_name="tiny",
                     env={"HF_HUB_OFFLINE": "1"})


def plan_of(name="qwen3_omni_thinker_1e1p1d.yaml", opts=OPTS):
    doc = load_file(GOLDEN / name)
    return plan_document(doc, "/cfg/epd.yaml", opts).plan


def test_plan_e_p_d_exact_argv_env_and_router():
    plan = plan_of()
    assert [p.name for p in plan.processes] == ["prefill-0", "decode-0", "encoder-0", "router"]
    e = plan.process("encoder-0")
    assert e.role == "encoder"
    assert list(e.argv) == [
        "/venv/bin/vllm", "serve", "/m/q3o", "--host", "127.0.0.1", "--port", "8300", "--served-model-name", "tiny",
        "--max-num-seqs", "4", "--max-model-len", "2048", "--enforce-eager",
        "--ec-transfer-config", json.dumps({"ec_connector": "ECExampleConnector", "engine_id": "omni-thinker-encoder",
                                            "ec_role": "ec_producer",
                                            "ec_connector_extra_config": {"shared_storage_path": "/tmp/omni-pd-ec"}},
                                           separators=(",", ":")),
        "--dtype", "float32"]
    assert dict(e.env) == {"HF_HUB_OFFLINE": "1"}  # no connector env, no device env on cpu
    assert "--kv-transfer-config" not in e.argv
    assert [(u.port, u.purpose) for u in e.ports] == [(8300, "http")]
    assert e.health.url == "http://127.0.0.1:8300/health" and e.writable_dirs == ("/tmp/omni-pd-ec",)
    p = plan.process("prefill-0")
    i = p.argv.index("--ec-transfer-config")
    assert json.loads(p.argv[i + 1])["ec_role"] == "ec_consumer" and p.writable_dirs == ("/tmp/omni-pd-ec",)
    assert "--ec-transfer-config" not in plan.process("decode-0").argv
    r = plan.process("router")
    assert list(r.argv) == [sys.executable, "-m", "omni_pd.launch.router", "--connector", "NixlConnector",
                            "--host", "127.0.0.1", "--port", "8000", "--workers", str(default_workers()),
                            "--prefill", "http://127.0.0.1:8100", "--decode", "http://127.0.0.1:8200",
                            "--encoder", "http://127.0.0.1:8300"]
    assert r.depends_on == ("prefill-0", "decode-0", "encoder-0")
    assert (plan.ec_connector, plan.ec_storage) == ("ECExampleConnector", "/tmp/omni-pd-ec")


def test_plan_gives_e_its_device_on_cuda():
    plan = plan_of(opts=LaunchOptions(model="m", vllm="/v/vllm", platform="cuda"))
    e = plan.process("encoder-0")
    assert (e.device_env, e.devices, e.env["CUDA_VISIBLE_DEVICES"]) == ("CUDA_VISIBLE_DEVICES", "2", "2")


def test_plan_without_encoder_is_unchanged():
    from omni_pd.io import parse_text
    from omni_pd.compile.expand import expand_document
    from omni_pd.compile.passes.pd_split import ExpandOptions

    res = expand_document(load_file(ROOT / "tests" / "fixtures" / "llm.yaml"), ExpandOptions(connector="NixlConnector"),
                          pipeline="llm")
    plan = plan_document(parse_text(res.text, "pd.yaml"), "/cfg/pd.yaml", OPTS).plan
    assert [p.name for p in plan.processes] == ["prefill-0", "decode-0", "router"]
    assert "--encoder" not in plan.process("router").argv and plan.ec_storage is None


# --- E -> PD (1e1pd): the encoder, one instance that runs prefill and decode, the router ---------

EC_DIR = {"shared_storage_path": "/tmp/omni-pd-ec"}
EC_PRODUCER = json.dumps({"ec_connector": "ECExampleConnector", "engine_id": "omni-thinker-encoder",
                          "ec_role": "ec_producer", "ec_connector_extra_config": EC_DIR}, separators=(",", ":"))
EC_CONSUMER = json.dumps({"ec_connector": "ECExampleConnector", "engine_id": "omni-thinker",
                          "ec_role": "ec_consumer", "ec_connector_extra_config": EC_DIR}, separators=(",", ":"))
THINKER_FLAGS = ["--max-num-seqs", "4", "--max-model-len", "2048", "--enforce-eager"]


def test_plan_e_pd_exact_argv_env_ports_and_router():
    """As vLLM's disagg_1e1pd_example.sh: E (ec_producer) and the instance (ec_consumer, no KV
    connector) as plain `vllm serve`, the router with --instance and --encoder, no --connector."""
    plan = plan_of("qwen3_omni_thinker_1e1pd.yaml")
    assert [(p.name, p.role) for p in plan.processes] == [("pd-0", "pd"), ("encoder-0", "encoder"),
                                                          ("router", "router")]
    pd, e, r = plan.processes
    assert list(pd.argv) == ["/venv/bin/vllm", "serve", "/m/q3o", "--host", "127.0.0.1", "--port", "8100",
                             "--served-model-name", "tiny", *THINKER_FLAGS, "--ec-transfer-config", EC_CONSUMER,
                             "--dtype", "float32"]
    assert list(e.argv) == ["/venv/bin/vllm", "serve", "/m/q3o", "--host", "127.0.0.1", "--port", "8300",
                            "--served-model-name", "tiny", *THINKER_FLAGS, "--ec-transfer-config", EC_PRODUCER,
                            "--dtype", "float32"]
    assert list(r.argv) == [sys.executable, "-m", "omni_pd.launch.router", "--host", "127.0.0.1", "--port", "8000",
                            "--workers", str(default_workers()), "--instance", "http://127.0.0.1:8100",
                            "--encoder", "http://127.0.0.1:8300"]
    assert not any("kv-transfer" in a or "kv_transfer" in a for p in plan.processes for a in p.argv)
    assert [dict(p.env) for p in plan.processes] == [{"HF_HUB_OFFLINE": "1"}] * 3  # no connector env on cpu
    assert [[(u.port, u.purpose, u.host) for u in p.ports] for p in plan.processes] == [
        [(8100, "http", "127.0.0.1")], [(8300, "http", "127.0.0.1")], [(8000, "http", "127.0.0.1")]]
    assert [p.health.url for p in plan.processes] == ["http://127.0.0.1:8100/health", "http://127.0.0.1:8300/health",
                                                      "http://127.0.0.1:8000/health"]
    assert [p.depends_on for p in plan.processes] == [(), (), ("pd-0", "encoder-0")]
    assert [p.writable_dirs for p in plan.processes] == [("/tmp/omni-pd-ec",), ("/tmp/omni-pd-ec",), ()]
    assert [(p.modules, p.python) for p in plan.processes] == [
        (("vllm",), "/venv/bin/python"), (("vllm",), "/venv/bin/python"), (("aiohttp", "omni_pd"), sys.executable)]
    assert (plan.runtime, plan.connector, plan.entrypoint, plan.ec_connector, plan.ec_storage) == (
        "vllm", "none", "http://127.0.0.1:8000", "ECExampleConnector", "/tmp/omni-pd-ec")
    assert plan.notes == (
        "router: omni_pd.launch.router without a KV connector (E -> PD): each request goes whole to one pd "
        "instance, which runs prefill and decode itself",
        "encoder leg: one request per media item to encoder-0 first; its ECExampleConnector output reaches the pd "
        "instance (ec_consumer)")


def test_plan_e_pd_gives_each_engine_its_device_on_cuda():
    plan = plan_of("qwen3_omni_thinker_1e1pd.yaml", LaunchOptions(model="m", vllm="/v/vllm", platform="cuda",
                                                                  launcher_env={"CUDA_VISIBLE_DEVICES": "4,5"}))
    assert [(p.name, p.env.get("CUDA_VISIBLE_DEVICES"), p.logical_devices) for p in plan.processes] == [
        ("pd-0", "4", "0"), ("encoder-0", "5", "1"), ("router", None, None)]


def test_plan_e_pd_of_the_llm_pipeline(tmp_path):
    """`expand tests/fixtures/llm.yaml --pipeline llm --encoder-split 1e1pd` launches too."""
    from omni_pd.compile.expand import expand_encoder_document
    from omni_pd.compile.passes.encoder_split import EncoderOptions
    from omni_pd.compile.passes.pd_split import ExpandOptions
    from omni_pd.io import parse_text

    res = expand_encoder_document(load_file(ROOT / "tests" / "fixtures" / "llm.yaml"), EncoderOptions("1e1pd"),
                                  ExpandOptions(), pipeline="llm")
    plan = plan_document(parse_text(res.text, "epd.yaml"), "/cfg/epd.yaml", OPTS).plan
    pd = plan.process("pd-0")
    assert list(pd.argv) == ["/venv/bin/vllm", "serve", "/m/q3o", "--host", "127.0.0.1", "--port", "8100",
                             "--served-model-name", "tiny", "--max-model-len", "1024", "--enforce-eager",
                             "--ec-transfer-config", json.dumps(
                                 {"ec_connector": "ECExampleConnector", "engine_id": "llm", "ec_role": "ec_consumer",
                                  "ec_connector_extra_config": {"shared_storage_path": "/tmp/omni-pd-ec"}},
                                 separators=(",", ":")), "--dtype", "float32"]
    assert plan.process("router").argv[-4:] == ("--instance", "http://127.0.0.1:8100",
                                                "--encoder", "http://127.0.0.1:8300")


def test_e_pd_smoke_target_reads_the_instances_log_and_says_why_no_kv_is_checked(tmp_path):
    t = smoke_target(plan_of("qwen3_omni_thinker_1e1pd.yaml"), "tiny", None, str(tmp_path))
    assert (t.entrypoint, t.metrics_url, t.ec_connector, t.ec_storage, t.ec_log, t.ec_consumer, t.not_checked) == (
        "http://127.0.0.1:8000", None, "ECExampleConnector", "/tmp/omni-pd-ec", str(tmp_path / "pd-0.log"), "pd-0",
        "E -> PD: pd-0 runs prefill and decode itself, so no KV moves between instances")


def test_launch_dry_run_shows_the_e_pd_plan():
    from typer.testing import CliRunner

    from omni_pd.cli import app

    r = CliRunner().invoke(app, ["launch", str(GOLDEN / "qwen3_omni_thinker_1e1pd.yaml"), "--model", "m",
                                 "--platform", "cpu", "--dry-run", "--format", "json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert [(p["name"], p["role"]) for p in got["processes"]] == [("pd-0", "pd"), ("encoder-0", "encoder"),
                                                                  ("router", "router")]
    assert got["processes"][2]["argv"][3:] == ["--host", "127.0.0.1", "--port", "8000", "--workers",
                                               str(default_workers()), "--instance", "http://127.0.0.1:8100",
                                               "--encoder", "http://127.0.0.1:8300"]


def test_render_kubernetes_refuses_an_encoder_split_by_name(tmp_path, capsys):
    """Before the KV connector check: E -> PD has none, which read as "none: its router needs ..."."""
    from omni_pd.cli import main

    for name in ("qwen3_omni_thinker_1e1pd.yaml", "qwen3_omni_thinker_1e1p1d.yaml"):
        to = tmp_path / name
        assert main(["render", str(GOLDEN / name), "--to", str(to), "--model", "m", "--target", "kubernetes"]) == 2
        out = capsys.readouterr()
        assert ("error[OPD006]: render --target kubernetes: an encoder split (E->P->D, E->PD) has no Kubernetes "
                "rendering yet") in out.out + out.err, out
        assert not to.exists()


def test_preflight_shared_directory(tmp_path):
    plan = plan_of()
    from dataclasses import replace

    ok = tmp_path / "ec" / "sub"  # missing, creatable
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        procs = tuple(replace(p, writable_dirs=(str(ok),)) if p.name == "encoder-0" else p for p in plan.processes)
        assert check_dirs(replace(plan, processes=procs)) == []
        if os.geteuid() != 0:  # root writes anywhere: the negative case needs a normal user
            procs = tuple(replace(p, writable_dirs=(str(ro / "x"),)) if p.name == "encoder-0" else p
                          for p in plan.processes)
            [d] = [x for x in check_dirs(replace(plan, processes=procs)) if x.message.startswith("encoder-0")]
            assert d.code == "OPD967" and "cannot be created" in d.message
        f = tmp_path / "file"
        f.write_text("x")
        procs = tuple(replace(p, writable_dirs=(str(f),)) if p.name == "encoder-0" else p for p in plan.processes)
        [d] = [x for x in check_dirs(replace(plan, processes=procs)) if x.message.startswith("encoder-0")]
        assert d.code == "OPD967" and d.message == f"encoder-0 must write encoder outputs to {f}: {f} is not a directory"
    finally:
        ro.chmod(0o700)


def test_smoke_target_carries_the_ec_facts(tmp_path):
    t = smoke_target(plan_of(), "tiny", 2, str(tmp_path))
    assert (t.ec_connector, t.ec_storage, t.ec_log) == ("ECExampleConnector", "/tmp/omni-pd-ec",
                                                         str(tmp_path / "prefill-0.log"))


def test_tiny_png_is_a_png_and_salted():
    a, b = tiny_png(seed=1), tiny_png(seed=2)
    assert a[:8] == b"\x89PNG\r\n\x1a\n" and a != b and tiny_png(seed=1) == a


# --- the encoder proof against a fake entrypoint -----------------------------------------


def fake_entrypoint(storage: Path, log: Path, *, store: bool, debug: bool, load: bool):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert body["messages"][0]["content"][0]["type"] == "image_url"
            h = "hash-" + str(abs(hash(body["messages"][0]["content"][0]["image_url"]["url"])))
            if store:
                (storage / h).mkdir(parents=True)
                (storage / h / "encoder_cache.safetensors").write_bytes(b"x")
            with open(log, "a") as f:
                if debug:
                    f.write("DEBUG 01-01 00:00:00 [core.py] something\n")
                if load:
                    f.write(f"DEBUG 01-01 00:00:00 [example_connector.py:108] Success load encoder cache for hash {h}\n")
            out = json.dumps({"choices": [{"message": {"content": "an image"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.parametrize("store,debug,load,rc,text,consumer", [
    (True, True, True, 0, "and prefill loaded it", "prefill"),
    (True, False, False, 0, "not visible without DEBUG logs", "prefill"),
    (True, True, False, 1, "it encoded the image itself", "prefill"),
    (False, True, True, 1, "the encoder stored nothing", "prefill"),
    (True, True, True, 0, "and pd-0 loaded it", "pd-0"),
    (True, True, False, 1, "but pd-0's log", "pd-0"),
])
def test_ec_smoke_check(tmp_path, store, debug, load, rc, text, consumer):
    storage, log = tmp_path / "ec", tmp_path / ("prefill-0.log" if consumer == "prefill" else f"{consumer}.log")
    storage.mkdir()
    (storage / "empty-folder-a-lookup-made").mkdir()  # not an item
    srv = fake_entrypoint(storage, log, store=store, debug=debug, load=load)
    try:
        t = SmokeTarget(f"http://127.0.0.1:{srv.server_address[1]}", "tiny", None,
                        ec_connector="ECExampleConnector", ec_storage=str(storage), ec_log=str(log),
                        ec_consumer=consumer)
        out = io.StringIO()
        assert ec_smoke_check(t, out) == rc
        assert text in out.getvalue(), out.getvalue()
    finally:
        srv.shutdown()
        srv.server_close()
    assert len(stored_items(str(storage))) == (1 if store else 0)


def test_the_encoder_engine_gets_the_pipeline_wide_deploy_keys(tmp_path):
    """A top-level ``trust_remote_code`` reaches E's ``vllm serve`` like P's and D's (issue 16)."""
    f = tmp_path / "epd.yaml"
    f.write_text("trust_remote_code: true\n" + (GOLDEN / "qwen3_omni_thinker_1e1p1d.yaml").read_text())
    plan = plan_document(load_file(f), str(f), OPTS).plan
    for name in ("encoder-0", "prefill-0", "decode-0"):
        argv = plan.process(name).argv
        assert argv.count("--trust-remote-code") == 1, name
        assert argv.index("--trust-remote-code") > argv.index("--served-model-name"), name


def test_an_engine_port_base_whose_encoder_port_overflows_is_a_plan_error():
    """E listens on --engine-port-base + 200: the highest base that fits is 65335 (issue 16)."""
    from dataclasses import replace

    assert plan_of(opts=replace(OPTS, engine_port_base=65335)).process("encoder-0").ports[0].port == 65535
    with pytest.raises(OmniPdError) as e:
        plan_of(opts=replace(OPTS, engine_port_base=65336))
    assert e.value.diagnostic.message == ("--engine-port-base 65336: encoder-0 would listen on HTTP port 65536, "
                                          "above 65535")
    assert e.value.diagnostic.help.startswith("pass --engine-port-base 65335 or lower")


def test_only_prefill_and_the_encoder_get_the_shared_directory_and_e_runs_the_engines_python():
    plan = plan_of()
    assert [(p.name, p.writable_dirs) for p in plan.processes] == [
        ("prefill-0", ("/tmp/omni-pd-ec",)), ("decode-0", ()), ("encoder-0", ("/tmp/omni-pd-ec",)), ("router", ())]
    assert plan.process("encoder-0").python == plan.process("prefill-0").python == "/venv/bin/python"
    assert plan.notes[1] == ("encoder leg: one request per media item to encoder-0 first; its ECExampleConnector "
                             "output reaches prefill (ec_consumer)")
