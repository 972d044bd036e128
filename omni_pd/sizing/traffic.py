"""Traffic shape -> Thinker prompt tokens, from Qwen3-Omni's own processor arithmetic.

Facts (transformers 5.14.1 in the oracle venv, ``models/qwen3_omni_moe/processing_qwen3_omni_moe.py``):

- audio is resampled to 16 kHz (``Qwen3OmniMoeProcessorKwargs._defaults["audio_kwargs"]["sampling_rate"]``)
  and turned into Whisper log-mel frames, one per 160 samples (``WhisperFeatureExtractor`` ``hop_length=160``;
  the attention mask keeps ``samples // 160`` frames, ``feature_extraction_whisper.py``);
- the audio encoder emits 13 tokens per full chunk of ``2 * n_window = 100`` frames (one second) and
  ``ceil(ceil(ceil(r / 2) / 2) / 2)`` for the ``r`` frames left over (``_get_feat_extract_output_lengths``,
  three stride-2 convolutions), so 13 tokens per second of audio, not 12.5;
- an image becomes ``(h / 32) * (w / 32)`` placeholder tokens for a ``h x w`` image already resized to
  multiples of ``patch_size * spatial_merge_size = 16 * 2`` (``Qwen3OmniMoeVisionEncoderConfig``; the
  processor replaces the image token by ``image_grid_thw.prod() // merge_size**2``).

Each audio clip and image also carries its start/end marker tokens (2 each) in the chat template.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SAMPLING_RATE = 16000
HOP_LENGTH = 160
N_WINDOW = 50
TOKENS_PER_CHUNK = 13
IMAGE_FACTOR = 32
MARKERS = 2


def audio_tokens(seconds: float, n_window: int = N_WINDOW) -> int:
    """Audio-encoder output tokens for ``seconds`` of audio (one clip). Raises ValueError if negative."""
    if seconds < 0:
        raise ValueError(f"audio seconds must be >= 0, got {seconds}")
    frames = int(round(seconds * SAMPLING_RATE)) // HOP_LENGTH
    chunk = 2 * n_window
    rest = frames % chunk
    for _ in range(3):
        rest = -(-rest // 2)
    return (frames // chunk) * TOKENS_PER_CHUNK + rest


def image_tokens(width: int, height: int) -> int:
    """Vision tokens for one ``width x height`` image (pixels), rounded to the 32-pixel grid as
    ``smart_resize`` rounds; min/max pixel clamping is not applied. Raises ValueError if < 1."""
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    return max(1, round(width / IMAGE_FACTOR)) * max(1, round(height / IMAGE_FACTOR))


@dataclass(frozen=True)
class Traffic:
    """One request's shape: ``text_tokens`` of prompt text, audio clips (seconds each), images
    (``(width, height)`` pixels each), ``output_tokens`` the Thinker generates."""

    text_tokens: int
    output_tokens: int
    audio_seconds: tuple[float, ...] = ()
    images: tuple[tuple[int, int], ...] = field(default_factory=tuple)

    def breakdown(self) -> dict[str, int]:
        """Prompt tokens by source: ``{"text", "audio", "image", "markers"}``."""
        return {"text": self.text_tokens,
                "audio": sum(audio_tokens(s) for s in self.audio_seconds),
                "image": sum(image_tokens(w, h) for w, h in self.images),
                "markers": MARKERS * (len(self.audio_seconds) + len(self.images))}

    def isl(self) -> int:
        """The Thinker's input sequence length (tokens) AIConfigurator sizes for."""
        return sum(self.breakdown().values())
