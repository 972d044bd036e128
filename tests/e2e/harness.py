"""Helpers shared by the CPU end-to-end tests (tests/test_e2e_*.py).

Standard library only (the tests run under omni-pd's interpreter; the engines run in the
e2e venv, ``OMNI_PD_E2E_PYTHON``). Imported as ``e2e.harness`` (``tests/`` is on
``sys.path`` under pytest's default import mode).

* :func:`tiny_model_dir`: build a tiny random-weight model once per builder version into
  ``<repo>/.cache/e2e-models`` and reuse it (shared by every test module and run);
* HTTP: :func:`get`, :func:`post_json`, :func:`wait_health`;
* processes: :class:`Launcher` (``omni-pd launch`` as a child), :class:`PlainInstance`
  (one plain ``vllm serve``, the reference answers), :func:`descendants`,
  :func:`alive`, :func:`rss_bytes`, :func:`port_free`;
* metrics: :func:`prompt_tokens_by_source` (vLLM's ``vllm:prompt_tokens_by_source_total``);
* logs: :func:`wait_for_line` (a child's line in the launcher's run-dir log).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
E2E_DIR = Path(__file__).resolve().parent
#: tiny model name -> (builder script, files whose bytes decide the model)
BUILDERS = {
    "qwen2": ("make_tiny_model.py", ("make_tiny_model.py",)),
    "qwen3_omni": ("make_tiny_qwen3_omni.py", ("make_tiny_qwen3_omni.py", "make_tiny_model.py")),
    "qwen3_omni_full": ("make_tiny_qwen3_omni_full.py",
                        ("make_tiny_qwen3_omni_full.py", "make_tiny_qwen3_omni.py", "make_tiny_model.py")),
}
#: libraries whose versions decide the bytes a builder writes
_BUILD_LIBS = ("torch", "transformers", "tokenizers", "safetensors")


# --- tiny models -----------------------------------------------------------------------


def _site_packages(python: str) -> list[Path]:
    prefix = Path(python).resolve().parent.parent if Path(python).is_absolute() else None
    if prefix is None:
        return []
    return sorted(prefix.glob("lib/python3*/site-packages"))


def model_key(name: str, python: str) -> str:
    """16 hex digits naming one build of tiny model ``name``: sha256 of its builder
    sources, the interpreter path and the dist-info names of :data:`_BUILD_LIBS` in that
    interpreter's venv (so a library upgrade builds anew). Raises KeyError for an
    unknown ``name``."""
    _script, sources = BUILDERS[name]
    h = hashlib.sha256()
    for src in sources:
        h.update((E2E_DIR / src).read_bytes())
    h.update(os.path.realpath(python).encode())
    for sp in _site_packages(python):
        for lib in _BUILD_LIBS:
            h.update(" ".join(sorted(p.name for p in sp.glob(f"{lib}-*.dist-info"))).encode())
    return h.hexdigest()[:16]


def tiny_model_dir(name: str, python: str, cache: Path | None = None, timeout: float = 600) -> Path:
    """The directory of tiny model ``name`` (:data:`BUILDERS`), built by ``python``.

    Built once into ``cache`` (default ``<repo>/.cache/e2e-models``) as
    ``<name>-<model_key>``: a file lock serialises builders (other test processes may
    build the same model), the build goes to a temporary folder renamed into place when
    complete, so a reader never sees half a model. Raises ``subprocess.CalledProcessError``
    when the builder fails."""
    cache = cache or REPO / ".cache" / "e2e-models"
    cache.mkdir(parents=True, exist_ok=True)
    dest = cache / f"{name}-{model_key(name, python)}"
    if (dest / "config.json").is_file():
        return dest
    with open(cache / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / "config.json").is_file():
            return dest
        tmp = cache / f".{dest.name}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        script = E2E_DIR / BUILDERS[name][0]
        subprocess.run([python, str(script), str(tmp)], check=True, timeout=timeout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.rename(tmp, dest)
    return dest


# --- HTTP ------------------------------------------------------------------------------


def _opener():
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, timeout: float = 10) -> str:
    """GET ``url``; the body as text. Raises OSError/URLError."""
    with _opener().open(url, timeout=timeout) as r:
        return r.read().decode()


def post_json(url: str, body: dict, timeout: float = 300) -> dict:
    """POST ``body`` as JSON to ``url``; the decoded JSON answer. Raises OSError/URLError
    (HTTPError carries vLLM's error body)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with _opener().open(req, timeout=timeout) as r:
        return json.loads(r.read())


def stream_chat(base: str, content: list[dict], *, max_tokens: int = 64, model: str = "tiny",
                timeout: float = 600) -> dict:
    """One streamed greedy text+audio chat request (``stream: true``, ``modalities: ["text",
    "audio"]``), read event by event: ``{"ttft_s", "first_audio_s", "total_s"}`` (seconds from
    sending: the first text delta, the first audio chunk, the end), ``"text"`` (the deltas
    joined), ``"audio"`` (the audio chunks' ``delta.content`` strings in order: base64 WAV per
    chunk, as vllm-omni's chat server streams them), ``"prompt_tokens"`` (the usage event), or
    ``{"error": ...}`` for an HTTP failure. ``ignore_eos``: every answer is ``max_tokens`` long."""
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "modalities": ["text", "audio"], "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    first_text = first_audio = prompt = None
    text, audio = [], []
    try:
        with _opener().open(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                ev = json.loads(data)
                now = time.monotonic() - t0
                if (ev.get("usage") or {}).get("prompt_tokens"):
                    prompt = ev["usage"]["prompt_tokens"]
                for ch in ev.get("choices") or ():
                    c = (ch.get("delta") or {}).get("content")
                    if not c:
                        continue
                    if ev.get("modality") == "audio":
                        audio.append(c)
                        first_audio = now if first_audio is None else first_audio
                    else:
                        text.append(c)
                        first_text = now if first_text is None else first_text
    except Exception as e:  # noqa: BLE001 - a failed request is a recorded outcome
        detail = e.read().decode(errors="replace")[:500] if hasattr(e, "read") else ""
        return {"error": f"{e!r} {detail}".strip(), "total_s": round(time.monotonic() - t0, 2)}
    return {"ttft_s": first_text, "first_audio_s": first_audio, "total_s": time.monotonic() - t0,
            "text": "".join(text), "audio": audio, "prompt_tokens": prompt}


def wait_health(url: str, timeout: float, proc: subprocess.Popen | None = None) -> float:
    """Poll ``url`` until it answers; returns the seconds waited. Raises TimeoutError, or
    RuntimeError when ``proc`` exits first."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            get(url, 2)
            return time.monotonic() - t0
        except OSError:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode} before {url} answered") from None
            time.sleep(1)
    raise TimeoutError(url)


def wait_for_line(path: Path, needle: str, timeout: float = 60) -> bool:
    """True once ``needle`` appears in the text file ``path`` (polled every 0.2 s), False
    after ``timeout`` seconds. ``omni-pd launch`` copies each child's output into
    ``<run-dir>/<name>.log`` from a reader thread, so a line the engine printed before it
    answered may reach the file a moment after the answer (seconds on a loaded machine)."""
    t0 = time.monotonic()
    while True:
        try:
            if needle in path.read_text(errors="replace"):
                return True
        except OSError:
            pass
        if time.monotonic() - t0 >= timeout:
            return False
        time.sleep(0.2)


# --- metrics ---------------------------------------------------------------------------

def prompt_tokens_by_source(metrics_text: str, stage: str | None = None) -> dict[str, float]:
    """``{source: tokens}`` from vLLM's ``vllm:prompt_tokens_by_source_total`` counter
    (vllm/v1/metrics/loggers.py; sources ``local_compute``, ``local_cache_hit``,
    ``external_kv_transfer``), summed over engines. ``stage``: only the series of that
    vllm-omni stage (vllm-omni's ``OmniPrometheusStatLogger`` labels each series ``stage`` +
    ``replica``; one server page holds every stage's); None: every series."""
    from omni_pd.launch.smoke import samples

    out: dict[str, float] = {}
    for name, labels, value in samples(metrics_text):
        if name == "vllm:prompt_tokens_by_source_total" and (stage is None or labels.get("stage") == stage):
            out[labels["source"]] = out.get(labels["source"], 0.0) + value
    return out


# --- processes -------------------------------------------------------------------------


def port_free(port: int) -> bool:
    """No listener on the port (SO_REUSEADDR, as servers bind: TIME_WAIT does not count)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().split(")")[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def descendants(roots: set[int]) -> list[int]:
    """Every live process that is one of ``roots`` or has one of them as an ancestor."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        pid = p = int(d)
        for _ in range(20):
            if p in roots:
                if alive(pid):
                    found.append(pid)
                break
            p = _ppid(p)
            if p is None or p <= 1:
                break
    return found


def rss_bytes(pids: list[int]) -> int:
    """Sum of ``VmRSS`` over ``pids`` (bytes; processes gone meanwhile count 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def engine_env(tmp: Path) -> dict[str, str]:
    """Env of every CPU engine: offline, 1 GiB KV cache, no thread pinning (several
    engines share 2 cores), vLLM's compile cache in ``tmp``, loopback, and no vLLM
    plugins (keeps vllm-omni's general plugin out of plain ``vllm serve``)."""
    return {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
            "VLLM_HOST_IP": "127.0.0.1", "VLLM_PLUGINS": ""}


#: an engine's output line as the launcher relays it: ``[prefill-0] ...``
_ENGINE_LINE = re.compile(r"^\[[\w.-]+\] ")
#: words of an engine line worth showing when a run failed (before teardown's noise)
_ERROR_WORDS = re.compile(r"Traceback|Error|ERROR|Exception|failed|Killed|timed? ?out", re.I)


class Launcher:
    """``omni-pd launch PD --platform cpu`` as a child process; a thread collects its output.

    ``router_port``: the client port; ``engine_port_base``: prefill's HTTP port (decode:
    +100); ``env``: passed to every engine with ``--env``; ``extra``: more launch flags
    (e.g. ``--smoke``, ``--inventory F --host A``); ``prefix``: what the command runs under
    (e.g. ``ip netns exec NS`` for one simulated host).
    """

    def __init__(self, pd: Path, model: Path, vllm: str, run_dir: Path, *, router_port: int,
                 engine_port_base: int, env: dict[str, str], served_model_name: str = "tiny",
                 extra: tuple[str, ...] = (), prefix: tuple[str, ...] = ()):
        argv = [*prefix, sys.executable, "-m", "omni_pd.cli", "launch", str(pd), "--model", str(model),
                "--served-model-name", served_model_name, "--platform", "cpu", "--vllm", vllm,
                "--port", str(router_port), "--engine-port-base", str(engine_port_base),
                "--run-dir", str(run_dir), "--ready-timeout", "600", "--grace", "15", *extra]
        for k, v in env.items():
            argv += ["--env", f"{k}={v}"]
        self.run_dir = run_dir
        self.lines: list[str] = []
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, needle: str, timeout: float) -> str:
        """The first output line containing ``needle``; AssertionError (with the last
        lines) when the launcher exits or ``timeout`` seconds pass first."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            for line in list(self.lines):
                if needle in line:
                    return line
            if self.proc.poll() is not None:
                time.sleep(0.5)
                raise AssertionError(f"launcher exited {self.proc.returncode}:\n{self.report()}")
            time.sleep(0.5)
        raise AssertionError(f"no {needle!r} within {timeout} s:\n{self.report()}")

    def stop(self, timeout: float = 120) -> int:
        """SIGINT the launcher (if still running) and wait for it: its exit status (130
        after a clean teardown). Killed after ``timeout`` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def report(self, tail: int = 30) -> str:
        """What explains a failed run, for an assertion message: the launcher's own lines
        (everything not prefixed ``[<process>]``: readiness, failure reports, ``smoke:``
        results), the first engine lines that name an error, then the last ``tail`` lines.
        Teardown prints dozens of lines per engine, so the tail alone hides the cause."""
        lines = list(self.lines)
        own = [ln for ln in lines if not _ENGINE_LINE.match(ln) or ln.startswith("[omni-pd]")]
        errors = [ln for ln in lines if _ENGINE_LINE.match(ln) and _ERROR_WORDS.search(ln)][:40]
        return "\n".join(["-- launcher --", *own[-80:], "-- first engine errors --", *errors,
                          f"-- last {tail} lines --", *lines[-tail:]])

    def pids(self) -> dict[str, int]:
        """Process name -> pid, from the run dir's ``pids`` file."""
        out = {}
        for line in (self.run_dir / "pids").read_text().splitlines():
            pid, name = line.split(maxsplit=1)
            out[name] = int(pid)
        return out

    def descendants(self) -> list[int]:
        """Every live process whose ancestry reaches a child of the launcher."""
        return descendants(set(self.pids().values()))


#: flags of the plain reference instance: the engine settings of tests/fixtures/llm.yaml
PLAIN_FLAGS = ("--max-model-len", "1024", "--enforce-eager", "--dtype", "float32")


class PlainInstance:
    """One plain ``vllm serve MODEL`` (no KV connector) on ``port``: the reference answers
    the PD runs must equal. Started in its own session (process group); :meth:`stop`
    SIGKILLs the whole group, so no engine core outlives it.

    ``env``: added to ``os.environ`` (:func:`engine_env`); ``log``: its stdout and stderr;
    ``flags``: engine flags (default :data:`PLAIN_FLAGS`). As a context manager it starts,
    waits for ``/health`` (``ready_timeout`` seconds; the log's tail is printed when it
    fails) and stops on exit. :attr:`healthy_s`: seconds to healthy; :meth:`rss_gib`:
    resident memory of the server and its engine core (GiB).
    """

    def __init__(self, vllm: str, model: Path, port: int, env: dict[str, str], log: Path, *,
                 flags: tuple[str, ...] = PLAIN_FLAGS, served_model_name: str = "tiny",
                 ready_timeout: float = 600):
        self.argv = [vllm, "serve", str(model), "--host", "127.0.0.1", "--port", str(port),
                     "--served-model-name", served_model_name, *flags]
        self.env, self.log, self.ready_timeout = env, log, ready_timeout
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.healthy_s: float | None = None

    def start(self) -> "PlainInstance":
        """Start the server without waiting (to overlap its start with other work)."""
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.argv, env={**os.environ, **self.env}, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_ready(self) -> float:
        """Wait for ``/health``; the seconds waited. Prints the log's tail and raises
        (TimeoutError, RuntimeError when the server exited) on failure."""
        try:
            self.healthy_s = round(wait_health(self.url + "/health", self.ready_timeout, self.proc), 1)
        except Exception:
            print(self.log.read_text(errors="replace")[-4000:])
            raise
        return self.healthy_s

    def rss_gib(self) -> float:
        return round(rss_bytes(descendants({self.proc.pid})) / 2**30, 2) if self.proc else 0.0

    def stop(self) -> None:
        """SIGKILL the server's process group and reap it (idempotent)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            self.proc.wait()

    def __enter__(self) -> "PlainInstance":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
