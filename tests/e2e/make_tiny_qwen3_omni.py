"""Build a tiny random-weight Qwen3-Omni checkpoint (thinker weights only), for CPU serving tests.

    python tests/e2e/make_tiny_qwen3_omni.py OUT_DIR

Runs in the e2e venv's python (torch, transformers 5.14, tokenizers; torchvision only
matters when images are processed later); needs no network. What it writes is what vLLM
0.30 loads for ``Qwen3OmniMoeForConditionalGeneration``: its registry maps that
architecture to ``Qwen3OmniMoeThinkerForConditionalGeneration``
(vllm/model_executor/models/registry.py) and the loader skips ``talker.*`` and
``code2wav.*`` weights, so only the thinker carries weights.

* ``config.json``: a full ``Qwen3OmniMoeConfig`` (talker and code2wav at their defaults,
  ``enable_audio_output`` false). Thinker text: MoE, 4 experts top-2, 2 layers, hidden 64,
  2 heads / 1 KV head (head_dim 32: the CPU attention backend takes only some head sizes),
  interleaved M-RoPE ``mrope_section [6, 5, 5]`` (sums to head_dim / 2). Vision: depth 2,
  hidden 64, patch 16, merge 2, deepstack ``[1]``, and ``image_size 256`` +
  ``apply_vit_abs_pos_embed true``: vLLM's vision tower reads both
  (``Qwen3Omni_VisionTransformer.__init__``) but transformers 5.14's config class no
  longer defines them (real checkpoints carry them); ``num_position_embeddings`` =
  (256 / 16)^2 so HF's and vLLM's position tables have the same shape. Audio encoder:
  2 layers, d_model 64, 128 mel bins. Token ids point into the tokenizer below.
* ``model.safetensors``: the HF thinker's ``state_dict`` under a ``thinker.`` prefix
  (fused 3-D expert tensors; vLLM's loader splits them), float32, seed 0. The text
  model's ``initializer_range`` is 0.6: with 0.02 greedy output repeats one token, which
  makes an output-equality test weak.
* tokenizer: a 2048-token ByteLevel BPE trained on the running Python's stdlib ``*.py``
  (as tests/e2e/make_tiny_model.py) plus Qwen3-Omni's special tokens, with
  ``extra_special_tokens`` naming ``image_token``, ``audio_token``, ``video_token`` and the
  vision/audio bos/eos tokens (``Qwen3OmniMoeProcessor.__init__`` reads them); a
  ChatML chat template with string content (vLLM puts each media placeholder,
  ``<|audio_start|><|audio_pad|><|audio_end|>`` or ``<|vision_start|><|image_pad|><|vision_end|>``,
  before the message text).
* processor: ``Qwen3OmniMoeProcessor`` = ``WhisperFeatureExtractor`` (128 mels, 16 kHz)
  + ``Qwen2VLImageProcessor`` / ``Qwen2VLVideoProcessor`` (patch 16, merge 2, at most
  256x256 pixels).

Same Python + same library versions -> same bytes. Writes into OUT_DIR (created if
missing) and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_model import _corpus  # noqa: E402  (same tokenizer corpus as the tiny Qwen2)

VOCAB_SIZE = 2048
SPECIAL = {
    "pad": "<|endoftext|>", "im_start": "<|im_start|>", "im_end": "<|im_end|>",
    "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
    "image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
    "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>", "audio_token": "<|audio_pad|>",
}
#: the keys Qwen3OmniMoeProcessor reads from the tokenizer
EXTRA_SPECIAL = ("image_token", "audio_token", "video_token", "vision_bos_token", "vision_eos_token",
                 "audio_bos_token", "audio_eos_token")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HIDDEN = 64
IMAGE_SIZE, PATCH, MERGE = 256, 16, 2


def build_tokenizer(out: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL.values()),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train(_corpus(), trainer)
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {VOCAB_SIZE}")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token=SPECIAL["im_end"], pad_token=SPECIAL["pad"],
        unk_token=None, model_max_length=2048,
        extra_special_tokens={k: SPECIAL[k] for k in EXTRA_SPECIAL},
    )
    fast.chat_template = CHAT_TEMPLATE
    for k in EXTRA_SPECIAL:  # the processor reads these attributes
        if getattr(fast, k, None) != SPECIAL[k]:
            raise SystemExit(f"tokenizer attribute {k} is {getattr(fast, k, None)!r}, wanted {SPECIAL[k]!r}")
    return fast


def vision_config() -> dict:
    """The tiny vision tower: depth 2, hidden HIDDEN, patch PATCH, merge MERGE, deepstack [1];
    ``image_size`` and ``apply_vit_abs_pos_embed`` are read by vLLM's vision tower
    (``Qwen3Omni_VisionTransformer.__init__``), not by transformers 5.14's config class."""
    return dict(
        depth=2, hidden_size=HIDDEN, intermediate_size=128, num_heads=2, patch_size=PATCH,
        spatial_merge_size=MERGE, temporal_patch_size=2, out_hidden_size=HIDDEN,
        num_position_embeddings=(IMAGE_SIZE // PATCH) ** 2, deepstack_visual_indexes=[1],
        image_size=IMAGE_SIZE, apply_vit_abs_pos_embed=True,
    )


def audio_config() -> dict:
    """The tiny audio encoder: 2 layers, d_model HIDDEN, 128 mel bins (Whisper features)."""
    return dict(
        num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128, d_model=HIDDEN,
        output_dim=HIDDEN, downsample_hidden_size=32, max_source_positions=1500, n_window=50,
        n_window_infer=800, conv_chunksize=500,
    )


def build_config(tok):
    from transformers import Qwen3OmniMoeConfig

    ids = {k: tok.convert_tokens_to_ids(v) for k, v in SPECIAL.items()}
    text = dict(
        vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=HIDDEN // 2,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=True,
        max_position_embeddings=2048, initializer_range=0.6,
        tie_word_embeddings=False,  # vLLM's thinker reads it from the text config; transformers 5.14 keeps it on the thinker
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [6, 5, 5],
                         "interleaved": True, "mrope_interleaved": True},
        pad_token_id=ids["pad"], eos_token_id=ids["im_end"], bos_token_id=ids["pad"],
    )
    vision, audio = vision_config(), audio_config()
    thinker = dict(
        text_config=text, vision_config=vision, audio_config=audio,
        audio_token_id=ids["audio_token"], image_token_id=ids["image_token"], video_token_id=ids["video_token"],
        audio_start_token_id=ids["audio_bos_token"], audio_end_token_id=ids["audio_eos_token"],
        vision_start_token_id=ids["vision_bos_token"], vision_end_token_id=ids["vision_eos_token"],
        user_token_id=ids["im_start"], position_id_per_seconds=25, tie_word_embeddings=False,
        initializer_range=0.6,
    )
    cfg = Qwen3OmniMoeConfig(
        thinker_config=thinker, enable_audio_output=False,
        im_start_token_id=ids["im_start"], im_end_token_id=ids["im_end"],
        tts_pad_token_id=ids["pad"], tts_bos_token_id=ids["pad"], tts_eos_token_id=ids["pad"],
        system_token_id=ids["im_start"], user_token_id=ids["im_start"], assistant_token_id=ids["im_start"],
    )
    cfg.architectures = ["Qwen3OmniMoeForConditionalGeneration"]
    cfg.dtype = "float32"
    return cfg, ids


def build_processor(tok):
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor, Qwen3OmniMoeProcessor, WhisperFeatureExtractor

    size = {"shortest_edge": 4 * (PATCH * MERGE) ** 2, "longest_edge": IMAGE_SIZE * IMAGE_SIZE}
    common = dict(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=2, size=size,
                  image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
    return Qwen3OmniMoeProcessor(
        image_processor=Qwen2VLImageProcessor(**common),
        video_processor=Qwen2VLVideoProcessor(**common),
        feature_extractor=WhisperFeatureExtractor(feature_size=128, sampling_rate=16000, return_attention_mask=True),
        tokenizer=tok, chat_template=CHAT_TEMPLATE,
    )


def build_weights(out: str, cfg) -> int:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

    torch.manual_seed(0)
    with torch.no_grad():
        thinker = Qwen3OmniMoeThinkerForConditionalGeneration(cfg.thinker_config).to(torch.float32).eval()
    sd = {f"thinker.{k}": v.detach().contiguous().clone() for k, v in thinker.state_dict().items()}
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return sum(v.numel() for v in sd.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="directory to write the model into")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import GenerationConfig

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    tok = build_tokenizer(out)
    cfg, ids = build_config(tok)
    build_processor(tok).save_pretrained(out)
    cfg.save_pretrained(out)
    GenerationConfig(bos_token_id=ids["pad"], eos_token_id=ids["im_end"], pad_token_id=ids["pad"]).save_pretrained(out)
    n = build_weights(out, cfg)
    with open(os.path.join(out, "config.json")) as f:
        saved = json.load(f)
    v = saved["thinker_config"]["vision_config"]
    assert v["image_size"] == IMAGE_SIZE and v["apply_vit_abs_pos_embed"] is True, v
    assert saved["architectures"] == ["Qwen3OmniMoeForConditionalGeneration"], saved["architectures"]
    print(f"{out} ({n} parameters)", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
