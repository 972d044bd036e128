"""The README's shell examples say what the code does (issue 13 item 8).

A new user copies these lines: the metrics example must name decode's port as the launch
plan computes it, every example that reads ``pd.yaml`` must come after one that writes it,
and the install line must be one that works (omni-pd is not on PyPI).
"""

from __future__ import annotations

import re
from pathlib import Path

from omni_pd.compile.expand import expand_document
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.io import load_file, parse_text
from omni_pd.launch.plan import LaunchOptions, plan_document

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def bash_lines() -> list[str]:
    """The lines of every ```bash block, in document order."""
    return [ln for block in re.findall(r"```bash\n(.*?)```", README, re.S) for ln in block.splitlines()]


def cpu_run_block() -> str:
    section = README.split("### A real PD run on a CPU-only machine", 1)[1]
    return re.search(r"```bash\n(.*?)```", section, re.S).group(1)


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


def test_pd_yaml_is_written_before_an_example_reads_it():
    lines = bash_lines()
    writes = [i for i, ln in enumerate(lines) if re.search(r"omni-pd expand\b.*-o pd\.yaml", ln)]
    reads = [i for i, ln in enumerate(lines) if re.search(r"omni-pd (validate|launch|graph)\b[^#]*\spd\.yaml", ln)]
    assert reads and writes
    assert min(writes) < min(reads), (lines[min(reads)], lines[min(writes)])
    for section in ("## `omni-pd launch`", "## `omni-pd graph`"):
        body = README.split(section, 1)[1]
        first = re.search(r"```bash\n(.*?)```", body, re.S).group(1).splitlines()[0]
        assert re.match(r"omni-pd expand .*-o pd\.yaml", first), (section, first)


def test_install_lines_work_without_omni_pd_on_pypi():
    """Every ``pip install`` the README shows installs omni-pd from the clone, never by its
    name from the package index (``omni-pd`` or ``omni-pd[extra]``), where it is not."""
    commands = re.findall(r"pip install ([^\n`#&]*)", README)
    assert len(commands) >= 5
    by_name = [c for c in commands for arg in c.split() if re.fullmatch(r"['\"]?omni-pd(\[[\w,]+\])?['\"]?", arg)]
    assert by_name == []
    assert "git clone <this repository> omni-pd && pip install ./omni-pd vllm-omni" in README


def test_ctrl_c_traceback_note():
    assert "`EngineDeadError` traceback" in README and "not a failure of the run" in README
