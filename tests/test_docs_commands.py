"""Every ``omni-pd`` command of the README and docs/*.md runs as written (issue 36 item 5).

tests/test_readme_examples.py checks that each command and option a page names exists; this
file runs them. For each page, in a fresh directory that holds the clone's files (``tests/``,
``presets/``, ...) and the files a page tells the user to bring (``hosts.yaml`` as
docs/launch.md prints it, ``my_deploy.yaml``, ``config.json``), the page's ```bash lines run
in document order, as a user pastes them, through ``bash`` with this environment's
``omni-pd`` first on ``PATH``; each must exit 0. Pipes and ``&&`` chains run whole when every
program in them is here (``dot``, ``grep``), else their ``omni-pd`` part runs.

A line that cannot run on a test machine is not run, and :func:`why_not_run` says why (the
test prints the list with ``-rA``/``-s``); each such family has its own test:

- ``omni-pd launch`` without ``--dry-run`` starts engines: it runs here with ``--dry-run``
  added (the same options, the plan built, nothing started); the engines are run by
  tests/test_e2e_*.py.
- ``omni-pd status`` of a run directory or of URLs reads a running deployment
  (tests/test_e2e_cpu.py runs it); ``status --emit`` runs here.
- ``--against-vllm-omni`` needs vllm-omni installed (tests/test_oracle.py), ``size`` without
  ``--from-result`` needs AIConfigurator (tests/test_sizing_aic.py).
- Lines that are not omni-pd (``pip install``, ``git clone``, ``vllm serve``, ``curl``,
  ``kubectl``, ``bash .ci/run``, ``python -m pytest``, ``python bench/...``) belong to their
  tools.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from docs_pages import ROOT, fenced_blocks, page, page_names

#: the clone's entries a page's commands read by relative path
CLONE_ENTRIES = ("tests", "presets", "schemas", "bench", "docs", ".ci", "pyproject.toml")
#: programs a page pipes omni-pd's output into, run when installed
TOOLS = ("dot", "grep", "head", "tail", "wc", "jq")
#: the omni-pd executable of this environment (the console script next to the interpreter)
OMNI_PD = Path(sys.executable).with_name("omni-pd")


def strip_comment(line: str) -> str:
    """``line`` without its trailing ``# comment`` (a ``#`` outside quotes that starts a word)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def page_commands(name: str) -> list[tuple[str, str]]:
    """``(command, comment)`` for each shell command of page ``name``'s ```bash blocks, in order:
    continuation lines (ending in ``\\``) joined, blank lines dropped; ``comment`` is the text of
    the command's trailing comments and of the comment lines right after it (what the page says
    of that command, e.g. ``exit 1: ...`` or the ``error[...]`` it prints)."""
    out: list[tuple[str, str]] = []
    for block in fenced_blocks(page(name), "bash"):
        pending, notes = "", ""
        for raw in block.splitlines():
            line = strip_comment(raw)
            note = raw[len(line):].strip().lstrip("#").strip() if raw.strip() else ""
            if not line.strip():
                if note and out and not pending:
                    out[-1] = (out[-1][0], f"{out[-1][1]} {note}".strip())
                continue
            if line.endswith("\\"):
                pending += line[:-1].rstrip() + " "
                notes += " " + note
                continue
            out.append(((pending + line.strip()).strip(), (notes + " " + note).strip()))
            pending, notes = "", ""
    return out


def expected_exit(comment: str) -> int | None:
    """The exit status the page gives for a command: ``exit N`` in its comment; ``None``
    (any non-zero) when the page shows an ``error[...]`` it prints; else 0."""
    m = re.search(r"\bexit (\d)\b", comment)
    if m:
        return int(m.group(1))
    return None if "error[" in comment else 0


def _program(segment: str) -> str:
    """The program a shell segment runs (after ``VAR=value`` prefixes), or ``""``."""
    try:
        words = shlex.split(segment)
    except ValueError:
        return ""
    words = [w for w in words if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", w)]
    return words[0] if words else ""


def why_not_run(command: str) -> str | None:
    """Why ``command`` is not run here (one of the families of the module docstring), or None."""
    first = command.split("&&")[0].split("|")[0]
    program = _program(first)
    if program != "omni-pd":
        return f"not an omni-pd command ({program or command.split()[0]}): its tool's"
    words = shlex.split(first)
    sub = words[1] if len(words) > 1 else ""
    if sub == "status" and "--emit" not in words:
        return "reads a running deployment (tests/test_e2e_cpu.py runs status)"
    if "--against-vllm-omni" in words:
        return "needs vllm-omni installed (tests/test_oracle.py)"
    if sub == "size" and "--from-result" not in words:
        return "asks AIConfigurator (tests/test_sizing_aic.py)"
    return None


def runnable(command: str) -> str:
    """The shell text run for ``command``: ``launch`` gets ``--dry-run`` when it would start
    engines; a chain keeps the segments whose programs are here (``omni-pd`` and :data:`TOOLS`)."""
    kept = []
    for part in command.split("&&"):
        segments = part.split("|")
        if all(_program(s) == "omni-pd" or (_program(s) in TOOLS and shutil.which(_program(s)))
               for s in segments):
            kept.append(part.strip())
        elif _program(segments[0]) == "omni-pd":
            kept.append(segments[0].strip())
    text = " && ".join(kept)
    if re.match(r"omni-pd launch\b", text) and "--dry-run" not in text:
        text = text.replace(" --smoke", "") + " --dry-run"
    return text


def hosts_yaml() -> str:
    """The inventory docs/launch.md prints as ``# hosts.yaml`` (the user's two hosts)."""
    for block in fenced_blocks(page("docs/launch.md"), "yaml"):
        if block.startswith("# hosts.yaml"):
            return block
    raise AssertionError("docs/launch.md no longer prints hosts.yaml")


#: what a line that is not run leaves behind for the lines after it: the tiny-model scripts
#: write the model directory a later ``--model DIR`` names (``launch --dry-run`` reads nothing in it)
SIDE_EFFECTS = (re.compile(r"tests/e2e/make_tiny_\w+\.py\s+(\S+)"),)


def user_files(name: str, cwd: Path, wheel_deploy: Path | None) -> None:
    """Write the files page ``name`` tells the user to bring into ``cwd``: ``hosts.yaml``
    (docs/launch.md's), ``my_deploy.yaml`` (the preset with its ``pipeline:`` key, as docs/expand.md
    asks), ``config.json`` (the sizing fixture's model config), for docs/validate.md ``deploy/`` +
    ``extra.yaml`` (files to validate together; elsewhere ``deploy/`` is render's output), and
    ``qwen2_5_omni.yaml`` copied from vllm-omni's wheel (when the wheel is at hand)."""
    (cwd / "hosts.yaml").write_text(hosts_yaml())
    preset = (ROOT / "presets" / "qwen3_omni_moe.yaml").read_text()
    (cwd / "my_deploy.yaml").write_text("pipeline: qwen3_omni_moe\n" + preset)
    shutil.copy(ROOT / "tests" / "fixtures" / "sizing" / "qwen3_omni_config.json", cwd / "config.json")
    if name == "docs/validate.md":
        (cwd / "deploy").mkdir()
        shutil.copy(ROOT / "tests" / "fixtures" / "qwen3_omni_moe_cpu.yaml", cwd / "deploy" / "omni.yaml")
        shutil.copy(ROOT / "tests" / "fixtures" / "llm.yaml", cwd / "extra.yaml")
    if wheel_deploy is not None:
        shutil.copy(wheel_deploy / "qwen2_5_omni.yaml", cwd / "qwen2_5_omni.yaml")


def workdir(name: str, tmp_path: Path, wheel_deploy: Path | None) -> Path:
    """A directory that looks like the clone plus the files a page tells the user to bring."""
    for entry in CLONE_ENTRIES:
        if (ROOT / entry).exists():
            (tmp_path / entry).symlink_to(ROOT / entry)
    user_files(name, tmp_path, wheel_deploy)
    return tmp_path


PAGES = [n for n in page_names() if any(why_not_run(c) is None for c, _ in page_commands(n))]


@pytest.mark.parametrize("name", PAGES)
def test_every_command_of_a_page_runs_as_written(name, tmp_path, request):
    """Each runnable line of page ``name`` exits as the page says (0 unless its comment gives
    ``exit N`` or shows the ``error[...]`` it prints), in document order, in one directory."""
    wheel_deploy = None
    if any("qwen2_5_omni.yaml" in c for c, _ in page_commands(name)):
        try:
            wheel_deploy = request.getfixturevalue("omni_wheel_deploy_dir")
        except pytest.skip.Exception:
            wheel_deploy = None
    cwd = workdir(name, tmp_path, wheel_deploy)
    env = {**os.environ, "PATH": f"{OMNI_PD.parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "NO_COLOR": "1", "COLUMNS": "100"}
    failures, ran = [], 0
    for command, comment in page_commands(name):
        for effect in SIDE_EFFECTS:
            for made in effect.findall(command):
                (cwd / made).mkdir(parents=True, exist_ok=True)
        if why_not_run(command) or ("qwen2_5_omni.yaml" in command and wheel_deploy is None):
            continue
        text = runnable(command)
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", text], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=120)
        ran += 1
        want = expected_exit(comment)
        if proc.returncode != want and not (want is None and proc.returncode != 0):
            failures.append(f"$ {text}\nexit {proc.returncode}, the page says "
                            f"{'non-zero' if want is None else want}\n{(proc.stdout + proc.stderr)[-1500:]}")
    assert ran > 0
    assert not failures, f"{name}: {len(failures)} of {ran} commands failed\n\n" + "\n\n".join(failures)


def test_the_runner_reads_and_sorts_the_pages():
    """The page reader joins continuations and drops comments; the families are told apart."""
    readme = dict(page_commands("README.md"))
    assert readme["omni-pd expand -o pd.yaml"].startswith("the bundled Qwen3-Omni preset")
    # a continued line is one command
    assert any(c.startswith("omni-pd launch rehearsal/pd.yaml --model") and c.endswith("--port 8000 --smoke")
               for c in readme)
    migrate = next(n for c, n in readme.items() if c.startswith("omni-pd migrate tests/fixtures/legacy"))
    assert expected_exit(migrate) == 1
    assert expected_exit("error[OPD603]: ...") is None and expected_exit("the preset") == 0
    assert why_not_run("pip install -e '.[test]'").startswith("not an omni-pd command (pip)")
    assert why_not_run("omni-pd status --url prefill=http://x:1") is not None
    assert why_not_run("omni-pd status --emit grafana > d.json") is None
    assert runnable("omni-pd launch pd.yaml --model M --smoke") == "omni-pd launch pd.yaml --model M --dry-run"
    assert runnable("omni-pd render pd.yaml --to k8s/ && kubectl apply -k k8s/") == "omni-pd render pd.yaml --to k8s/"
    assert strip_comment("omni-pd expand -o pd.yaml   # the preset") == "omni-pd expand -o pd.yaml"
    assert strip_comment("echo '# not a comment' x") == "echo '# not a comment' x"
    # every page with bash lines has at least one line that runs here
    assert {"README.md", "docs/launch.md", "docs/validate.md", "docs/expand.md"} <= set(PAGES)
