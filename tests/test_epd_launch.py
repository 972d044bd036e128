"""`omni-pd launch` of an encoder split (E -> P -> D): the plan (exact argv/env), preflight of
the shared directory (OPD967), and the smoke check's encoder proof against a fake entrypoint."""

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


def test_e_plus_one_instance_is_refused_with_the_way_out():
    with pytest.raises(OmniPdError) as ei:
        plan_of("qwen3_omni_thinker_1e1pd.yaml")
    d = ei.value.diagnostic
    assert d.code == "OPD966" and "encoder + one instance" in d.message and "--encoder-split 1e1p1d" in d.help


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


@pytest.mark.parametrize("store,debug,load,rc,text", [
    (True, True, True, 0, "and prefill loaded it"),
    (True, False, False, 0, "not visible without DEBUG logs"),
    (True, True, False, 1, "it encoded the image itself"),
    (False, True, True, 1, "the encoder stored nothing"),
])
def test_ec_smoke_check(tmp_path, store, debug, load, rc, text):
    storage, log = tmp_path / "ec", tmp_path / "prefill-0.log"
    storage.mkdir()
    (storage / "empty-folder-a-lookup-made").mkdir()  # not an item
    srv = fake_entrypoint(storage, log, store=store, debug=debug, load=load)
    try:
        t = SmokeTarget(f"http://127.0.0.1:{srv.server_address[1]}", "tiny", None,
                        ec_connector="ECExampleConnector", ec_storage=str(storage), ec_log=str(log))
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
