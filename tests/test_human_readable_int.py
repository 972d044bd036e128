"""``validate --serve-arg max_model_len=32k``: human-readable integers are read by vLLM's own
``human_readable_int`` when vLLM is importable, else by omni-pd's fallback, and the two agree
(issue 24, "also left": ``check_serve_args`` moved to omni_pd/check/serve_flags.py and had
only its own parser).

TABLE holds what vLLM 0.30's ``human_readable_int`` / ``human_readable_int_or_auto``
(vllm/utils/argparse_utils.py) answer for each input, None where they raise (ValueError or
argparse.ArgumentTypeError); read off the oracle venv and checked against it below.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from omni_pd.check import serve_flags
from omni_pd.check.serve_flags import own_human_readable_int, read_human_readable_int, vllm_human_readable_int

ROOT = Path(__file__).resolve().parents[1]
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")

#: (input, human_readable_int(input), human_readable_int_or_auto(input)); None: refused
TABLE = [
    ("1k", 1000, 1000), ("1K", 1024, 1024), ("2M", 2097152, 2097152), ("2m", 2000000, 2000000),
    ("25.6k", 25600, 25600), ("1.5G", None, None), ("1.5g", 1500000000, 1500000000),
    ("1T", 1099511627776, 1099511627776), ("1t", 10**12, 10**12), ("32k", 32000, 32000), ("8K", 8192, 8192),
    ("2048", 2048, 2048), (" 4k ", 4000, 4000), ("-1", -1, -1), ("auto", None, -1), ("AUTO", None, -1),
    ("4x", None, None), ("k", None, None), ("1.5", None, None), ("1e3", None, None), ("1_000", 1000, 1000),
    ("+5", 5, 5), ("", None, None), ("1kk", None, None), ("0.0001k", 0, 0), ("1.5K", None, None),
    ("10.k", None, None), ("-2k", None, None),
]

_PROBE = """
import argparse, json, sys
from vllm.utils.argparse_utils import human_readable_int as h, human_readable_int_or_auto as ha
def ans(f, v):
    try:
        return f(v)
    except (ValueError, argparse.ArgumentTypeError):
        return None
print("HR-TABLE " + json.dumps([[v, ans(h, v), ans(ha, v)] for v in json.loads(sys.argv[1])]))
"""


def _answers(f, auto: bool) -> list:
    out = []
    for v, *_ in TABLE:
        try:
            out.append(f(v, auto))
        except ValueError:
            out.append(None)
    return out


def test_the_fallback_reads_the_table_as_vllm_does() -> None:
    assert _answers(own_human_readable_int, False) == [r[1] for r in TABLE]
    assert _answers(own_human_readable_int, True) == [r[2] for r in TABLE]


def test_vllm_in_this_interpreter_reads_the_table_as_the_fallback_does() -> None:
    pytest.importorskip("vllm.utils.argparse_utils")
    live = vllm_human_readable_int()
    assert live is not None
    assert _answers(lambda v, auto: (live[1] if auto else live[0])(v), False) == [r[1] for r in TABLE]
    assert _answers(lambda v, auto: live[1](v), True) == [r[2] for r in TABLE]


@pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")
def test_the_oracle_vllm_reads_the_table_as_the_fallback_does() -> None:
    proc = subprocess.run([ORACLE, "-c", _PROBE, json.dumps([r[0] for r in TABLE])], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("HR-TABLE ")), None)
    assert line, proc.stderr[-2000:]
    assert [tuple(r) for r in json.loads(line.split(" ", 1)[1])] == TABLE


def test_read_human_readable_int_asks_vllm_when_it_is_importable(monkeypatch) -> None:
    seen: list = []
    monkeypatch.setattr(serve_flags, "vllm_human_readable_int",
                        lambda: (lambda v: seen.append(("int", v)) or 7, lambda v: seen.append(("auto", v)) or 9))
    assert read_human_readable_int("max_num_batched_tokens", "1k") == 7
    assert read_human_readable_int("max_model_len", "1k") == 9
    assert seen == [("int", "1k"), ("auto", "1k")]


def test_read_human_readable_int_falls_back_and_answers_none_off_its_flags(monkeypatch) -> None:
    monkeypatch.setattr(serve_flags, "vllm_human_readable_int", lambda: None)
    got = [read_human_readable_int(k, v) for k, v in [
        ("max_num_batched_tokens", "8K"), ("max_model_len", "auto"), ("max_num_batched_tokens", "auto"),
        ("kv_cache_memory_bytes", "1.5G"), ("max_num_seqs", "2k"), ("max_model_len", 4096)]]
    assert got == [8192, -1, None, None, None, None]


def test_without_vllm_there_is_no_live_parser(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    vllm_human_readable_int.cache_clear()
    try:
        assert vllm_human_readable_int() is None
    finally:
        vllm_human_readable_int.cache_clear()


def test_check_serve_args_lives_in_serve_flags_and_validate_uses_that_one() -> None:
    from omni_pd.check import validate

    assert serve_flags.check_serve_args.__module__ == "omni_pd.check.serve_flags"
    assert validate.check_serve_args is serve_flags.check_serve_args
    assert not hasattr(validate, "_human_readable_int") and not hasattr(validate, "_scalar_field")
    assert serve_flags.check_serve_args({"max_model_len": "32k", "max_num_batched_tokens": "8K"}) == (
        {"max_model_len": 32000, "max_num_batched_tokens": 8192}, [])
