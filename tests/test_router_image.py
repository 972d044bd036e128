"""The router image the Kubernetes manifests name (issue 36 item 4): ``--router-image``
defaults to ``omni-pd:latest``, and the repository ships the Dockerfile that builds it
(omni-pd on a small Python base; the router container runs ``python -m
omni_pd.launch.router``), with the build and push steps in docs/launch.md. No image is
built here; the test checks the file copies what ``pip install .`` needs and that the
docs name it."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_dockerfile_installs_omni_pd_from_what_it_copies():
    text = (ROOT / "Dockerfile").read_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    copied = {part for ln in lines if ln.startswith("COPY ") for part in ln.split()[1:-1]}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    forced = project["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    # everything the wheel build reads: the package, its forced data, the readme and pyproject
    assert copied >= {"pyproject.toml", "README.md", "omni_pd", *forced}, copied
    assert "RUN pip install --no-cache-dir . && rm -rf /src" in lines
    assert 'CMD ["python", "-m", "omni_pd.launch.router", "--help"]' in lines


def test_docs_say_how_to_build_and_push_the_router_image():
    launch = (ROOT / "docs" / "launch.md").read_text()
    assert "docker build -t REGISTRY/omni-pd:TAG ." in launch
    assert "--router-image REGISTRY/omni-pd:TAG" in launch
