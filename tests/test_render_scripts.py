"""``omni-pd render --to DIR`` (issue 25 step 2): one runnable script per host.

Goldens (tests/golden/render_scripts_two_hosts/): the two-host NIXL 1P1D config rendered
for hosts A and B; the router runs ``python3`` from the host's PATH (``render --python``), never
this run's interpreter path (still written as ``$PYTHON`` should it appear). Every script
parses (``bash -n``), starts exactly its host's processes and waits for its remote peers;
a secret passed with ``--env`` is read from the host's environment, never written; render
refuses a non-empty directory and writes nothing after a validation error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_pd.cli import main

ROOT = Path(__file__).resolve().parents[1]
PD = ROOT / "tests" / "golden" / "placement_llm_nixl_two_hosts.yaml"
GOLDEN = ROOT / "tests" / "golden" / "render_scripts_two_hosts"
HOSTS_YAML = "hosts:\n  A: {address: 10.201.0.1, count: 1}\n  B: {address: 10.201.0.2, count: 1}\nplacement: {0: A, 1: B}\n"
UPDATE = os.environ.get("OMNI_PD_UPDATE_GOLDEN") == "1"


def _render(tmp_path: Path, capsys, *extra, config: Path = PD) -> tuple[int, str, str, Path]:
    inv = tmp_path / "hosts.yaml"
    inv.write_text(HOSTS_YAML)
    to = tmp_path / "out"
    rc = main([str(a) for a in ("render", config, "--to", to, "--model", "/models/tiny", "--inventory", inv,
                                "--platform", "cpu", "--vllm", "/opt/vllm/bin/vllm", "--port", "18000",
                                "--engine-port-base", "18100", "--router-workers", "1", *extra)])
    out = capsys.readouterr()
    return rc, out.out, out.err, to


def test_two_host_scripts_match_goldens_and_parse(tmp_path, capsys):
    rc, _, err, to = _render(tmp_path, capsys, "--env", "HF_TOKEN=hf_not_a_real_token")
    assert rc == 0, err
    assert err == f"wrote {to}: deploy.yaml, A.sh, B.sh, placement.yaml, plan.json (hosts A, B)\n"
    assert sorted(p.name for p in to.iterdir()) == ["A.sh", "B.sh", "deploy.yaml", "placement.yaml", "plan.json"]
    assert (to / "deploy.yaml").read_text() == PD.read_text()
    for name in ("A.sh", "B.sh", "placement.yaml"):
        text = (to / name).read_text().replace(sys.executable, "$PYTHON")
        if UPDATE:
            GOLDEN.mkdir(exist_ok=True)
            (GOLDEN / name).write_text(text)
        assert text == (GOLDEN / name).read_text(), name
    for name in ("A.sh", "B.sh"):
        assert os.access(to / name, os.X_OK)
        assert subprocess.run(["bash", "-n", str(to / name)]).returncode == 0
    a, b = (to / "A.sh").read_text(), (to / "B.sh").read_text()
    assert a.count("setsid ") == 1 and "vllm serve /models/tiny --host 10.201.0.1 --port 18100" in a
    assert "wait_healthy" not in a.split("# prefill-0")[1].split("setsid")[0]  # prefill waits for no one
    assert b.count("setsid ") == 2
    assert "wait_healthy prefill-0 http://10.201.0.1:18100/health 1200" in b
    # the secret: referenced from the host's environment in both scripts and masked in plan.json
    for text in (a, b, (to / "plan.json").read_text()):
        assert "hf_not_a_real_token" not in text
    assert ': "${HF_TOKEN:?set HF_TOKEN in the environment of this host}"' in a


def test_a_script_refuses_to_start_without_its_secret(tmp_path, capsys):
    rc, _, err, to = _render(tmp_path, capsys, "--env", "HF_TOKEN=hf_not_a_real_token")
    assert rc == 0, err
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    r = subprocess.run(["bash", str(to / "A.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "HF_TOKEN: set HF_TOKEN in the environment of this host" in r.stderr
    assert not (to / "logs" / "prefill-0.log").exists()  # nothing started


def test_render_refuses_a_non_empty_directory(tmp_path, capsys):
    to = tmp_path / "out"
    to.mkdir()
    (to / "keep.txt").write_text("mine")
    rc, out, err, _ = _render(tmp_path, capsys)
    assert rc == 2
    assert f"error[OPD005]: --to {to}: exists and is not an empty directory" in out + err
    assert [p.name for p in to.iterdir()] == ["keep.txt"]


def test_render_writes_nothing_for_a_config_validate_refuses(tmp_path, capsys):
    bad = tmp_path / "pd.yaml"
    bad.write_text(PD.read_text().replace('VLLM_NIXL_SIDE_CHANNEL_HOST: "10.201.0.1"',
                                          'VLLM_NIXL_SIDE_CHANNEL_HOST: "127.0.0.1"'))
    rc, out, _, to = _render(tmp_path, capsys, config=bad)
    assert rc == 1
    assert "error[OPD503]" in out and out.rstrip().endswith("not rendered (1 error, 0 warnings, 0 info)")
    assert not to.exists()


@pytest.mark.parametrize("flag", ["--api-key", "--hf-token"])
def test_a_secret_engine_flag_is_read_from_the_environment(tmp_path, capsys, flag):
    rc, _, err, to = _render(tmp_path, capsys, f"--engine-arg={flag}", "--engine-arg=s3cr3t-value")
    if rc != 0:  # validate may refuse the flag for this vLLM: then nothing is written
        assert not to.exists()
        return
    var = flag.lstrip("-").replace("-", "_").upper()
    for name in ("A.sh", "B.sh"):
        text = (to / name).read_text()
        assert "s3cr3t-value" not in text
        assert f'{flag} "${{{var}:?set {var} in the environment of this host}}"' in text
