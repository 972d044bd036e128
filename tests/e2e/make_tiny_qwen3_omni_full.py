"""Build a tiny random-weight Qwen3-Omni checkpoint with all three stages (Thinker, Talker, Code2Wav).

    python tests/e2e/make_tiny_qwen3_omni_full.py OUT_DIR [--check]

The three-stage sibling of tests/e2e/make_tiny_qwen3_omni.py (Thinker only), for serving
the whole vllm-omni 0.30 pipeline on CPU (``vllm serve OUT_DIR --omni``). Runs in the e2e
venv's python; needs no network. Same Thinker architecture as the sibling (MoE text model
4 experts top-2, hidden 64, interleaved M-RoPE, vision tower with deepstack, audio
encoder), plus what vllm-omni's Talker and Code2Wav hard-code
(shared/reference/cpu_omni_pipeline.md, "The tiny model"):

* **real special-token ids**: ``stage_input_processors/qwen3_omni.py``
  ``_compute_talker_prompt_ids_length`` looks for ``<|im_start|>`` 151644 and the role
  tokens ``system`` 8948, ``user`` 872, ``assistant`` 77091 in the Thinker's prompt ids,
  and ``models/qwen3_omni/qwen3_omni.py`` fixes ``<|audio_start|>`` 151669, ``<tts_pad>``
  151671, ``<tts_text_bos>`` 151672, ``<tts_text_eod>`` 151673 and ``<|audio_pad|>``
  151675; with other ids the Talker's prompt has length 0 and its scheduler asserts. So the
  tokenizer keeps Qwen's id layout: 151,680 ids, every Qwen3-Omni special token at its id
  (:data:`SPECIAL_IDS`), the role words as single tokens at their ids. The BPE part is
  trained on the running Python's stdlib (as the sibling); every other id is a filler
  token no merge produces (``"ĠĠ<id>"``, decoded as two spaces and the id), so a random
  Thinker's output decodes.
* **a chat template that writes the media placeholders**: vllm-omni's unified
  ``Qwen3OmniMoeForConditionalGeneration`` has no ``get_placeholder_str``, so with a template
  that takes string content vLLM inserts no placeholder and every audio or image request fails
  ("Failed to apply prompt replacement"); :data:`CHAT_TEMPLATE` loops over the content parts,
  as Qwen3-Omni's own template does.
* **Talker** (``talker_config``): codec ids as the real checkpoint (pad 2148, bos 2149,
  eos 2150 = the stop token of ``models/qwen3_omni/pipeline.py``, nothink 2155, think
  bos/eos 2156/2157, speakers 2301-2303), 16 code groups, ``accept_hidden_layer`` 1 (the
  Thinker's last layer), ``thinker_hidden_size`` 64, ``spatial_merge_size`` (read by
  transformers 5.14's Talker). MoE text model of 2 layers (4 experts top-2, hidden 64,
  codec vocabulary 3072), a 1-layer code predictor (vocabulary 2048).
* **Code2Wav** (``code2wav_config``): 16 quantizers of 2048 codes (the reshape in
  ``qwen3_omni.py`` ``talker2code2wav``), hidden 64, 1 transformer layer, decoder width
  64, upsampling 8*5*4*3*2*2 = 1920 samples per codec frame (24 kHz).
* **initialisation that separates prompts**: random weights at the default scale give a
  near-silent waveform (RMS about 2e-5) that is the same for every prompt, so an equality
  test of the audio could not see a conditioning bug. The Thinker and Talker use
  ``initializer_range`` 0.6 (as the sibling's Thinker: different prompts give different
  greedy tokens, hidden states and codec codes); Code2Wav uses :data:`CODE2WAV_INIT`
  and a layer scale of 1.0, so its waveform follows the codes (``--check`` measures it).
* **audio that is a function of the Talker's greedy codes only**: the Talker's first
  codebook is greedy (temperature 0), but vllm-omni 0.30's code predictor draws the other 15
  codebooks by Gumbel-max over top-k 50 / top-p 0.8 (``models/common/qwen3_code_predictor.py``
  ``CodePredictorWrapper``, "stored" sampling mode, defaults fixed in ``__init__``) from the
  worker's global torch RNG, whatever the request's sampling parameters or seed. Those draws
  depend on which requests share a step, so a waveform built from them differs between two
  runs that batch requests differently, and no test could compare concurrent requests. The
  builder therefore zeroes the code predictor's 15 codec embeddings (the Talker's next input,
  ``summed_embeddings``, is then layer 0's embedding alone) and Code2Wav's embedding rows of
  quantizers 1..15, with quantizer 0's rows scaled by 16 to keep the level
  (``Qwen3OmniCode2Wav.forward`` takes the mean over the 16 quantizers): the residual codes are
  still drawn and still reach Code2Wav, but change nothing, and the waveform is a
  deterministic function of the conditioning the Talker got.

Weights: the HF ``Qwen3OmniMoeForConditionalGeneration`` ``state_dict`` (``thinker.*``,
``talker.*``, ``code2wav.*``), float32, seed 0; vllm-omni loads each stage's part. About
20.0M Thinker (the 151,680 x 64 embedding and LM head), 4.5M Talker, 2.3M Code2Wav
parameters. ``--check`` also runs the HF Code2Wav on two different code sequences and
fails unless both waveforms are loud enough and differ. Same Python + same library
versions -> same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_model import _corpus  # noqa: E402  (same tokenizer corpus)
from make_tiny_qwen3_omni import EXTRA_SPECIAL, HIDDEN, MERGE  # noqa: E402
from make_tiny_qwen3_omni import audio_config, build_processor, vision_config  # noqa: E402

VOCAB_SIZE = 151680          # Qwen3-Omni's Thinker vocabulary (ids 151643.. are special tokens)
BPE_SIZE = 2048              # trained BPE tokens (the rest of the ids are fillers)
#: Qwen3-Omni's special tokens at their ids (the checkpoint's tokenizer_config.json layout)
SPECIAL_IDS = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646, "<|object_ref_end|>": 151647, "<|box_start|>": 151648, "<|box_end|>": 151649,
    "<|quad_start|>": 151650, "<|quad_end|>": 151651, "<|vision_start|>": 151652, "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654, "<|image_pad|>": 151655, "<|video_pad|>": 151656,
    "<|audio_start|>": 151669, "<|audio_end|>": 151670, "<tts_pad>": 151671, "<tts_text_bos>": 151672,
    "<tts_text_eod>": 151673, "<tts_text_bos_single>": 151674, "<|audio_pad|>": 151675,
}
#: role words upstream looks up by id (stage_input_processors/qwen3_omni.py:80-83)
ROLE_IDS = {"system": 8948, "user": 872, "assistant": 77091}
#: the processor's attribute names -> token (Qwen3OmniMoeProcessor.__init__ reads them)
EXTRA = {"image_token": "<|image_pad|>", "audio_token": "<|audio_pad|>", "video_token": "<|video_pad|>",
         "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>",
         "audio_bos_token": "<|audio_start|>", "audio_eos_token": "<|audio_end|>"}
#: Talker codec ids of the real checkpoint; 2150 is the Talker's stop token (pipeline.py:62)
CODEC = dict(codec_pad_id=2148, codec_bos_id=2149, codec_eos_token_id=2150, codec_nothink_id=2155,
             codec_think_bos_id=2156, codec_think_eos_id=2157)
#: ChatML that renders content parts itself, as Qwen3-Omni's own template does: vllm-omni's
#: unified Qwen3OmniMoeForConditionalGeneration defines no get_placeholder_str, so vLLM's
#: "string" content format would insert no media placeholder (the request then fails with
#: "Failed to apply prompt replacement for mm_items['audio'][0]"); a template that loops over
#: message['content'] makes vLLM pass the parts ("openai" format) and the template writes each
#: placeholder where its part is
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'text' -%}{{- part['text'] -}}"
    "{%- elif part['type'] in ('audio', 'input_audio', 'audio_url') -%}"
    "{{- '<|audio_start|><|audio_pad|><|audio_end|>' -}}"
    "{%- elif part['type'] in ('image', 'image_url', 'image_pil') -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] in ('video', 'video_url') -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
SPEAKERS = {"chelsie": 2301, "ethan": 2302, "aiden": 2303}
NUM_CODE_GROUPS = 16         # quantizers: Talker code groups = Code2Wav num_quantizers
THINKER_INIT = 0.6           # as the sibling: greedy output that varies with the prompt
TALKER_INIT = 0.6
CODE2WAV_INIT = 0.1          # with layer scale 1.0: RMS about 0.5, 5 % clipped; 0.05 gives 5e-4, 0.2 a square wave


def _filler(i: int) -> str:
    return f"ĠĠ{i}"


def build_tokenizer():
    """A ByteLevel BPE tokenizer over Qwen3-Omni's 151,680-id layout (module docstring)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=BPE_SIZE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    base.train(_corpus(), trainer)
    model = json.loads(base.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    # each role word must come out of BPE as one token: add the merges that join its pieces
    for word in ROLE_IDS:
        pieces = [t.value for t in base.model.tokenize(word)]
        while len(pieces) > 1:
            a, b = pieces[0], pieces[1]
            merges.append((a, b))
            vocab.setdefault(a + b, len(vocab))
            pieces = [a + b] + pieces[2:]
    # lay the ids out: role words and specials at their ids, trained tokens in order on the
    # free ids, fillers on the rest
    pinned = {**ROLE_IDS, **SPECIAL_IDS}
    taken = set(pinned.values())
    ids: dict[str, int] = dict(pinned)
    free = (i for i in range(VOCAB_SIZE) if i not in taken)
    for tok_str, _ in sorted(vocab.items(), key=lambda kv: kv[1]):
        if tok_str not in ids:
            ids[tok_str] = next(free)
    for i in free:
        if _filler(i) in ids:
            raise SystemExit(f"filler {_filler(i)!r} collides with a trained token")
        ids[_filler(i)] = i
    if len(ids) != VOCAB_SIZE or sorted(ids.values()) != list(range(VOCAB_SIZE)):
        raise SystemExit(f"tokenizer layout has {len(ids)} ids, wanted 0..{VOCAB_SIZE - 1}")
    tok = Tokenizer(models.BPE(vocab=ids, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(list(SPECIAL_IDS))
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
        model_max_length=32768, extra_special_tokens=EXTRA)
    fast.chat_template = CHAT_TEMPLATE
    for k in EXTRA_SPECIAL:
        if getattr(fast, k, None) != EXTRA[k]:
            raise SystemExit(f"tokenizer attribute {k} is {getattr(fast, k, None)!r}, wanted {EXTRA[k]!r}")
    for s, i in SPECIAL_IDS.items():
        if fast.convert_tokens_to_ids(s) != i:
            raise SystemExit(f"{s} has id {fast.convert_tokens_to_ids(s)}, wanted {i}")
    prompt = fast.apply_chat_template([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}],
                                      add_generation_prompt=True, tokenize=False)
    parts = fast.apply_chat_template([{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "hi"}]}],
                                     add_generation_prompt=True, tokenize=False)
    if parts != "<|im_start|>user\n<|audio_start|><|audio_pad|><|audio_end|>hi<|im_end|>\n<|im_start|>assistant\n":
        raise SystemExit(f"chat template renders content parts as {parts!r}")
    got = fast(prompt)["input_ids"]
    for word, i in ROLE_IDS.items():
        if i not in got:
            raise SystemExit(f"role token {word!r} ({i}) missing from the encoded chat prompt {got}")
    return fast


def build_config():
    from transformers import Qwen3OmniMoeConfig

    s = SPECIAL_IDS
    text = dict(
        vocab_size=VOCAB_SIZE, hidden_size=HIDDEN, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=HIDDEN // 2,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=True,
        max_position_embeddings=32768, initializer_range=THINKER_INIT, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [6, 5, 5],
                         "interleaved": True, "mrope_interleaved": True},
        pad_token_id=s["<|endoftext|>"], eos_token_id=s["<|im_end|>"], bos_token_id=s["<|endoftext|>"],
    )
    vision, audio = vision_config(), audio_config()  # the Thinker-only builder's
    media = dict(audio_token_id=s["<|audio_pad|>"], image_token_id=s["<|image_pad|>"],
                 video_token_id=s["<|video_pad|>"], audio_start_token_id=s["<|audio_start|>"],
                 vision_start_token_id=s["<|vision_start|>"], position_id_per_seconds=25)
    thinker = dict(
        text_config=text, vision_config=vision, audio_config=audio, **media,
        audio_end_token_id=s["<|audio_end|>"], vision_end_token_id=s["<|vision_end|>"],
        user_token_id=ROLE_IDS["user"], tie_word_embeddings=False, initializer_range=THINKER_INIT,
    )
    talker_text = dict(
        vocab_size=3072, hidden_size=HIDDEN, intermediate_size=128, moe_intermediate_size=32,
        shared_expert_intermediate_size=64,  # the Talker MoE has a shared expert; its config class has no default
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=HIDDEN // 2,
        num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=True,
        max_position_embeddings=32768, initializer_range=TALKER_INIT, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [6, 5, 5],
                         "interleaved": True, "mrope_interleaved": True},
    )
    predictor = dict(
        vocab_size=2048, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=HIDDEN // 2, max_position_embeddings=32768,
        initializer_range=TALKER_INIT, num_code_groups=NUM_CODE_GROUPS,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )
    talker = dict(
        text_config=talker_text, code_predictor_config=predictor, num_code_groups=NUM_CODE_GROUPS,
        thinker_hidden_size=HIDDEN, accept_hidden_layer=1, **CODEC, **media, speaker_id=SPEAKERS,
        spatial_merge_size=MERGE,  # transformers 5.14's Talker reads it (real checkpoints carry it)
        initializer_range=TALKER_INIT,
    )
    code2wav = dict(
        codebook_size=2048, hidden_size=HIDDEN, num_attention_heads=2, num_key_value_heads=2,
        intermediate_size=128, num_hidden_layers=1, num_quantizers=NUM_CODE_GROUPS, sliding_window=72,
        upsample_rates=[8, 5, 4, 3], upsampling_ratios=[2, 2], decoder_dim=64,
        layer_scale_initial_scale=1.0, initializer_range=CODE2WAV_INIT, max_position_embeddings=8000,
    )
    cfg = Qwen3OmniMoeConfig(
        thinker_config=thinker, talker_config=talker, code2wav_config=code2wav, enable_audio_output=True,
        im_start_token_id=s["<|im_start|>"], im_end_token_id=s["<|im_end|>"], tts_pad_token_id=s["<tts_pad>"],
        tts_bos_token_id=s["<tts_text_bos>"], tts_eos_token_id=s["<tts_text_eod>"],
        system_token_id=ROLE_IDS["system"], user_token_id=ROLE_IDS["user"],
        assistant_token_id=ROLE_IDS["assistant"],
    )
    cfg.architectures = ["Qwen3OmniMoeForConditionalGeneration"]
    cfg.dtype = "float32"
    return cfg


def build_weights(out: str, cfg) -> dict[str, int]:
    """Write ``model.safetensors``; parameters per stage prefix."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3OmniMoeForConditionalGeneration

    torch.manual_seed(0)
    with torch.no_grad():
        model = Qwen3OmniMoeForConditionalGeneration(cfg).to(torch.float32).eval()
        # transformers 5.14's _init_weights initialises the Thinker's fused experts but not the
        # Talker's (Qwen3OmniMoeTalkerTextExperts is created with torch.empty), which left
        # whatever memory held in them: seed them like the Thinker's so the file is the same
        # bytes on every build
        std = cfg.talker_config.text_config.initializer_range
        for m in model.modules():
            if type(m).__name__ == "Qwen3OmniMoeTalkerTextExperts":
                m.gate_up_proj.normal_(0.0, std)
                m.down_proj.normal_(0.0, std)
        # the residual codebooks (drawn from the worker's shared RNG) carry no signal
        for emb in model.talker.code_predictor.model.codec_embedding:
            emb.weight.zero_()
        c2w = model.code2wav.code_embedding.weight  # (16 * 2048, H), quantizer q at rows q*2048..
        codes = cfg.code2wav_config.codebook_size
        c2w[:codes] *= NUM_CODE_GROUPS
        c2w[codes:] = 0.0
    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    counts: dict[str, int] = {}
    for k, v in sd.items():
        counts[k.split(".", 1)[0]] = counts.get(k.split(".", 1)[0], 0) + v.numel()
    save_file(sd, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    return counts


def check_code2wav(out: str) -> tuple[float, float, float]:
    """RMS of the HF Code2Wav's waveforms for two different random code sequences, and
    the RMS of their difference. Raises SystemExit when either is near-silent or they are
    (nearly) the same: the tiny model would then hide conditioning bugs."""
    import torch
    from safetensors.torch import load_file
    from transformers import Qwen3OmniMoeConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    cfg = Qwen3OmniMoeConfig.from_pretrained(out)
    c2w = Qwen3OmniMoeCode2Wav(cfg.code2wav_config).eval()
    sd = {k.split(".", 1)[1]: v for k, v in load_file(os.path.join(out, "model.safetensors")).items()
          if k.startswith("code2wav.")}
    c2w.load_state_dict(sd)
    g = torch.Generator().manual_seed(1)
    a, b = (torch.randint(0, 2048, (1, NUM_CODE_GROUPS, 12), generator=g) for _ in range(2))
    with torch.no_grad():
        wa, wb = c2w(a), c2w(b)
    rms = lambda t: float(t.float().pow(2).mean().sqrt())  # noqa: E731
    ra, rb, rd = rms(wa), rms(wb), rms(wa - wb)
    if min(ra, rb) < 1e-2 or rd < 1e-2:
        raise SystemExit(f"Code2Wav waveform too quiet or prompt-independent: rms {ra:.2e} / {rb:.2e}, "
                         f"difference {rd:.2e}")
    return ra, rb, rd


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="directory to write the model into")
    ap.add_argument("--check", action="store_true", help="also check the Code2Wav waveform follows the codes")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers import GenerationConfig

    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    tok = build_tokenizer()
    cfg = build_config()
    proc = build_processor(tok)
    proc.chat_template = CHAT_TEMPLATE
    proc.save_pretrained(out)
    cfg.save_pretrained(out)
    s = SPECIAL_IDS
    GenerationConfig(bos_token_id=s["<|endoftext|>"], eos_token_id=s["<|im_end|>"],
                     pad_token_id=s["<|endoftext|>"]).save_pretrained(out)
    counts = build_weights(out, cfg)
    with open(os.path.join(out, "config.json")) as f:
        saved = json.load(f)
    assert saved["enable_audio_output"] is True and saved["architectures"] == ["Qwen3OmniMoeForConditionalGeneration"]
    assert saved["talker_config"]["codec_eos_token_id"] == 2150 and saved["code2wav_config"]["num_quantizers"] == 16
    assert saved["talker_config"].get("spatial_merge_size") == MERGE, saved["talker_config"].get("spatial_merge_size")
    print(f"{out} (" + ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in counts.items()) + " parameters)", file=sys.stderr)
    if args.check:
        ra, rb, rd = check_code2wav(out)
        print(f"code2wav: rms {ra:.3f} / {rb:.3f}, difference {rd:.3f}", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
