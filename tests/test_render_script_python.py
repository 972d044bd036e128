"""Rendered scripts run on other hosts (issue 36 item 3): the router started with this
machine's interpreter path (``/path/of/this/venv/bin/python3``) and ``--workers`` sized
for this machine's CPUs. ``render --python`` names the interpreter on the hosts (default
``python3`` from PATH, as ``--vllm`` defaults to ``vllm``), and without
``--router-workers`` the router sizes its workers on the host that runs it."""

from __future__ import annotations

import sys
from pathlib import Path

from omni_pd.cli import main

ROOT = Path(__file__).resolve().parents[1]
PD = ROOT / "tests" / "golden" / "placement_llm_nixl_two_hosts.yaml"
HOSTS = "hosts:\n  A: {address: 10.201.0.1, count: 1}\n  B: {address: 10.201.0.2, count: 1}\nplacement: {0: A, 1: B}\n"


def render(tmp_path: Path, capsys, *extra: str) -> tuple[str, str]:
    inv = tmp_path / "hosts.yaml"
    inv.write_text(HOSTS)
    to = tmp_path / "out"
    rc = main(["render", str(PD), "--to", str(to), "--model", "/models/tiny", "--inventory", str(inv),
               "--platform", "cpu", "--vllm", "/opt/vllm/bin/vllm", *extra])
    err = capsys.readouterr().err
    assert rc == 0, err
    b = (to / "B.sh").read_text()
    router = next(ln for ln in b.splitlines() if "omni_pd.launch.router" in ln)
    return router, b + (to / "A.sh").read_text() + (to / "plan.json").read_text()


def test_the_router_runs_python3_from_path_and_sizes_its_workers_on_its_host(tmp_path, capsys):
    router, every = render(tmp_path, capsys)
    assert router == ("setsid env python3 -m omni_pd.launch.router --connector NixlConnector --host 10.201.0.2 "
                      "--port 8000 --prefill http://10.201.0.1:8100 --decode http://10.201.0.2:8200 "
                      "> logs/router.log 2>&1 &")
    assert sys.executable not in every


def test_python_names_the_interpreter_on_the_hosts(tmp_path, capsys):
    router, every = render(tmp_path, capsys, "--python", "/opt/omni/bin/python", "--router-workers", "3")
    assert router.startswith("setsid env /opt/omni/bin/python -m omni_pd.launch.router --connector NixlConnector "
                             "--host 10.201.0.2 --port 8000 --workers 3 ")
    assert sys.executable not in every
