"""vllm-ascend's layerwise push protocol (`omni_pd.launch.ascend_proxy`) against fake
prefill/decode servers that follow vllm-ascend 0.23.0.post1's code:

* fake decode (``MooncakeLayerwiseConnector`` kv_consumer): needs ``kv_transfer_params``
  ``{do_remote_prefill: true, do_remote_decode: false, metaserver}`` (400 naming what is
  missing otherwise), POSTs the 13 fields of ``update_state_after_alloc`` to the
  metaserver with ``request_id`` = ``cmpl-<X-Request-Id>-0`` / ``chatcmpl-<X-Request-Id>``,
  then waits for the pushed KV and answers;
* fake prefill: needs decode's message as ``kv_transfer_params`` plus one token and no
  stream (400 naming what is wrong otherwise), "pushes" (sets the KV event) and answers.

Each test runs one event loop (asyncio.run) with the fakes and the proxy on port 0.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import ClientSession, web

from omni_pd.launch.ascend_proxy import (
    METASERVER_FIELDS, PushProxy, api_request_id, build_app, decode_body, missing_fields, prefill_body)


class World:
    """Shared state of one test's fakes: KV pushed per request id, what each fake saw."""

    def __init__(self, decode_calls_metaserver: bool = True, prefill_mode: str = "ok"):
        self.kv: dict[str, asyncio.Event] = {}
        self.seen: dict[str, list[dict[str, Any]]] = {"prefill": [], "decode": []}
        self.decode_calls_metaserver = decode_calls_metaserver
        self.prefill_mode = prefill_mode
        self.decode_cancelled = asyncio.Event()
        self.metaserver_answer: int | None = None
        self.cancelled_before_teardown = False


def _fail(msg: str) -> web.Response:
    return web.json_response({"error": msg}, status=400)


def fake_decode(w: World) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        w.seen["decode"].append({"path": request.path, "body": body,
                                 "headers": {k.lower(): v for k, v in request.headers.items()}})
        kv = body.get("kv_transfer_params") or {}
        wrong = [k for k, v in (("do_remote_prefill", True), ("do_remote_decode", False)) if kv.get(k) is not v]
        if wrong or not kv.get("metaserver"):
            return _fail(f"decode: kv_transfer_params wrong or missing: {wrong or ['metaserver']}")
        xrid = request.headers.get("X-Request-Id")
        if not xrid:
            return _fail("decode: no X-Request-Id")
        rid = f"cmpl-{xrid}-0" if request.path == "/v1/completions" else f"chatcmpl-{xrid}"
        ev = w.kv.setdefault(rid, asyncio.Event())
        try:
            if w.decode_calls_metaserver:
                msg = dict(token_ids=[], request_id=rid, do_remote_prefill=False, do_remote_decode=True,
                           remote_block_ids=[[4, 5]], remote_block_size=[128], remote_engine_id="omni-thinker-decode",
                           remote_host="10.0.0.2", remote_port=36002, remote_tp_size=2, remote_pcp_size=1,
                           remote_dcp_size=1, remote_cached_tokens=0)
                async with ClientSession() as s:
                    async with s.post(kv["metaserver"], json=msg) as r:
                        w.metaserver_answer = r.status
            await ev.wait()  # the pushed KV
        except asyncio.CancelledError:
            w.decode_cancelled.set()
            raise
        if body.get("stream"):
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await out.prepare(request)
            for tok in ("Hel", "lo"):
                await out.write(f"data: {json.dumps({'choices': [{'text': tok}]})}\n\n".encode())
            await out.write(b"data: [DONE]\n\n")
            return out
        return web.json_response({"id": rid, "choices": [{"text": "Hello"}], "usage": {"completion_tokens": 2}})

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    app.router.add_post("/v1/chat/completions", handle)
    return app


def fake_prefill(w: World) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        w.seen["prefill"].append({"path": request.path, "body": body,
                                  "headers": {k.lower(): v for k, v in request.headers.items()}})
        kv = body.get("kv_transfer_params") or {}
        missing = missing_fields(kv)
        if missing or kv.get("do_remote_decode") is not True:
            return _fail(f"prefill: kv_transfer_params lacks {missing or ['do_remote_decode: true']}")
        if (body.get("max_tokens"), body.get("min_tokens"), body.get("stream")) != (1, 1, False):
            return _fail("prefill: expected max_tokens 1, min_tokens 1, stream false")
        if w.prefill_mode == "500":
            return web.json_response({"error": "HCCL error"}, status=500)
        if w.prefill_mode == "drop":  # dies mid-transfer: the connection goes away
            request.transport.close()
            await asyncio.sleep(0.2)
            return web.Response()
        w.kv.setdefault(kv["request_id"], asyncio.Event()).set()
        return web.json_response({"choices": [{"text": "H"}], "kv_transfer_params": None})

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    app.router.add_post("/v1/chat/completions", handle)
    return app


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    # vLLM aborts a request whose client went away: the fakes' handlers are cancelled too
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def _scenario(w: World, path: str, body: dict[str, Any], *, metaserver_timeout: float = 5.0):
    runners = []
    try:
        r, p_url = await _serve(fake_prefill(w))
        runners.append(r)
        r, d_url = await _serve(fake_decode(w))
        runners.append(r)
        # the proxy needs its own URL before it listens: bind, then tell it
        proxy = PushProxy([p_url], [d_url], "http://127.0.0.1:0", metaserver_timeout=metaserver_timeout)
        app = build_app(proxy)
        r, x_url = await _serve(app)
        runners.append(r)
        proxy.metaserver_url = x_url + "/v1/metaserver"
        async with ClientSession() as s:
            async with s.post(x_url + path, json=body, headers={"Authorization": "Bearer k"}) as resp:
                status, raw = resp.status, await resp.read()
            # was decode's request cancelled by the proxy (before anything is torn down)?
            try:
                await asyncio.wait_for(w.decode_cancelled.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
            w.cancelled_before_teardown = w.decode_cancelled.is_set()
            return status, raw
    finally:
        for r in reversed(runners):
            await r.cleanup()


def test_push_flow_decode_first_then_prefill_via_the_metaserver() -> None:
    w = World()
    body = {"model": "m", "prompt": "hi", "max_tokens": 50, "max_completion_tokens": 50,
            "stream_options": {"include_usage": True}, "stream": False}
    status, raw = asyncio.run(_scenario(w, "/v1/completions", body))
    assert status == 200, raw
    d, p = w.seen["decode"][0], w.seen["prefill"][0]
    xrid = d["headers"]["x-request-id"]
    assert json.loads(raw)["id"] == f"cmpl-{xrid}-0"
    assert d["body"]["kv_transfer_params"]["metaserver"].endswith("/v1/metaserver")
    assert d["body"]["max_tokens"] == 50 and d["headers"]["authorization"] == "Bearer k"
    assert p["headers"]["x-request-id"] == xrid and p["headers"]["authorization"] == "Bearer k"
    assert (p["body"]["max_tokens"], p["body"]["min_tokens"], p["body"]["max_completion_tokens"],
            p["body"]["stream"]) == (1, 1, 1, False)
    assert "stream_options" not in p["body"]
    assert p["body"]["kv_transfer_params"]["remote_engine_id"] == "omni-thinker-decode"
    assert w.metaserver_answer == 200


def test_push_flow_streams_chat_answers() -> None:
    w = World()
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    status, raw = asyncio.run(_scenario(w, "/v1/chat/completions", body))
    assert status == 200
    assert raw.decode().count("data: ") == 3 and raw.decode().endswith("data: [DONE]\n\n")
    assert w.seen["prefill"][0]["body"]["kv_transfer_params"]["request_id"].startswith("chatcmpl-")


def test_decode_that_never_calls_the_metaserver_gives_504_and_is_cancelled() -> None:
    w = World(decode_calls_metaserver=False)
    status, raw = asyncio.run(_scenario(w, "/v1/completions", {"prompt": "hi"}, metaserver_timeout=0.5))
    err = json.loads(raw)["error"]
    assert status == 504 and err["leg"] == "decode"
    assert "did not call the metaserver within 0.5 s" in err["message"]
    assert w.seen["prefill"] == []
    assert w.cancelled_before_teardown  # its connection was closed: vLLM aborts the request


def test_prefill_failing_gives_502_naming_it_and_cancels_decode() -> None:
    for mode in ("500", "drop"):
        w = World(prefill_mode=mode)
        status, raw = asyncio.run(_scenario(w, "/v1/completions", {"prompt": "hi"}))
        err = json.loads(raw)["error"]
        assert status == 502 and err["leg"] == "prefill", (mode, raw)
        assert err["message"].startswith(f"prefill {err['backend']} failed: "), mode
        if mode == "500":
            assert "HTTP 500" in err["message"]
        assert w.cancelled_before_teardown, mode


def test_pure_bodies_and_ids() -> None:
    assert api_request_id("/v1/completions", "abc") == "cmpl-abc-0"
    assert api_request_id("/v1/chat/completions", "abc") == "chatcmpl-abc"
    assert decode_body({"prompt": "x"}, "http://r:8000/v1/metaserver")["kv_transfer_params"] == {
        "do_remote_decode": False, "do_remote_prefill": True, "metaserver": "http://r:8000/v1/metaserver"}
    p = prefill_body({"prompt": "x", "max_tokens": 9, "stream": True}, {"a": 1})
    assert p == {"prompt": "x", "max_tokens": 1, "min_tokens": 1, "stream": False, "kv_transfer_params": {"a": 1}}
    assert missing_fields({k: 0 for k in METASERVER_FIELDS if k != "remote_port"}) == ["remote_port"]


def test_metaserver_fields_are_the_extracted_ones() -> None:
    from omni_pd.compile import ascend

    assert list(METASERVER_FIELDS) == ascend.facts()["extracted"]["0.23.0.post1"]["push_metaserver_fields"]["value"]


def test_router_command_serves_the_push_protocol_for_the_layerwise_connector() -> None:
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "omni_pd.launch.router", "--connector", "MooncakeLayerwiseConnector",
                             "--port", str(port), "--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:9"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    health = json.loads(r.read())
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise AssertionError(proc.stderr.read().decode() if proc.poll() is not None else "router did not answer")
        assert health["connector"] == "MooncakeLayerwiseConnector"
        assert (health["prefill_instances"], health["decode_instances"]) == (1, 1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_router_command_bad_usage_exits_2() -> None:
    import pytest

    from omni_pd.launch.router.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--connector", "MooncakeLayerwiseConnector", "--prefill", "http://127.0.0.1:9"])
    assert e.value.code == 2


def test_router_pull_strategy_for_ascend_mooncake_is_vllm_ascends_proxy_contract() -> None:
    from omni_pd.launch.router.protocol import connector_class

    cls = connector_class("MooncakeConnectorV1")
    s = cls([])
    assert cls.name == "MooncakeConnectorV1" and not cls.concurrent
    assert s.prefill_kv_params("r", None) == {"do_remote_decode": True, "do_remote_prefill": False,
                                              "remote_engine_id": None, "remote_block_ids": None,
                                              "remote_host": None, "remote_port": None}
    p_answer = {"kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "p", "remote_port": 36000}}
    assert s.decode_kv_params("r", None, p_answer) == p_answer["kv_transfer_params"]
    assert connector_class("mooncake").name == "MooncakeConnector"  # the vLLM one keeps its shorthand


def test_push_front_refuses_a_port_outside_the_tcp_range(capsys) -> None:
    """``--port 70000`` is a usage error (exit 2), not an OverflowError from ``bind`` (issue 16)."""
    import pytest

    from omni_pd.launch.ascend_proxy import main

    with pytest.raises(SystemExit) as e:
        main(["--port", "70000", "--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:10"])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith("error: --port 70000 is outside 0..65535\n")
