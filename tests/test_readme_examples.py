"""The shell examples of the README and of docs/*.md say what the code does (issue 13 item 8;
issue 24, "The README and the test command": the reference moved to docs/, its examples
stay tested on whichever page they now live).

A new user copies these lines: the metrics example must name decode's port as the launch
plan computes it, every example that reads ``pd.yaml`` must come after one that writes it
on the same page, every ``omni-pd`` command and option a bash block names must exist, and
the install line must be one that works (omni-pd is not on PyPI). Every docs page is
reachable from the README, and every relative link resolves.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from docs_pages import ROOT, fenced_blocks, page, page_names, pages_with, section
from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.io import load_file, parse_text
from omni_pd.launch.plan import LaunchOptions, plan_document

PAGES = page_names()
LAUNCH = "docs/launch.md"


def bash_lines(name: str) -> list[str]:
    """The lines of every ```bash block of page ``name``, in document order."""
    return [ln for block in fenced_blocks(page(name), "bash") for ln in block.splitlines()]


def cpu_run_block() -> str:
    return fenced_blocks(section(page(LAUNCH), "## A real PD run on a CPU-only machine"), "bash")[0]


def test_the_metrics_example_reads_decodes_port(tmp_path):
    """The CPU run expands tests/fixtures/llm.yaml with NIXL and launches it with default
    ports: decode-0's HTTP port is the one whose /metrics counts KV received from prefill."""
    block = cpu_run_block()
    assert "omni-pd expand tests/fixtures/llm.yaml --pipeline llm --connector NixlConnector" in block
    commands = "\n".join(ln for ln in block.splitlines() if not ln.lstrip().startswith("#"))
    assert "--engine-port-base" not in commands and "--port " not in commands  # default ports
    src = ROOT / "tests" / "fixtures" / "llm.yaml"
    res = expand_document(parse_text(src.read_text(), src.name), ExpandOptions(connector="NixlConnector"),
                          pipeline="llm")
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(res.text)
    plan = plan_document(load_file(cfg), str(cfg), LaunchOptions(model="/tmp/tiny")).plan
    ports = {p.role: next(u.port for u in p.ports if u.purpose == "http") for p in plan.processes}
    assert ports == {"prefill": 8100, "decode": 8200, "router": 8000}
    [port] = re.findall(r"curl -s 127\.0\.0\.1:(\d+)/metrics", block)
    assert int(port) == ports["decode"]
    assert "decode-0 listens on --engine-port-base + 100 = 8200, prefill-0 on 8100" in block
    [router] = re.findall(r"curl -s 127\.0\.0\.1:(\d+)/v1/completions", block)
    assert int(router) == ports["router"]


_WRITES = re.compile(r"omni-pd expand\b.*-o pd\.yaml")
_READS = re.compile(r"omni-pd (validate|launch|graph)\b[^#]*\spd\.yaml")


@pytest.mark.parametrize("name", PAGES)
def test_pd_yaml_is_written_before_an_example_reads_it(name):
    """On each page, the first example that reads ``pd.yaml`` comes after one that writes it
    (the same line counts when the write is first: ``expand ... -o pd.yaml && validate pd.yaml``)."""
    lines = bash_lines(name)
    reads = [(i, m.start()) for i, ln in enumerate(lines) if (m := _READS.search(ln))]
    writes = [(i, m.start()) for i, ln in enumerate(lines) if (m := _WRITES.search(ln))]
    if reads:
        assert writes and min(writes) < min(reads), (name, lines[min(reads)[0]])


def test_the_pd_yaml_examples_are_found():
    """The ordering test above reads the pages it should: README's Quick start writes and reads
    pd.yaml, and so do the validate, graph, launch and ascend pages."""
    for name in ("README.md", "docs/validate.md", "docs/graph.md", LAUNCH, "docs/ascend.md"):
        lines = bash_lines(name)
        assert any(_WRITES.search(ln) for ln in lines) and any(_READS.search(ln) for ln in lines), name


@pytest.mark.parametrize("name, heading", [(LAUNCH, "# `omni-pd launch`"), ("docs/graph.md", "# `omni-pd graph`")])
def test_the_command_pages_start_by_writing_pd_yaml(name, heading):
    first = fenced_blocks(section(page(name), heading), "bash")[0].splitlines()[0]
    assert re.match(r"omni-pd expand .*-o pd\.yaml", first), (name, first)


@pytest.mark.parametrize("name", PAGES)
def test_install_lines_work_without_omni_pd_on_pypi(name):
    """Every ``pip install`` a page shows installs omni-pd from the clone, never by its
    name from the package index (``omni-pd`` or ``omni-pd[extra]``), where it is not."""
    commands = re.findall(r"pip install ([^\n`#&]*)", page(name))
    by_name = [c for c in commands for arg in c.split() if re.fullmatch(r"['\"]?omni-pd(\[[\w,]+\])?['\"]?", arg)]
    assert by_name == []


def test_the_install_lines_are_read():
    commands = [c for name in PAGES for c in re.findall(r"pip install ([^\n`#&]*)", page(name))]
    assert len(commands) >= 5
    assert "git clone <this repository> omni-pd && pip install ./omni-pd vllm-omni" in page("README.md")
    assert "git clone <this repository> omni-pd && pip install ./omni-pd vllm-omni" in page("docs/plugin-and-oracle.md")


def test_ctrl_c_traceback_note():
    text = page(LAUNCH)
    assert "`EngineDeadError` traceback" in text and "not a failure of the run" in text


def test_the_opd101_example_is_what_validate_prints(tmp_path, capsys, monkeypatch):
    """docs/expand.md's diagnostic example (``my.yaml:3:27``) is validate's output for the
    file it shows, line for line (the verdict line after it aside)."""
    from omni_pd.cli import main

    [example] = [b for b in fenced_blocks(page("docs/expand.md"), "") if b.startswith("error[OPD101]")]
    (tmp_path / "my.yaml").write_text("stages:\n  - stage_id: 0\n    tensor_parallel_size: two\n")
    monkeypatch.chdir(tmp_path)
    assert main(["validate", "my.yaml"]) == 1
    assert capsys.readouterr().out == example + "my.yaml: FAILED (1 error, 0 warnings, 0 info)\n"


# --- every omni-pd command and option of a bash block exists ------------------------------------


def _omni_pd_invocations(name: str) -> list[list[str]]:
    """The argument lists of every ``omni-pd ...`` command on page ``name``'s bash lines
    (continued lines joined; comments, pipes and ``&&`` chains split off)."""
    out = []
    for block in fenced_blocks(page(name), "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s#.*$", "", line)
            for piece in re.split(r"\s(?:\|\|?|&&|;)\s", line):
                m = re.search(r"(?:^|\s|\$\()omni-pd(\s.*)?$", piece)
                if m:
                    out.append(shlex.split(m.group(1) or ""))
    return out


def _cli():
    import typer.main

    from omni_pd.cli import app

    return typer.main.get_command(app)


@pytest.mark.parametrize("name", PAGES)
def test_every_omni_pd_command_and_option_on_a_page_exists(name):
    """A moved example that names a command or option omni-pd does not have fails here:
    each ``omni-pd CMD --opt`` of a bash block is a command of the CLI and each ``--opt``
    one of that command's options (or a global one before the command)."""
    group = _cli()
    global_opts = {o for p in group.params for o in p.opts}
    for args in _omni_pd_invocations(name):
        if not args or args[0].startswith("-"):
            assert set(a.split("=", 1)[0] for a in args if a.startswith("--")) <= global_opts, (name, args)
            continue
        cmd = group.commands.get(args[0])
        assert cmd is not None, (name, args)
        opts = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
        bad = [a for a in args[1:] if a.startswith("--") and a.split("=", 1)[0] not in opts]
        assert bad == [], (name, args[0], bad)


def test_the_command_check_reads_the_pages():
    found = {args[0] for name in PAGES for args in _omni_pd_invocations(name) if args}
    assert {"expand", "validate", "launch", "diff", "graph", "migrate", "render", "rules", "explain",
            "pipelines", "connectors", "schema"} <= found, found


# --- the pages link to each other and every relative link resolves -----------------------------

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _links(name: str) -> list[str]:
    """The link targets of page ``name`` outside code blocks and code spans."""
    text, out, fence = page(name), [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
            continue
        if not fence:
            out += _LINK.findall(re.sub(r"`[^`]*`", "", line))
    return out


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text, fence, out = path.read_text(encoding="utf-8"), False, set()
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6} (.*)", line)):
            out.add(_slug(m.group(1)))
    return out


def _md_pages() -> list[str]:
    return [*PAGES, *sorted(f"docs/upstream/{p.name}" for p in (ROOT / "docs" / "upstream").glob("*.md"))]


@pytest.mark.parametrize("name", _md_pages())
def test_every_relative_link_resolves(name):
    """Each relative link of README.md, docs/*.md and docs/upstream/*.md names a file of the
    repository, and its ``#anchor`` (on a Markdown page) a heading of that page."""
    base = (ROOT / name).parent
    broken = []
    for target in _links(name):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        path_part, _, anchor = target.partition("#")
        path = (base / path_part).resolve() if path_part else ROOT / name
        if not path.exists():
            broken.append(target)
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(target)
    assert broken == [], (name, broken)


def test_every_docs_page_is_reachable_from_the_readme():
    """docs/*.md (and docs/upstream/README.md) are linked from README.md or from a page it
    links, transitively; every docs/*.md links back to the README."""
    seen, todo = set(), ["README.md"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for target in _links(name):
            path_part = target.partition("#")[0]
            if not path_part.endswith(".md") or re.match(r"[a-z]+:", path_part):
                continue
            path = (ROOT / name).parent.joinpath(path_part).resolve()
            rel = path.relative_to(ROOT).as_posix()
            if path.is_file() and (rel.startswith("docs/") or rel == "README.md"):  # broken: the test above
                todo.append(rel)
    unreached = [n for n in [*PAGES, "docs/upstream/README.md"] if n not in seen]
    assert unreached == []
    no_way_back = [n for n in PAGES[1:] if "../README.md" not in _links(n)]
    assert no_way_back == []


def test_the_readme_stays_short():
    """The README is what a newcomer needs (issue 24): what omni-pd is, Quick start, the three
    commands, tests, where to go next; the reference lives in docs/."""
    text = page("README.md")
    heads = re.findall(r"^## (.*)$", text, re.M)
    assert heads == ["Quick start", "The three commands", "Tests", "Where to go next"]
    assert len(text.encode()) < 10_000


def test_pages_with_finds_a_phrase_where_it_lives():
    assert pages_with("## A real PD run on a CPU-only machine") == [LAUNCH]
