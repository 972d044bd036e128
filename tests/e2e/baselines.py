"""The requests the CPU end-to-end tests send and the plain instance's answer to each,
computed once per pytest session.

Every e2e module compares a PD run with what one plain ``vllm serve`` of the same tiny
model answers to the same greedy request. The modules used to start that plain instance
each (five starts of two models per run, 30 to 65 s apiece on 2 cores). Here one plain
instance per model answers every request any module sends, then stops before the module
that asked first starts its own engines, so memory and cores hold one run at a time as
before. Greedy decoding with ``ignore_eos`` and a fixed ``max_tokens`` makes each answer a
function of the request alone (the modules' own controls, e.g. "the answers tell the
prompts apart", still run on the answers they read).

* :data:`LLM` / :func:`completion_body`: the ``/v1/completions`` requests of
  tests/test_e2e_cpu.py, test_e2e_two_hosts.py and test_e2e_xpyd.py (tiny ``qwen2``);
* :func:`thinker_chats` / :func:`chat_body`: the ``/v1/chat/completions`` requests of
  tests/test_e2e_omni_thinker.py and test_e2e_encoder.py (tiny ``qwen3_omni`` Thinker):
  text, audio and image, short (< one 128-token CPU KV block) and long;
* :class:`PlainAnswers`: the answers, looked up by request; a request no module declared
  here is a KeyError naming it (add it to the table, never answer it from somewhere else).

Standard library only, like :mod:`e2e.harness`.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import time
import wave
import zlib
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

from e2e.harness import PLAIN_FLAGS, PlainInstance, engine_env, post_json

#: vLLM's CPU KV block size (tokens): "long" prompts span several blocks, "short" ones less than one
BLOCK = 128

# --- the plain-vLLM pair (tiny qwen2) -------------------------------------------------------

#: > 128 tokens: whole KV blocks move (tests/test_e2e_cpu.py, test_e2e_two_hosts.py)
LONG = " ".join(f"def f{i}(x):\n    return x * {i} + {i % 7}" for i in range(40))
SHORT = "def hello_world(x):"
#: three long prompts that differ only late, and one short (tests/test_e2e_xpyd.py)
XPYD_PROMPTS = [" ".join(f"def g{i}_{k}(x):\n    return x * {i} - {k}" for i in range(36)) for k in range(3)] + [
    "def hello_world(x):"]
#: (prompt, max_tokens) of every completion request the llm modules compare
LLM: tuple[tuple[str, int], ...] = ((LONG, 24), (SHORT, 24), *((p, 16) for p in XPYD_PROMPTS))


def completion_body(prompt: str, max_tokens: int) -> dict:
    """One greedy ``/v1/completions`` body for the served name ``tiny``."""
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}


# --- the Qwen3-Omni Thinker (tiny qwen3_omni) -----------------------------------------------

#: the engine settings of tests/fixtures/qwen3_omni_moe_thinker_only_cpu.yaml, for the plain instance
THINKER_FLAGS = ("--max-model-len", "2048", "--max-num-seqs", "4", "--enforce-eager", "--dtype", "float32")
#: ~330 tokens: several KV blocks
THINKER_LONG = " ".join(f"def f{i}(x): return x * {i}" for i in range(30))


def wav_data_url(seconds: float = 1.0, rate: int = 16000) -> str:
    """A mono 16-bit WAV (two sines, 440 Hz and 97 Hz) of ``seconds`` at ``rate`` Hz, as a
    base64 string (stdlib ``wave``): the ``input_audio.data`` of a chat request."""
    n = int(seconds * rate)
    pcm = b"".join(struct.pack("<h", int(32767 * (0.3 * math.sin(2 * math.pi * 440 * i / rate)
                                                  + 0.1 * math.sin(2 * math.pi * 97 * i / rate))))
                   for i in range(n))
    buf = BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm)
    return base64.b64encode(buf.getvalue()).decode()


def png_data_url(height: int, width: int) -> str:
    """An RGB PNG of diagonal stripes, ``height`` x ``width`` pixels, as a
    ``data:image/png;base64,...`` URL (stdlib zlib)."""
    rows = []
    for y in range(height):
        row = bytearray(b"\x00")  # filter type 0
        for x in range(width):
            row += bytes(((7 * (x + y)) % 256, (7 * (height - y + x)) % 256, (5 * x + 3 * y) % 256))
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(png).decode()


def cases() -> dict[str, list[dict]]:
    """Six chat message contents: text / audio / image, each short (< 1 block) and long
    (the PD comparisons of tests/test_e2e_omni_thinker.py and the whole pipeline's,
    tests/test_e2e_omni_audio_pd.py)."""
    audio = {"type": "input_audio", "input_audio": {"data": wav_data_url(), "format": "wav"}}
    return {
        "text-short": [{"type": "text", "text": "def hello(x):"}],
        "text-long": [{"type": "text", "text": THINKER_LONG}],
        "audio-short": [audio, {"type": "text", "text": "What is it?"}],
        "audio-long": [audio, {"type": "text", "text": THINKER_LONG}],
        "image-short": [{"type": "image_url", "image_url": {"url": png_data_url(64, 96)}},
                        {"type": "text", "text": "What is it?"}],
        "image-long": [{"type": "image_url", "image_url": {"url": png_data_url(256, 256)}},
                       {"type": "text", "text": THINKER_LONG}],
    }


def thinker_chats() -> dict[str, list[dict]]:
    """:func:`cases` plus ``image-tall`` (a 96 x 64 image, the encoder test's tampered
    input): every chat content the Thinker modules compare."""
    return {**cases(), "image-tall": [{"type": "image_url", "image_url": {"url": png_data_url(96, 64)}},
                                      {"type": "text", "text": "What is it?"}]}


def chat_body(content: list[dict], max_tokens: int = 16) -> dict:
    """One greedy ``/v1/chat/completions`` body (one user message) for the served name ``tiny``."""
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}


def chat(base: str, content: list[dict], max_tokens: int = 16) -> tuple[str, int, float]:
    """One greedy chat completion against ``base``: (text, prompt tokens, seconds)."""
    t0 = time.monotonic()
    r = post_json(base + "/v1/chat/completions", chat_body(content, max_tokens))
    return r["choices"][0]["message"]["content"], r["usage"]["prompt_tokens"], time.monotonic() - t0


# --- the answers ----------------------------------------------------------------------------


def _key(body: dict) -> str:
    return json.dumps(body, sort_keys=True)


@dataclass
class PlainAnswers:
    """The plain instance's reply to each declared request body (``answers``: canonical
    JSON of the body -> the reply's JSON), its time to healthy (s), resident memory while
    serving (GiB) and the wall time of the whole baseline (s)."""

    model: str
    answers: dict[str, dict] = field(default_factory=dict)
    healthy_s: float | None = None
    rss_gib: float = 0.0
    total_s: float = 0.0

    def reply(self, body: dict) -> dict:
        """The reply to ``body``; KeyError naming it when no module declared it here."""
        try:
            return self.answers[_key(body)]
        except KeyError:
            raise KeyError(f"no plain {self.model} answer for {_key(body)[:200]}...: declare the request in "
                           "tests/e2e/baselines.py") from None

    def completion(self, prompt: str, max_tokens: int) -> str:
        """The text of the plain answer to :func:`completion_body` ``(prompt, max_tokens)``."""
        return self.reply(completion_body(prompt, max_tokens))["choices"][0]["text"]

    def chat(self, content: list[dict], max_tokens: int = 16) -> tuple[str, int]:
        """(text, prompt tokens) of the plain answer to :func:`chat_body` ``(content, max_tokens)``."""
        r = self.reply(chat_body(content, max_tokens))
        return r["choices"][0]["message"]["content"], r["usage"]["prompt_tokens"]


def answer_all(vllm: str, model: Path, port: int, tmp: Path, bodies: list[tuple[str, dict]], *,
               name: str, flags: tuple[str, ...] = PLAIN_FLAGS) -> PlainAnswers:
    """Start one plain instance of ``model`` on ``port`` (log ``tmp/plain.log``), POST each
    ``(path, body)`` of ``bodies`` in order, stop it (always) and return the replies.
    Raises what :class:`~e2e.harness.PlainInstance` and :func:`~e2e.harness.post_json` raise."""
    out = PlainAnswers(name)
    t0 = time.monotonic()
    with PlainInstance(vllm, model, port, engine_env(tmp), tmp / "plain.log", flags=flags) as plain:
        out.healthy_s = plain.healthy_s
        for path, body in bodies:
            out.answers[_key(body)] = post_json(plain.url + path, body)
        out.rss_gib = plain.rss_gib()
    out.total_s = round(time.monotonic() - t0, 1)
    print(f"\nplain {name}: healthy after {out.healthy_s} s, {out.rss_gib} GiB, {len(bodies)} answers, "
          f"{out.total_s} s in all")
    return out


def llm_answers(vllm: str, model: Path, port: int, tmp: Path) -> PlainAnswers:
    """The tiny qwen2's plain answer to every request of :data:`LLM`."""
    return answer_all(vllm, model, port, tmp, [("/v1/completions", completion_body(p, n)) for p, n in LLM],
                      name="qwen2")


def thinker_answers(vllm: str, model: Path, port: int, tmp: Path) -> PlainAnswers:
    """The tiny Qwen3-Omni Thinker's plain answer to every :func:`thinker_chats` content
    (``max_tokens`` 16), served with :data:`THINKER_FLAGS`."""
    return answer_all(vllm, model, port, tmp, [("/v1/chat/completions", chat_body(c))
                                               for c in thinker_chats().values()],
                      name="qwen3_omni thinker", flags=THINKER_FLAGS)
