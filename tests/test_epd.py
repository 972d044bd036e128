"""The encoder leg of E -> P -> D: the pure protocol (omni_pd.launch.epd) and the router's
EncodeLeg against fake E/P/D servers (fixtures of tests/test_router.py)."""

from __future__ import annotations

import json

import pytest

from omni_pd.launch import epd
from omni_pd.launch import router as R
from test_router import Fake, call, completion, fakes, p_nixl, router, send_json  # noqa: F401 (fixtures)

IMG = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
AUD = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
TXT = {"type": "text", "text": "What is shown and said?"}
CHAT = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": [TXT, IMG, AUD]}],
        "max_tokens": 20, "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
        "stop": ["\n"], "min_tokens": 2, "seed": 7}


def test_one_encoder_request_per_media_item_text_removed():
    bodies = epd.encoder_request_bodies(CHAT)
    common = {"model": "m", "max_tokens": 1, "temperature": 0, "seed": 7, "stream": False}
    assert bodies == [{**common, "messages": [{"role": "user", "content": [IMG]}]},
                      {**common, "messages": [{"role": "user", "content": [AUD]}]}]
    assert CHAT["max_tokens"] == 20 and len(CHAT["messages"][1]["content"]) == 3  # untouched


def test_text_only_and_completions_skip_the_encoder():
    assert epd.encoder_request_bodies({"model": "m", "messages": [{"role": "user", "content": "hi"}]}) == []
    assert epd.encoder_request_bodies({"model": "m", "messages": [{"role": "user", "content": [TXT]}]}) == []
    assert not epd.needs_encoder({"model": "m", "prompt": "hi"})
    assert epd.needs_encoder(CHAT)


def test_max_completion_tokens_is_capped_too():
    body = {**CHAT, "max_completion_tokens": 50}
    assert {b["max_completion_tokens"] for b in epd.encoder_request_bodies(body)} == {1}


def test_merge_ec_params_keeps_the_body_and_unions_params():
    answers = [{"ec_transfer_params": {"h1": {"metadata": {"image_grid_thw": [1, 8, 8]}}}},
               {"ec_transfer_params": {"h2": {"metadata": {"audio_num_tokens": 12}}}},
               {"choices": []}]
    out = epd.merge_ec_params({**CHAT, "ec_transfer_params": {"h0": {}}}, answers)
    assert out["ec_transfer_params"] == {"h0": {}, "h1": {"metadata": {"image_grid_thw": [1, 8, 8]}},
                                         "h2": {"metadata": {"audio_num_tokens": 12}}}
    assert {k: v for k, v in out.items() if k != "ec_transfer_params"} == CHAT
    assert epd.missing_params(answers) == 1
    assert epd.merge_ec_params(CHAT, [{}]) == CHAT


# --- through the router ----------------------------------------------------------------------


def e_answer(h, seen):
    part = seen.body["messages"][0]["content"][0]
    key = "img-hash" if part["type"] == "image_url" else "aud-hash"
    send_json(h, 200, {**completion("x"), "ec_transfer_params": {key: {"metadata": {"type": part["type"]}}}})


def d_json(h, seen):
    send_json(h, 200, completion("decoded"))


@pytest.fixture
def epd_router(router):  # noqa: F811
    def make(e_urls, p, d):
        cfg = R.parse_args(["--connector", "NixlConnector", "--port", "0", "--prefill", p.url, "--decode", d.url,
                            *[a for u in e_urls for a in ("--encoder", u)]])
        return router([p.url], [d.url], encoders=cfg.encoders)
    return make


def test_router_sends_items_to_e_then_merged_params_to_p_and_d(fakes, epd_router):  # noqa: F811
    e, p, d = fakes("E", post=e_answer), fakes("P", post=p_nixl), fakes("D", post=d_json)
    srv = epd_router([e.url], p, d)
    body = {**CHAT, "stream": False}
    body.pop("stream_options")
    status, headers, raw = call(srv, "POST", "/v1/chat/completions", body)
    assert status == 200 and json.loads(raw) == completion("decoded")
    assert sorted(json.dumps(s.body["messages"]) for s in e.posts) == sorted(
        json.dumps([{"role": "user", "content": [part]}]) for part in (IMG, AUD))
    assert {s.body["max_tokens"] for s in e.posts} == {1}
    want = {"img-hash": {"metadata": {"type": "image_url"}}, "aud-hash": {"metadata": {"type": "input_audio"}}}
    [ps], [ds] = p.posts, d.posts
    assert ps.body["ec_transfer_params"] == ds.body["ec_transfer_params"] == want
    assert ps.body["messages"] == body["messages"]  # the consumer still gets the media
    rid = headers["x-request-id"]
    assert {s.headers["x-request-id"] for s in e.posts} == {rid}


def test_text_only_request_bypasses_e(fakes, epd_router):  # noqa: F811
    e, p, d = fakes("E", post=e_answer), fakes("P", post=p_nixl), fakes("D", post=d_json)
    srv = epd_router([e.url], p, d)
    status, _, _ = call(srv, "POST", "/v1/chat/completions",
                        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
    assert status == 200 and e.posts == [] and len(p.posts) == len(d.posts) == 1
    assert "ec_transfer_params" not in p.posts[0].body


def test_e_down_gives_502_naming_the_encoder(fakes, epd_router):  # noqa: F811
    p, d = fakes("P", post=p_nixl), fakes("D", post=d_json)
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    srv = epd_router([dead], p, d)
    body = {**CHAT, "stream": False}
    status, _, raw = call(srv, "POST", "/v1/chat/completions", body)
    err = json.loads(raw)["error"]
    assert status == 502 and err["leg"] == "encoder" and err["backend"] == dead
    assert err["message"].startswith(f"encoder backend {dead} failed")
    assert p.posts == [] and d.posts == []


def test_e_5xx_gives_502(fakes, epd_router):  # noqa: F811
    e = fakes("E", post=lambda h, s: send_json(h, 500, {"error": {"message": "encoder exploded"}}))
    p, d = fakes("P", post=p_nixl), fakes("D", post=d_json)
    srv = epd_router([e.url], p, d)
    status, _, raw = call(srv, "POST", "/v1/chat/completions", {**CHAT, "stream": False})
    err = json.loads(raw)["error"]
    assert status == 502 and err["leg"] == "encoder" and "encoder exploded" in err["message"]
    assert p.posts == []


def test_cli_encoder_option():
    cfg = R.parse_args(["--connector", "NixlConnector", "--prefill", "http://a:1", "--decode", "http://b:2",
                        "--encoder", "http://e:3", "--encoder", "http://e:4"])
    assert [b.url for b in cfg.encoders] == ["http://e:3", "http://e:4"]
    assert R.parse_args(["--connector", "NixlConnector", "--prefill", "http://a:1",
                         "--decode", "http://b:2"]).encoders == ()


# --- E -> PD: the router without a KV connector, in front of one instance ----------------------


@pytest.fixture
def epd_front():
    """``make(e_urls, pd_urls) -> RouterServer``: the E -> PD router of the launch plan
    (``--instance``, no ``--connector``), serving in a thread until the test ends."""
    import threading

    servers: list[R.RouterServer] = []

    def make(e_urls, pd_urls):
        cfg = R.parse_args(["--port", "0", "--timeout", "10", "--connect-timeout", "2", "--health-timeout", "1",
                            *[a for u in pd_urls for a in ("--instance", u)],
                            *[a for u in e_urls for a in ("--encoder", u)]])
        srv = R.make_server(cfg, discovery_interval=0.02)
        servers.append(srv)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        assert srv._started.wait(5)
        return srv

    yield make
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_e_pd_router_sends_items_to_e_then_the_whole_request_to_the_instance(fakes, epd_front):  # noqa: F811
    """As vLLM's disagg_epd_proxy.py with ``--prefill-servers-urls disable``: the client's
    body, E's ec_transfer_params merged in, goes to the instance as it is (stream, stop and
    max_tokens kept: no prefill leg rewrites it, no kv_transfer_params)."""
    e, pd = fakes("E", post=e_answer), fakes("PD", post=d_json)
    srv = epd_front([e.url], [pd.url])
    status, headers, raw = call(srv, "POST", "/v1/chat/completions", CHAT)
    assert status == 200 and json.loads(raw) == completion("decoded")
    assert sorted(json.dumps(s.body["messages"]) for s in e.posts) == sorted(
        json.dumps([{"role": "user", "content": [part]}]) for part in (IMG, AUD))
    [got] = pd.posts
    assert got.body == {**CHAT, "ec_transfer_params": {"img-hash": {"metadata": {"type": "image_url"}},
                                                       "aud-hash": {"metadata": {"type": "input_audio"}}}}
    assert got.path == "/v1/chat/completions"
    assert {s.headers["x-request-id"] for s in e.posts + pd.posts} == {headers["x-request-id"]}


def test_e_pd_text_only_and_completions_go_to_the_instance_unchanged(fakes, epd_front):  # noqa: F811
    e, pd = fakes("E", post=e_answer), fakes("PD", post=d_json)
    srv = epd_front([e.url], [pd.url])
    text = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stop": ["\n"]}
    prompt = {"model": "m", "prompt": "hello", "max_tokens": 5, "min_tokens": 2}
    assert call(srv, "POST", "/v1/chat/completions", text)[0] == 200
    assert call(srv, "POST", "/v1/completions", prompt)[0] == 200
    assert e.posts == [] and [(s.path, s.body) for s in pd.posts] == [("/v1/chat/completions", text),
                                                                      ("/v1/completions", prompt)]


def test_e_pd_instance_down_gives_502_naming_it_and_its_leg(fakes, epd_front):  # noqa: F811
    e = fakes("E", post=e_answer)
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    srv = epd_front([e.url], [dead])
    status, _, raw = call(srv, "POST", "/v1/chat/completions", {**CHAT, "stream": False})
    err = json.loads(raw)["error"]
    assert (status, err["leg"], err["backend"]) == (502, "pd", dead)
    assert err["message"].startswith(f"pd backend {dead} failed")


def test_e_pd_health_names_the_pools_and_models_come_from_the_instance(fakes, epd_front):  # noqa: F811
    e, pd = fakes("E", post=e_answer), fakes("PD", post=d_json)
    srv = epd_front([e.url], [pd.url])
    status, _, raw = call(srv, "GET", "/health")
    h = json.loads(raw)
    assert (status, h["status"], h["connector"], h["ready"]) == (200, "ok", "none", True)
    assert sorted((b["role"], b["url"]) for b in h["backends"]) == [("encoder", e.url), ("pd", pd.url)]
    status, _, raw = call(srv, "GET", "/v1/models")
    assert status == 200 and json.loads(raw)["data"] == [{"id": "PD"}]
    pd.health = 503
    status, _, raw = call(srv, "GET", "/health")
    assert status == 503 and [b["healthy"] for b in json.loads(raw)["backends"] if b["role"] == "pd"] == [False]


def test_cli_instance_option():
    cfg = R.parse_args(["--instance", "http://a:1", "--instance", "http://a:2", "--encoder", "http://e:3"])
    assert (cfg.connector, cfg.prefills, cfg.decodes) == (None, (), ())
    assert [b.url for b in cfg.instances] == ["http://a:1", "http://a:2"]
    assert [b.url for b in cfg.encoders] == ["http://e:3"]


@pytest.mark.parametrize("argv,message", [
    (["--instance", "http://a:1", "--connector", "nixl"],
     "--instance runs prefill and decode in one instance: give it without --prefill, --decode and --connector"),
    (["--instance", "http://a:1", "--decode", "http://b:2"],
     "--instance runs prefill and decode in one instance: give it without --prefill, --decode and --connector"),
    (["--instance", "a:1/v1"], "--instance: 'a:1/v1': give the server's base URL without a path"),
    (["--prefill", "http://a:1", "--decode", "http://b:2"],
     "give --connector with --prefill/--decode (or --instance URL for E -> PD)"),
])
def test_cli_instance_bad_usage_exits_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        R.parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
