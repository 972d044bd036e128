"""Build a tiny random-weight Qwen2 model with an offline tokenizer, for CPU serving tests.

    python tests/e2e/make_tiny_model.py OUT_DIR

Runs in the e2e venv's python (torch, transformers and tokenizers are there); needs no
network. The tokenizer is a 2048-token ByteLevel BPE trained on the running Python's own
stdlib ``*.py`` files; the model is a 2-layer Qwen2 (hidden 64, head_dim 32: the CPU
attention backend only takes some head sizes) with weights drawn at seed 0 and
``initializer_range=0.6`` (the default 0.02 makes greedy output repeat one token, which
would make an output-equality test weak). Same Python + same library versions -> same
bytes. Writes into OUT_DIR (created if missing) and prints it.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import sysconfig

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _corpus() -> list[str]:
    """Top-level stdlib modules, sorted so training sees them in a fixed order."""
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    if not files:
        raise SystemExit("no stdlib *.py files found to train the tokenizer on")
    return files


def build_tokenizer(out: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(_corpus(), trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {VOCAB_SIZE}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=1024,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: str, tok) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        initializer_range=0.6,
        bos_token_id=pad,
        eos_token_id=eos,
        pad_token_id=pad,
        dtype="float32",
    )
    with torch.no_grad():
        model = Qwen2ForCausalLM(cfg).to(torch.float32).eval()
    model.generation_config = GenerationConfig(bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="directory to write the model into")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    tok = build_tokenizer(out)
    build_model(out, tok)
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["hidden_size"] // cfg["num_attention_heads"] == 32, cfg
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
