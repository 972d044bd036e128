"""render as kubectl and helm users expect (issue 36 item 12): ``--to -`` writes one
multi-document YAML to stdout (it created a directory named ``-``), ``--force``
re-renders into an existing directory, ``--namespace`` puts every object in one, and the
ConfigMap carries the deploy config as a literal block (``|``), readable in the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("kubernetes_validate")

from ruamel.yaml import YAML  # noqa: E402

from omni_pd.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"
K8S = ["--target", "kubernetes", "--model", "Qwen/Qwen3-0.6B"]


@pytest.fixture
def pd(tmp_path: Path) -> Path:
    out = tmp_path / "pd.yaml"
    assert main(["expand", "-q", str(LLM), "--pipeline", "llm", "--connector", "NixlConnector", "-o", str(out)]) == 0
    return out


def render(args: list[str], capsys, cwd: Path) -> tuple[int, str, str]:
    old = os.getcwd()
    os.chdir(cwd)
    try:
        rc = main(["render", *args])
    finally:
        os.chdir(old)
    out, err = capsys.readouterr()
    return rc, out, err


def test_to_dash_writes_one_multi_document_yaml_to_stdout(pd, tmp_path, capsys):
    rc, out, err = render([str(pd), "--to", str(tmp_path / "k8s"), *K8S], capsys, tmp_path)
    assert rc == 0, err
    files = YAML(typ="safe").load((tmp_path / "k8s" / "Kustomization").read_text())["resources"]
    want = "---\n".join((tmp_path / "k8s" / f).read_text() for f in files)
    rc, out, err = render([str(pd), "--to", "-", *K8S], capsys, tmp_path)
    assert rc == 0, err
    assert out == want
    assert [o["kind"] for o in YAML(typ="safe").load_all(out)] == [
        "ConfigMap", "Deployment", "Service", "Deployment", "Service", "Deployment", "Service",
        "PodMonitor", "PrometheusRule", "ConfigMap"]  # monitoring.yaml last (render --no-monitoring: left out)
    assert not (tmp_path / "-").exists()
    assert err == ""


def test_to_dash_for_scripts_is_refused(pd, tmp_path, capsys):
    rc, out, err = render([str(pd), "--to", "-", "--model", "M"], capsys, tmp_path)
    assert rc == 2
    assert ("error[OPD006]: --to - writes Kubernetes manifests to stdout; scripts are one file per host\n"
            "  = help: add --target kubernetes, or give --to a directory\n") in out + err
    assert not (tmp_path / "-").exists()


def test_force_re_renders_into_an_existing_directory(pd, tmp_path, capsys):
    to = tmp_path / "k8s"
    assert render([str(pd), "--to", str(to), *K8S], capsys, tmp_path)[0] == 0
    first = {p.name: p.read_text() for p in to.iterdir()}
    (to / "keep.txt").write_text("mine")
    rc, out, err = render([str(pd), "--to", str(to), *K8S], capsys, tmp_path)
    assert rc == 2 and f"error[OPD005]: --to {to}: exists and is not an empty directory" in out + err
    assert "  = help: pass a new directory, or --force to write over the files render writes there" in out + err
    rc, out, err = render([str(pd), "--to", str(to), "--force", *K8S, "--name", "other"], capsys, tmp_path)
    assert rc == 0, err
    now = {p.name: p.read_text() for p in to.iterdir()}
    assert sorted(now) == sorted([*first, "keep.txt"])
    assert now["keep.txt"] == "mine"
    assert "name: other-deploy-config" in now["configmap.yaml"]


def test_force_still_refuses_a_file(pd, tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    rc, out, err = render([str(pd), "--to", str(f), "--force", *K8S], capsys, tmp_path)
    assert rc == 2 and f"error[OPD005]: --to {f}: exists and is not a directory" in out + err
    assert f.read_text() == "x"


def test_namespace_is_set_on_every_object_and_the_kustomization(pd, tmp_path, capsys):
    to = tmp_path / "k8s"
    rc, out, err = render([str(pd), "--to", str(to), "--namespace", "team-a", *K8S], capsys, tmp_path)
    assert rc == 0, err
    y = YAML(typ="safe")
    assert y.load((to / "Kustomization").read_text())["namespace"] == "team-a"
    objs = [o for f in sorted(os.listdir(to)) if f != "Kustomization" for o in y.load_all((to / f).read_text())]
    assert len(objs) == 10 and {o["metadata"].get("namespace") for o in objs} == {"team-a"}


def test_a_bad_namespace_is_refused(pd, tmp_path, capsys):
    rc, out, err = render([str(pd), "--to", "-", "--namespace", "Team_A", *K8S], capsys, tmp_path)
    assert rc == 2
    assert "--namespace Team_A: not a Kubernetes namespace name (lowercase letters, digits and '-', at most 63)" \
        in out + err


def test_the_configmap_holds_the_deploy_config_as_a_literal_block(pd, tmp_path, capsys):
    to = tmp_path / "k8s"
    assert render([str(pd), "--to", str(to), *K8S], capsys, tmp_path)[0] == 0
    text = (to / "configmap.yaml").read_text()
    assert "\ndata:\n  deploy.yaml: |\n    # yaml-language-server: $schema=omni-pd-deploy.schema.json\n" in text
    assert YAML(typ="safe").load(text)["data"]["deploy.yaml"] == pd.read_text()


def test_namespace_for_scripts_is_refused(pd, tmp_path, capsys):
    rc, out, err = render([str(pd), "--to", str(tmp_path / "s"), "--namespace", "a", "--model", "M"], capsys, tmp_path)
    assert rc == 2
    assert ("error[OPD006]: --namespace places Kubernetes objects; scripts have none\n"
            "  = help: add --target kubernetes, or drop --namespace\n") in out + err
    assert not (tmp_path / "s").exists()


def test_no_monitoring_for_scripts_is_refused(pd, tmp_path, capsys):
    # issue 37's leftover: --no-monitoring with --target scripts was accepted and did nothing
    rc, out, err = render([str(pd), "--to", str(tmp_path / "s"), "--no-monitoring", "--model", "M"], capsys, tmp_path)
    assert rc == 2
    assert ("error[OPD006]: --no-monitoring leaves monitoring.yaml out of a Kubernetes render; scripts write none\n"
            "  = help: add --target kubernetes, or drop --no-monitoring\n") in out + err
    assert not (tmp_path / "s").exists()
