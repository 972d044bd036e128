"""The shell examples of the README and of docs/*.md say what the code does (issue 13 item 8;
issue 24, "The README and the test command": the reference moved to docs/, its examples
stay tested on whichever page they now live).

A new user copies these lines: the metrics example must name decode's port as the launch
plan computes it, every example that reads ``pd.yaml`` must come after one that writes it
on the same page, and the install line must be one that works (omni-pd is not on PyPI).
"""

from __future__ import annotations

import re

import pytest

from docs_pages import ROOT, fenced_blocks, page, page_names, section
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
