"""``omni-pd render --to DIR`` of a 2P1D NIXL split on two hosts (issue 25, "goldens for 1P1D,
2P1D ..."; the 1P1D one is tests/test_render_scripts.py's).

Golden: tests/golden/render_scripts_2p1d_two_hosts/ (the interpreter path written as
``$PYTHON``). Host A starts both prefill instances, each binding and advertising A's address
on its own HTTP and side-channel port; host B waits for both, starts decode and the router,
which lists both prefills. Every script parses (``bash -n``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from omni_pd.cli import main

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"
GOLDEN = ROOT / "tests" / "golden" / "render_scripts_2p1d_two_hosts"
HOSTS_YAML = "hosts:\n  A: {address: 10.201.0.1, count: 2}\n  B: {address: 10.201.0.2, count: 1}\nplacement: {0: A, 1: B}\n"
UPDATE = os.environ.get("OMNI_PD_UPDATE_GOLDEN") == "1"


def test_2p1d_scripts_match_goldens_and_parse(tmp_path, capsys):
    inv = tmp_path / "hosts.yaml"
    inv.write_text(HOSTS_YAML)
    pd = tmp_path / "pd.yaml"
    assert main(["expand", "-q", str(LLM), "--pipeline", "llm", "--connector", "NixlConnector", "--prefill-replicas",
                 "2", "--inventory", str(inv), "-o", str(pd)]) == 0
    to = tmp_path / "out"
    rc = main(["render", str(pd), "--to", str(to), "--model", "/models/tiny", "--inventory", str(inv), "--platform",
               "cpu", "--vllm", "/opt/vllm/bin/vllm", "--router-workers", "1"])
    assert rc == 0, capsys.readouterr()
    for name in ("A.sh", "B.sh", "placement.yaml"):
        text = (to / name).read_text().replace(sys.executable, "$PYTHON")
        if UPDATE:
            GOLDEN.mkdir(exist_ok=True)
            (GOLDEN / name).write_text(text)
        assert text == (GOLDEN / name).read_text(), name
        if name.endswith(".sh"):
            assert subprocess.run(["bash", "-n", str(to / name)]).returncode == 0
    a, b = (to / "A.sh").read_text(), (to / "B.sh").read_text()
    assert a.count("setsid ") == 2
    for port, side in ((8100, 5600), (8101, 5601)):
        assert (f"VLLM_NIXL_SIDE_CHANNEL_HOST=10.201.0.1 VLLM_NIXL_SIDE_CHANNEL_PORT={side} "
                f"/opt/vllm/bin/vllm serve /models/tiny --host 10.201.0.1 --port {port}") in a
        assert f"wait_healthy prefill-{port - 8100} http://10.201.0.1:{port}/health 1200" in b
    assert b.count("setsid ") == 2
    assert "--prefill http://10.201.0.1:8100 --prefill http://10.201.0.1:8101 --decode http://10.201.0.2:8200" in b
