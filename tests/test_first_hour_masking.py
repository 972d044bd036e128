"""``launch --dry-run`` masks secrets by name, never engine arguments (issue 24, item 5).

The secret pattern matched ``TOKEN`` anywhere, so the plan showed
``--max-num-batched-tokens '***'`` (text and JSON): a real setting hidden from the user.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni_pd.cli import main
from omni_pd.launch.spec import ProcessSpec, is_secret

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, secret", [
    ("HF_TOKEN", True), ("HUGGING_FACE_HUB_TOKEN", True), ("VLLM_API_KEY", True), ("OPENAI_API_KEY", True),
    ("AWS_SECRET_ACCESS_KEY", True), ("AWS_SESSION_TOKEN", True), ("DB_PASSWORD", True), ("MY_SECRET", True),
    ("api_key", True), ("api-key", True), ("hf-token", True), ("s3-secret-access-key", True),
    # engine arguments and settings that only contain a secret-looking word
    ("max_num_batched_tokens", False), ("max-num-batched-tokens", False), ("MAX_NUM_BATCHED_TOKENS", False),
    ("tokenizer", False), ("tokenizer_mode", False), ("TOKENIZERS_PARALLELISM", False),
    ("long_prefill_token_threshold", False), ("ssl_keyfile", False), ("kv_cache_dtype", False),
    ("VLLM_MOONCAKE_BOOTSTRAP_PORT", False), ("skip_tokenizer_init", False),
])
def test_secret_names(name, secret):
    assert is_secret(name) is secret


def test_engine_arguments_are_shown_and_secret_flags_masked():
    p = ProcessSpec(name="x", argv=("vllm", "serve", "m", "--max-num-batched-tokens", "32768", "--tokenizer", "t",
                                    "--api-key", "sk-1", "--hf-token=hf_x", "--max-num-batched-tokens=8192"))
    assert p.masked_argv() == ["vllm", "serve", "m", "--max-num-batched-tokens", "32768", "--tokenizer", "t",
                               "--api-key", "***", "--hf-token=***", "--max-num-batched-tokens=8192"]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mask") / "pd.yaml"
    assert main(["expand", "--pipeline", "qwen3_omni_moe_thinker_only", "-q", "-o", str(out)]) == 0
    return out


def test_dry_run_json_shows_max_num_batched_tokens(compiled, capsys):
    capsys.readouterr()
    rc = main(["launch", str(compiled), "--model", "m", "--dry-run", "--format", "json", "--vllm", "/nonexistent/vllm",
               "--env", "HF_TOKEN=hf_secret_value", "--env", "TOKENIZERS_PARALLELISM=false"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "hf_secret_value" not in out
    prefill = json.loads(out)["processes"][0]
    argv = prefill["argv"]
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "32768"
    assert prefill["env"]["HF_TOKEN"] == "***" and prefill["env"]["TOKENIZERS_PARALLELISM"] == "false"


def test_dry_run_text_shows_max_num_batched_tokens(compiled, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one table row per line: the flag and its value side by side
    capsys.readouterr()
    rc = main(["launch", str(compiled), "--model", "m", "--dry-run", "--vllm", "/nonexistent/vllm"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "--max-num-batched-tokens 32768" in out and "***" not in out
