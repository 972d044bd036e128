"""``omni-pd render --target kubernetes`` (issue 25 step 4): llm-d-shaped manifests.

Goldens (tests/golden/render_k8s_1p1d_tp2/, tests/golden/render_k8s_2p1d/) for the tiny
LLM split with NIXL: a Deployment and Service per role, the router in front, the config as
a ConfigMap and a kustomization.yaml. Every object validates against Kubernetes' schemas
(kubernetes-validate, strict) before it is written; GPU requests equal each instance's world
size; replicas equal the stage's instances; every listener binds the pod's own IP; no
engine_id is shared by replicas; the HF token comes from a Secret and is written nowhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("kubernetes_validate")

from ruamel.yaml import YAML  # noqa: E402

from omni_pd.cli import main  # noqa: E402
from omni_pd.render.kubernetes import validate_manifests  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"
UPDATE = os.environ.get("OMNI_PD_UPDATE_GOLDEN") == "1"
FILES = ["configmap.yaml", "decode.yaml", "kustomization.yaml", "prefill.yaml", "router.yaml"]


def _render(tmp_path: Path, capsys, *expand_args: str) -> Path:
    pd = tmp_path / "pd.yaml"
    assert main(["expand", "-q", str(LLM), "--pipeline", "llm", "--connector", "NixlConnector", *expand_args,
                 "-o", str(pd)]) == 0
    to = tmp_path / "k8s"
    rc = main(["render", str(pd), "--to", str(to), "--target", "kubernetes", "--model", "Qwen/Qwen3-0.6B",
               "--router-workers", "2", "--env", "HF_TOKEN=hf_not_a_real_token"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert sorted(p.name for p in to.iterdir()) == FILES
    return to


def _objects(to: Path) -> dict[str, dict]:
    y = YAML(typ="safe")
    return {f"{o['kind']}/{o['metadata']['name']}": o for f in FILES if f != "kustomization.yaml"
            for o in y.load_all((to / f).read_text())}


@pytest.mark.parametrize("golden, args, replicas, gpus", [
    ("render_k8s_1p1d_tp2", ("--tp", "2"), {"prefill": 1, "decode": 1}, 2),
    ("render_k8s_2p1d", ("--prefill-replicas", "2", "--decode-replicas", "1"), {"prefill": 2, "decode": 1}, 1),
])
def test_manifests_match_goldens_and_validate(tmp_path, capsys, golden, args, replicas, gpus):
    to = _render(tmp_path, capsys, *args)
    for f in FILES:
        text = (to / f).read_text()
        if f == "configmap.yaml":  # holds the config, whose header names the temporary input
            text = text.replace(str(tmp_path), "TMP")
        if UPDATE:
            (GOLDEN / golden).mkdir(exist_ok=True)
            (GOLDEN / golden / f).write_text(text)
        assert text == (GOLDEN / golden / f).read_text(), f
    files = {f: (to / f).read_text() for f in FILES}
    assert validate_manifests(files) == []
    objs = _objects(to)
    assert sorted(objs) == ["ConfigMap/omni-pd-deploy-config", "Deployment/omni-pd-decode",
                            "Deployment/omni-pd-prefill", "Deployment/omni-pd-router", "Service/omni-pd",
                            "Service/omni-pd-decode", "Service/omni-pd-prefill"]
    for role in ("prefill", "decode"):
        dep = objs[f"Deployment/omni-pd-{role}"]
        assert dep["spec"]["replicas"] == replicas[role]
        assert dep["spec"]["template"]["metadata"]["labels"]["llm-d.ai/role"] == role
        c = dep["spec"]["template"]["spec"]["containers"][0]
        assert c["resources"] == {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}}
        assert c["args"][c["args"].index("--host") + 1] == "$(POD_IP)"
        env = {e["name"]: e for e in c["env"]}
        assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["value"] == "$(POD_IP)"
        assert env["HF_TOKEN"] == {"name": "HF_TOKEN",
                                   "valueFrom": {"secretKeyRef": {"name": "omni-pd-secrets", "key": "HF_TOKEN"}}}
        assert "engine_id" not in c["args"][c["args"].index("--kv-transfer-config") + 1]
        assert "CUDA_VISIBLE_DEVICES" not in env
        assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models"
        assert c["startupProbe"]["httpGet"]["path"] == "/health"
    r = objs["Deployment/omni-pd-router"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert r[r.index("--prefill") + 1] == "http://omni-pd-prefill:8100" and r.count("--prefill") == 1
    assert r[r.index("--decode") + 1] == "http://omni-pd-decode:8200"
    assert all("hf_not_a_real_token" not in t for t in files.values())


def test_validation_catches_a_bad_object():
    files = {"x.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: two}\n"}
    problems = validate_manifests(files)
    assert problems and problems[0].startswith("x.yaml: Deployment x: spec/replicas: ")


def test_mooncake_pairs_are_refused_before_anything_is_written(tmp_path, capsys):
    pd = tmp_path / "pd.yaml"
    assert main(["expand", "-q", str(LLM), "--pipeline", "llm", "--connector", "MooncakeConnector", "-o", str(pd)]) == 0
    to = tmp_path / "k8s"
    rc = main(["render", str(pd), "--to", str(to), "--target", "kubernetes", "--model", "m"])
    out = capsys.readouterr()
    assert rc == 2
    assert ("error[OPD006]: render --target kubernetes: MooncakeConnector: its router needs each prefill pod's own "
            "address (router protocol bootstrap), which a Service hides") in out.out + out.err
    assert not to.exists()


@pytest.mark.skipif(subprocess.run(["which", "kubectl"], capture_output=True).returncode != 0, reason="no kubectl")
def test_kubectl_kustomize_builds_the_directory(tmp_path, capsys):
    to = _render(tmp_path, capsys)
    r = subprocess.run(["kubectl", "kustomize", str(to)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\nkind: Deployment\n") == 3 and r.stdout.count("\nkind: Service\n") == 3
