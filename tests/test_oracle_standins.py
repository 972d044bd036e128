"""The oracle's import stand-ins replace only the packages that are missing.

``omni_pd.upstream.vllm_oracle._install_standins`` runs in a fresh interpreter whose path
holds a fake *installed* torchvision (the e2e venv has the real one, .ci/e2e_venv.sh),
and no torchaudio or av: torchvision must stay the installed package, the other two
must come from ``omni_pd/upstream/oracle_standins``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STANDINS = ROOT / "omni_pd" / "upstream" / "oracle_standins"

PROBE = """
import json, sys
from omni_pd.upstream.vllm_oracle import _install_standins
missing = _install_standins()
import torchvision, torchaudio, av
print(json.dumps({"missing": missing, "torchvision": torchvision.__file__, "torchaudio": torchaudio.__file__,
                  "av": av.__file__}))
"""


def test_an_installed_torchvision_is_kept_and_only_the_missing_packages_are_stood_in(tmp_path):
    (tmp_path / "torchvision").mkdir()
    (tmp_path / "torchvision" / "__init__.py").write_text("INSTALLED = True\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["missing"] == ["torchaudio", "av"]
    assert got["torchvision"] == str(tmp_path / "torchvision" / "__init__.py")
    assert got["torchaudio"] == str(STANDINS / "torchaudio" / "__init__.py")
    assert got["av"] == str(STANDINS / "av" / "__init__.py")
