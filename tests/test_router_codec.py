"""The router's JSON codec (`omni_pd.launch.router.codec`): its two backends give the same
values; and the decode body splice (`omni_pd.launch.router.protocol.decode_request_bytes`):
the client's bytes with ``kv_transfer_params`` added are the same JSON value as the
re-encoded body."""

from __future__ import annotations

import json

import pytest

from omni_pd.launch.router import codec
from omni_pd.launch.router.protocol import decode_request_bytes


@pytest.mark.parametrize("loads,dumps", [(codec.std_loads, codec.std_dumps), (codec.loads, codec.dumps)],
                         ids=["json", "default"])
def test_codec_backends_agree(loads, dumps):
    value = {"a": [1, 2.5, None, True], "s": "é\u2028", "big": 2 ** 70, "n": {"x": {}}}
    assert loads(dumps(value)) == value
    assert dumps({"a": 1, "b": [1, 2]}) == b'{"a":1,"b":[1,2]}'
    assert loads(json.dumps({"k": "v"}).encode("utf-16")) == {"k": "v"}  # what json reads, both read
    with pytest.raises(ValueError):
        loads(b"{not json")


def test_decode_bytes_splice_is_the_same_value_as_the_re_encoded_body():
    kv = {"remote_engine_id": "p", "remote_block_ids": [[1, 2]]}
    raw = b'  {"model": "m", "prompt": "a}b", "n": 1}\n'
    body = json.loads(raw)
    out = decode_request_bytes(body, raw, kv)
    assert out == b'{"model": "m", "prompt": "a}b", "n": 1,"kv_transfer_params":' + codec.dumps(kv) + b"}"
    assert json.loads(out) == {**body, "kv_transfer_params": kv}
    assert decode_request_bytes(body, raw, None) is raw  # nothing to add: the client's bytes
    # re-encoded: the key already there, an empty object, UTF-16 text, no raw bytes
    for b, r in ((dict(body, kv_transfer_params={"x": 1}), json.dumps(dict(body, kv_transfer_params={"x": 1})).encode()),
                 ({}, b"{}"), (body, json.dumps(body).encode("utf-16-le")), (body, None)):
        out = decode_request_bytes(b, r, kv)
        assert json.loads(out) == {**b, "kv_transfer_params": kv} and out.startswith(b"{")
