"""``omni-pd validate --against-vllm-omni``: ask the real vllm-omni about a file.

Side-effect edge: finds an interpreter where vllm-omni is importable and runs
``python -m omni_pd.upstream.vllm_oracle`` there (see that module for what vllm-omni code it
calls), then turns its answer into diagnostics:

* OPD950 (info): vllm-omni resolves the file; pipeline, stages and PD pair it found.
* OPD951 (error): vllm-omni refuses the file; its exception is the message.
* OPD952 (error, exit 2): vllm-omni cannot be run; the help says how to install it.
* OPD953 (info): the file's pipeline runs on plain ``vllm serve``, not on vllm-omni, so
  nothing is run (:func:`plain_vllm_pipeline`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from omni_pd.diagnostics import Diagnostic, Location, OmniPdError, Severity

INSTALL_HELP = ("install it next to omni-pd: `pip install vllm-omni==0.30.0` (with a matching vLLM), "
                "or point at an environment that has both: `--vllm-omni-python /path/to/venv/bin/python` "
                "(on a CPU-only machine, `bash .ci/oracle_venv.sh` in an omni-pd checkout builds one)")


def find_python(explicit: str | None) -> str | None:
    """The interpreter to run vllm-omni in: ``explicit``, else this one when
    ``vllm_omni`` is importable, else ``$OMNI_PD_ORACLE_PYTHON``; None if none."""
    if explicit:
        return explicit
    if importlib.util.find_spec("vllm_omni") is not None:
        return sys.executable
    return os.environ.get("OMNI_PD_ORACLE_PYTHON") or None


def _unavailable(message: str) -> OmniPdError:
    return OmniPdError(Diagnostic(code="OPD952", severity=Severity.ERROR, message=message, help=INSTALL_HELP))


def plain_vllm_pipeline(path: Path, pipeline: str | None) -> Diagnostic | None:
    """OPD953 (info, at the top of ``path``) when omni-pd's catalogue says ``pipeline``
    is a plain vLLM one (``Pipeline.runtime == "vllm"``: ``llm``, ``llm_pd``, the
    ``*_1e1pd``/``*_1e1p1d`` encoder layouts), else None. vllm-omni registers no such
    pipeline (its resolver raises KeyError "Pipeline 'llm_pd' ... is not registered"),
    and ``omni-pd launch`` serves it with one ``vllm serve`` per engine, so asking
    vllm-omni says nothing about the file. Pipelines vllm-omni registers (or omni-pd's
    plugin registers in it, e.g. ``*_thinker_only_pd``) are still checked, even when
    launch serves them with plain vLLM: vllm-omni 0.30.0 accepts those.
    Reads the catalogue only (omni_pd/compile/pipelines.py)."""
    from omni_pd.compile.pipelines import load_catalogue

    pipe = load_catalogue().get(pipeline) if pipeline else None
    if pipe is None or pipe.runtime != "vllm":
        return None
    return Diagnostic(
        code="OPD953", severity=Severity.INFO, location=Location(file=str(path), line=1, column=1),
        message=f"pipeline `{pipe.name}` runs on plain `vllm serve` (omni-pd launch starts one vLLM engine per "
                "stage), not on vllm-omni: --against-vllm-omni does not apply and nothing was run",
        help=f"check the launch instead: `omni-pd launch {path} --model M --dry-run`")


#: what ``progress`` hears before the oracle speaks (its import takes most of the 20-30 s)
STARTING = "starting {py}: vLLM and vllm-omni are imported there (20-30 s on a laptop CPU)"
_ORACLE_PREFIX = "omni-pd-oracle: "


def _run(argv: list[str], timeout_s: float, progress: Callable[[str], None] | None) -> tuple[int, str, str]:
    """Run the oracle: (exit status, stdout, stderr). With ``progress``, the oracle is
    asked for ``--progress`` and each ``omni-pd-oracle: STEP`` line of its stderr is
    passed to ``progress`` (without the prefix) as it arrives (one stream, so in order);
    stdout is read whole (the oracle's JSON lines). Raises
    ``subprocess.TimeoutExpired`` after ``timeout_s`` seconds (the process is killed) and
    ``OSError`` when it cannot start."""
    if progress is None:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        return proc.returncode, proc.stdout, proc.stderr
    import threading

    proc = subprocess.Popen([*argv, "--progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out: list[str] = []
    err: list[str] = []

    def read_out() -> None:
        out.append(proc.stdout.read())  # type: ignore[union-attr]

    def read_err() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            if line.startswith(_ORACLE_PREFIX):
                progress(line[len(_ORACLE_PREFIX):].rstrip("\n"))
            else:
                err.append(line)

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for t in readers:
        t.start()
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    finally:
        for t in readers:
            t.join(timeout=5)
    return rc, "".join(out), "".join(err)


def against_vllm_omni(path: Path, *, python: str | None = None, model: str | None = None,
                      model_type: str = "qwen3_omni_moe", timeout_s: float = 600.0,
                      pipeline: str | None = None,
                      progress: Callable[[str], None] | None = None) -> list[Diagnostic]:
    """Run vllm-omni's resolver and PD checks on ``path``; returns OPD950 or OPD951, or
    OPD953 without running anything when ``pipeline`` (omni-pd's catalogue name for the
    file) runs on plain vLLM (:func:`plain_vllm_pipeline`).

    ``model``: what ``vllm serve`` would get (default: a config-only directory of
    ``model_type``). Raises :class:`OmniPdError` OPD952 (exit 2) when no interpreter
    with vllm-omni (and omni-pd, whose plugin registers the ``*_pd`` pipelines) is
    found or it cannot import them; ``timeout_s`` bounds the run (seconds). ``progress``
    (e.g. a rich status's update) is told what is being done, in words, as it starts:
    the interpreter started, then each step the oracle announces (:func:`_run`).
    """
    skip = plain_vllm_pipeline(path, pipeline)
    if skip is not None:
        return [skip]
    py = find_python(python)
    if py is None:
        raise _unavailable("vllm-omni is not importable here and no --vllm-omni-python was given")
    argv = [py, "-m", "omni_pd.upstream.vllm_oracle", "--model-type", model_type, str(path)]
    if model:
        argv[4:4] = ["--model", model]
    if progress is not None:
        progress(STARTING.format(py=py))
    try:
        rc, stdout, stderr = _run(argv, timeout_s, progress)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise _unavailable(f"could not run vllm-omni with {py}: {e}") from None
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    if not lines or "error" in lines[0] or rc != 0:
        why = lines[0].get("error") if lines and "error" in lines[0] else (stderr.strip().splitlines() or ["?"])[-1]
        raise _unavailable(f"vllm-omni could not be loaded by {py}: {why}")
    header, result = lines[0], lines[1]
    where = Location(file=str(path), line=1, column=1)
    ver = header.get("vllm_omni", "?")
    verdict = result.get("verdict", "?")
    if verdict.startswith("valid"):
        stages = result.get("stages") or []
        roles = ", ".join(f"{s[0]}{' prefill' if s[1] else ''}{' decode' if s[2] else ''}" for s in stages)
        pair = result.get("pair")
        msg = (f"vllm-omni {ver} accepts the file: pipeline `{result.get('pipeline')}`, stages {roles}; "
               + (f"PD pair {pair[0]} -> {pair[1]} passes its PD validation" if pair else "no PD pair"))
        notes = []
        if result.get("deploy_stage_ids") and len(result["deploy_stage_ids"]) != len(stages):
            notes.append(f"the file has stages {result['deploy_stage_ids']} but the pipeline runs "
                         f"{[s[0] for s in stages]}: the others are silently ignored")
        if pair and result.get("detect_on_typed") is None:
            notes.append(f"vllm-omni {ver}'s serve path will not switch PD on: its detector reads fields its typed "
                         "stage configs lack and omni-pd's compatibility layer is not installed (off, or refused: "
                         "see the warning vllm-omni logs; docs/upstream/README.md)")
        elif pair and result.get("detect_raw") is None:
            notes.append(f"vllm-omni {ver}'s own detector misses the pair on the serve path's typed stage configs; "
                         "omni-pd's compatibility layer switches PD on (docs/upstream/vllm-omni-0.30-pd-detection.md)")
        return [Diagnostic(code="OPD950", severity=Severity.INFO, message=msg, location=where, notes=notes)]
    return [Diagnostic(code="OPD951", severity=Severity.ERROR,
                       message=f"vllm-omni {ver} refuses the file ({result.get('step')}): {verdict}",
                       location=where, help="the located omni-pd diagnostics above say what to change")]
