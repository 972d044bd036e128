"""``omni-pd render --target kubernetes`` (issue 25): llm-d-shaped manifests.

Goldens for the tiny LLM split with NIXL: tests/golden/render_k8s_1p1d_tp2/ and
render_k8s_2p1d/ (a Deployment and Service per role), render_k8s_tp_across_nodes/
(prefill TP 4 and decode DP 4 on nodes of 2 GPUs: a LeaderWorkerSet per role, leader and
headless worker, an API key) and render_k8s_disaggregatedset/ (the same pair as one
DisaggregatedSet); each with the router in front, the config as a ConfigMap and a
Kustomization (so both ``kubectl apply -k DIR`` and ``-f DIR`` apply it). Every object validates offline before it is written (core kinds with
kubernetes-validate, strict; LWS kinds with their CRD schemas); the GPUs of an instance's
pods add up to its world size; replicas equal the stage's instances; every listener binds
and every advertised address is the pod's own IP; no engine_id is shared by replicas;
secrets come from a Secret and are written nowhere, probes included.
"""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("kubernetes_validate")

from hypothesis import given, settings, strategies as st  # noqa: E402
from ruamel.yaml import YAML  # noqa: E402

from omni_pd.cli import main  # noqa: E402
from omni_pd.render import crd_schema  # noqa: E402
from omni_pd.render.kubernetes import pod_templates, validate_manifests  # noqa: E402

from conftest import HYPOTHESIS_PROFILE  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
LLM = ROOT / "tests" / "fixtures" / "llm.yaml"
UPDATE = os.environ.get("OMNI_PD_UPDATE_GOLDEN") == "1"
FILES = ["Kustomization", "configmap.yaml", "decode.yaml", "monitoring.yaml", "prefill.yaml", "router.yaml"]
DS_FILES = ["Kustomization", "configmap.yaml", "disaggregatedset.yaml", "monitoring.yaml", "router.yaml"]
KEY = "sk-not-a-real-key-0123"
HAS_KUBECTL = subprocess.run(["which", "kubectl"], capture_output=True).returncode == 0


def _render(tmp_path: Path, capsys, *expand_args: str, render_args: tuple[str, ...] = (), files=FILES) -> Path:
    pd = tmp_path / "pd.yaml"
    assert main(["expand", "-q", str(LLM), "--pipeline", "llm", "--connector", "NixlConnector", *expand_args,
                 "-o", str(pd)]) == 0
    to = tmp_path / "k8s"
    rc = main(["render", str(pd), "--to", str(to), "--target", "kubernetes", "--model", "Qwen/Qwen3-0.6B",
               "--router-workers", "2", "--env", "HF_TOKEN=hf_not_a_real_token", *render_args])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert sorted(p.name for p in to.iterdir()) == files
    return to


def _objects(to: Path) -> dict[str, dict]:
    y = YAML(typ="safe")
    return {f"{o['kind']}/{o['metadata']['name']}": o for f in sorted(os.listdir(to)) if f != "Kustomization"
            for o in y.load_all((to / f).read_text())}


def _containers(obj: dict) -> list[tuple[str, dict]]:
    """(template kind, container) of every pod template of a workload: ``pod`` for a
    Deployment's, ``leader``/``worker`` for a LeaderWorkerSet's (a size-1 LWS: ``pod``)."""
    if obj["kind"] == "Deployment":
        return [("pod", c) for c in obj["spec"]["template"]["spec"]["containers"]]
    out = []
    for path, tmpl in pod_templates(obj):
        size = _at(obj, path.rsplit("/", 1)[0])["size"]
        kind = "pod" if size == 1 else "leader" if path.endswith("leaderTemplate") else "worker"
        out += [(kind, c) for c in tmpl["spec"]["containers"]]
    return out


def _at(obj: dict, path: str):
    for p in path.split("/"):
        obj = obj[int(p)] if isinstance(obj, list) else obj[p]
    return obj


def _env(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def _arg(c: dict, flag: str) -> str:
    return c["args"][c["args"].index(flag) + 1]


CASES = {
    "render_k8s_1p1d_tp2": (("--tp", "2"), (), FILES),
    "render_k8s_2p1d": (("--prefill-replicas", "2", "--decode-replicas", "1"), (), FILES),
    "render_k8s_tp_across_nodes": (("--prefill-tp", "4", "--decode-dp", "4"),
                                   ("--gpus-per-node", "2", "--engine-arg=--api-key", f"--engine-arg={KEY}"), FILES),
    "render_k8s_disaggregatedset": (("--prefill-tp", "4", "--decode-dp", "4"),
                                    ("--gpus-per-node", "2", "--disaggregated-set"), DS_FILES),
}


@pytest.mark.parametrize("golden", list(CASES))
def test_manifests_match_goldens_and_validate(tmp_path, capsys, golden):
    expand_args, render_args, files = CASES[golden]
    to = _render(tmp_path, capsys, *expand_args, render_args=render_args, files=files)
    for f in files:
        text = (to / f).read_text()
        if f == "configmap.yaml":  # holds the config, whose header names the temporary input
            text = text.replace(str(tmp_path), "TMP")
        if UPDATE:
            (GOLDEN / golden).mkdir(exist_ok=True)
            (GOLDEN / golden / f).write_text(text)
        assert text == (GOLDEN / golden / f).read_text(), f
    assert sorted(p.name for p in (GOLDEN / golden).iterdir()) == files
    texts = {f: (to / f).read_text() for f in files}
    assert validate_manifests(texts) == []
    assert all("hf_not_a_real_token" not in t and KEY not in t for t in texts.values())
    # `kubectl apply -f DIR` reads every .yaml/.yml/.json file of DIR as objects: each is one
    y = YAML(typ="safe")
    read_by_f = [f for f in files if f.rsplit(".", 1)[-1] in ("yaml", "yml", "json")]
    assert read_by_f == [f for f in files if f != "Kustomization"]
    assert all({"apiVersion", "kind", "metadata"} <= set(o) for f in read_by_f for o in y.load_all(texts[f]))


def test_deployments_one_pod_per_instance(tmp_path, capsys):
    for golden, replicas, gpus in (("render_k8s_1p1d_tp2", {"prefill": 1, "decode": 1}, 2),
                                   ("render_k8s_2p1d", {"prefill": 2, "decode": 1}, 1)):
        objs = _objects(GOLDEN / golden)
        assert sorted(objs) == ["ConfigMap/omni-pd-deploy-config", "ConfigMap/omni-pd-grafana-dashboard",
                                "Deployment/omni-pd-decode", "Deployment/omni-pd-prefill", "Deployment/omni-pd-router",
                                "PodMonitor/omni-pd-engines", "PrometheusRule/omni-pd-pd-health", "Service/omni-pd",
                                "Service/omni-pd-decode", "Service/omni-pd-prefill"]
        for role in ("prefill", "decode"):
            dep = objs[f"Deployment/omni-pd-{role}"]
            assert dep["spec"]["replicas"] == replicas[role]
            assert dep["spec"]["template"]["metadata"]["labels"]["llm-d.ai/role"] == role
            assert dep["spec"]["template"]["metadata"]["labels"]["omni-pd.io/stage"] == str(int(role == "decode"))
            c = dep["spec"]["template"]["spec"]["containers"][0]
            assert c["resources"] == {"requests": {"nvidia.com/gpu": gpus}, "limits": {"nvidia.com/gpu": gpus}}
            assert _arg(c, "--host") == "$(POD_IP)"
            env = _env(c)
            assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
            assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"]["value"] == "$(POD_IP)"
            assert env["HF_TOKEN"] == {"name": "HF_TOKEN",
                                       "valueFrom": {"secretKeyRef": {"name": "omni-pd-secrets", "key": "HF_TOKEN"}}}
            assert "engine_id" not in _arg(c, "--kv-transfer-config")
            assert "CUDA_VISIBLE_DEVICES" not in env
            assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models"
            assert c["startupProbe"]["httpGet"]["path"] == "/health"
            # /dev/shm memory-backed (vLLM's workers share tensors through it; the runtime gives 64 MiB)
            assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
            assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in dep["spec"]["template"]["spec"]["volumes"]
            assert objs[f"Service/omni-pd-{role}"]["spec"]["selector"] == {
                "app.kubernetes.io/instance": "omni-pd", "app.kubernetes.io/component": role}
        r = objs["Deployment/omni-pd-router"]["spec"]["template"]["spec"]["containers"][0]
        assert r["args"][r["args"].index("--prefill") + 1] == "http://omni-pd-prefill:8100"
        assert r["args"].count("--prefill") == 1
        assert _arg(r, "--decode") == "http://omni-pd-decode:8200"
        assert list(_env(r)) == ["POD_IP"]  # the router reads no secret: it relays the client's Authorization


@pytest.mark.parametrize("golden", ["render_k8s_tp_across_nodes", "render_k8s_disaggregatedset"])
def test_instances_wider_than_a_node_are_leader_worker_groups(golden):
    objs = _objects(GOLDEN / golden)
    if golden == "render_k8s_disaggregatedset":
        ds = objs["DisaggregatedSet/omni-pd"]
        assert ds["apiVersion"] == "disaggregatedset.x-k8s.io/v1"
        specs = {r["name"]: {"kind": "LeaderWorkerSet", "spec": r["spec"]} for r in ds["spec"]["roles"]}
    else:
        specs = {role: objs[f"LeaderWorkerSet/omni-pd-{role}"] for role in ("prefill", "decode")}
        assert {o["apiVersion"] for o in specs.values()} == {"leaderworkerset.x-k8s.io/v1"}
    for role, lws in specs.items():
        spec = lws["spec"]
        assert spec["replicas"] == 1 and spec["startupPolicy"] == "LeaderCreated"
        lwt = spec["leaderWorkerTemplate"]
        assert lwt["size"] == 2 and lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
        leader, worker = (lwt[k]["spec"]["containers"][0] for k in ("leaderTemplate", "workerTemplate"))
        # world size 4 (prefill TP 4, decode DP 4) on nodes of 2: two pods of two GPUs each
        gpus = [c["resources"]["requests"]["nvidia.com/gpu"] for c in (leader, worker)] * spec["replicas"]
        assert gpus == [2, 2] and sum(gpus) == 4
        assert [leader["resources"]["limits"], worker["resources"]["limits"]] == [{"nvidia.com/gpu": 2}] * 2
        for k in ("leaderTemplate", "workerTemplate"):
            assert lwt[k]["metadata"]["labels"]["llm-d.ai/role"] == role
        assert leader["args"][-6:] == ["--nnodes", "2", "--node-rank", "0", "--master-addr", "$(POD_IP)"]
        assert worker["args"][-7:] == ["--nnodes", "2", "--node-rank", "$(LWS_WORKER_INDEX)", "--master-addr",
                                       "$(LWS_LEADER_ADDRESS)", "--headless"]
        assert not {"--host", "--port", "--api-key"} & set(worker["args"])
        assert worker["args"][:-7] == [a for a in leader["args"][:-6] if a not in (
            "--host", "$(POD_IP)", "--port", "8100", "8200", "--api-key", "$(API_KEY)")]  # the engine's own args
        assert "readinessProbe" not in worker and "startupProbe" not in worker
        for k in ("leaderTemplate", "workerTemplate"):
            assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in lwt[k]["spec"]["volumes"]
        for c in (leader, worker):
            assert _env(c)["VLLM_HOST_IP"]["value"] == "$(POD_IP)"
            assert _env(c)["VLLM_NIXL_SIDE_CHANNEL_HOST"]["value"] == "$(POD_IP)"
        assert {p["name"] for p in leader["ports"]} >= {"http", "dist"}
        sel = objs[f"Service/omni-pd-{role}"]["spec"]["selector"]
        assert sel == {"app.kubernetes.io/instance": "omni-pd", "app.kubernetes.io/component": role,
                       "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    # decode runs DP ranks on its worker: their side channels (not the DP RPC port, the leader's)
    dec_worker = specs["decode"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    assert [p["name"] for p in dec_worker["ports"]] == ["kv-0", "kv-1", "kv-2", "kv-3"]
    pre_worker = specs["prefill"]["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    assert "ports" not in pre_worker  # TP ranks only: nothing of the connector listens there


def test_an_api_key_is_read_from_the_secret_by_the_engine_and_its_probe():
    objs = _objects(GOLDEN / "render_k8s_tp_across_nodes")
    for role, port in (("prefill", 8100), ("decode", 8200)):
        lwt = objs[f"LeaderWorkerSet/omni-pd-{role}"]["spec"]["leaderWorkerTemplate"]
        leader, worker = (lwt[k]["spec"]["containers"][0] for k in ("leaderTemplate", "workerTemplate"))
        assert _arg(leader, "--api-key") == "$(API_KEY)"
        assert _env(leader)["API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "omni-pd-secrets", "key": "API_KEY"}}
        assert "API_KEY" not in _env(worker)  # a headless worker serves no API
        cmd = leader["readinessProbe"]["exec"]["command"]
        assert cmd[:2] == ["python3", "-c"]
        assert f"'http://%s:{port}/v1/models' % os.environ['POD_IP']" in cmd[2]
        assert "'Bearer ' + os.environ['API_KEY']" in cmd[2]
        assert leader["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}  # vLLM leaves /health open


def test_vllm_api_key_env_and_the_two_word_flag(tmp_path, capsys):
    to = _render(tmp_path, capsys, render_args=("--env", f"VLLM_API_KEY={KEY}"))
    objs = _objects(to)
    c = objs["Deployment/omni-pd-prefill"]["spec"]["template"]["spec"]["containers"][0]
    assert "'Bearer ' + os.environ['VLLM_API_KEY']" in c["readinessProbe"]["exec"]["command"][2]
    assert _env(c)["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]["key"] == "VLLM_API_KEY"
    r = objs["Deployment/omni-pd-router"]["spec"]["template"]["spec"]["containers"][0]
    assert list(_env(r)) == ["POD_IP"]
    (tmp_path / "b").mkdir()
    to2 = _render(tmp_path / "b", capsys, render_args=("--engine-arg=--api-key", f"--engine-arg={KEY}"))
    c2 = _objects(to2)["Deployment/omni-pd-decode"]["spec"]["template"]["spec"]["containers"][0]
    assert _arg(c2, "--api-key") == "$(API_KEY)"
    assert all(KEY not in (d / f).read_text() for d in (to, to2) for f in FILES)


def test_a_world_size_that_does_not_split_over_the_nodes_is_refused(tmp_path, capsys):
    pd = tmp_path / "pd.yaml"
    assert main(["expand", "-q", str(LLM), "--pipeline", "llm", "--connector", "NixlConnector", "--tp", "4",
                 "-o", str(pd)]) == 0
    to = tmp_path / "k8s"
    rc = main(["render", str(pd), "--to", str(to), "--target", "kubernetes", "--model", "m", "--gpus-per-node", "3"])
    out = capsys.readouterr()
    assert rc == 2
    assert ("error[OPD006]: render --target kubernetes: prefill: an instance of 4 devices does not split evenly "
            "into nodes of 3 (vLLM 0.30 needs --nnodes to divide the world size)") in out.out + out.err
    assert not to.exists()
    rc = main(["render", str(pd), "--to", str(to), "--model", "m", "--gpus-per-node", "2"])
    out = capsys.readouterr()
    assert rc == 2 and "error[OPD006]: --gpus-per-node and --disaggregated-set shape Kubernetes workloads" in out.err
    assert not to.exists()


def test_a_secret_in_the_compiled_config_is_refused(tmp_path, capsys):
    pd = tmp_path / "pd.yaml"
    assert main(["expand", "-q", str(LLM), "--pipeline", "llm", "--connector", "NixlConnector", "-o", str(pd)]) == 0
    pd.write_text(pd.read_text().replace('VLLM_NIXL_SIDE_CHANNEL_PORT: "5600"',
                                         'VLLM_NIXL_SIDE_CHANNEL_PORT: "5600"\n      HF_TOKEN: hf_in_the_config_1'))
    to = tmp_path / "k8s"
    rc = main(["render", str(pd), "--to", str(to), "--target", "kubernetes", "--model", "m"])
    out = capsys.readouterr()
    assert rc == 2, out
    assert ("error[OPD006]: render --target kubernetes: the compiled config holds a secret value (a secret env "
            "value of a stage), which its ConfigMap would carry") in out.out + out.err
    assert not to.exists()


def test_validation_catches_a_bad_object():
    files = {"x.yaml": "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: two}\n"}
    problems = validate_manifests(files)
    assert problems and problems[0].startswith("x.yaml: Deployment x: spec/replicas: ")


def test_validation_catches_bad_custom_resources():
    y = YAML(typ="safe")
    lws = y.load((GOLDEN / "render_k8s_tp_across_nodes" / "prefill.yaml").read_text().split("\n---\n")[0])
    bad = copy.deepcopy(lws)
    bad["spec"]["leaderWorkerTemplate"]["size"] = "two"
    bad["spec"]["leaderWorkerTemplate"]["sise"] = 2
    bad["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "x"
    dump = lambda o: __import__("json").dumps(o)  # noqa: E731  (JSON is YAML)
    assert validate_manifests({"p.yaml": dump(bad)}) == [
        "p.yaml: LeaderWorkerSet omni-pd-prefill: spec/leaderWorkerTemplate: Additional properties are not allowed "
        "('sise' was unexpected)",
        "p.yaml: LeaderWorkerSet omni-pd-prefill: spec/leaderWorkerTemplate/leaderTemplate/spec/containers/0/ports/0/"
        "containerPort: 'x' is not of type 'integer'",
        "p.yaml: LeaderWorkerSet omni-pd-prefill: spec/leaderWorkerTemplate/size: 'two' is not of type 'integer'",
        "p.yaml: LeaderWorkerSet omni-pd-prefill: spec/leaderWorkerTemplate/leaderTemplate: spec/containers/0/ports/0/"
        "containerPort: 'x' is not of type 'integer'",
    ]
    ds = y.load((GOLDEN / "render_k8s_disaggregatedset" / "disaggregatedset.yaml").read_text().split("\n---\n")[0])
    bad = copy.deepcopy(ds)
    bad["spec"]["roles"][1]["spec"]["replicas"] = 0
    bad["spec"]["roles"][1]["name"] = "prefill"
    assert validate_manifests({"d.yaml": dump(bad)}) == [
        "d.yaml: DisaggregatedSet omni-pd: spec: replicas must be zero for all non-External roles or non-zero for "
        "all non-External roles",
        "d.yaml: DisaggregatedSet omni-pd: spec/roles: duplicate entries for key ['name']: [('prefill',)]",
    ]
    bad = copy.deepcopy(ds)
    bad["apiVersion"] = "disaggregatedset.x-k8s.io/v1alpha1"
    assert validate_manifests({"d.yaml": dump(bad)}) == [
        "d.yaml: DisaggregatedSet omni-pd: apiVersion: 'disaggregatedset.x-k8s.io/v1alpha1' is not "
        "'disaggregatedset.x-k8s.io/v1' (lws v0.10.0)"]


def test_bundled_crd_schemas_say_where_they_come_from():
    for kind, stem, sha in (
            ("LeaderWorkerSet", "leaderworkerset.x-k8s.io_leaderworkersets",
             "c5dcad8ed943e495490241f00b9a1b45d51203b6d484020db3636d5bf553568e"),
            ("DisaggregatedSet", "disaggregatedset.x-k8s.io_disaggregatedsets",
             "6dc06e630cc88c28ba5406dc4a15ac593f4ec1af89ef439e1bdb770d4a7e74a8")):
        rec = crd_schema.bundled(kind)
        assert rec["kind"] == kind and rec["version"] == "v1" and rec["tag"] == "v0.10.0"
        assert rec["source"] == f"https://github.com/kubernetes-sigs/lws/blob/v0.10.0/config/crd/bases/{stem}.yaml"
        assert rec["commit"] == "2161f38ff333f9e24d3c44adef7cd5d9787cac00" and rec["sha256"] == sha
        # every CEL rule of the schema has its Python check (a new one would be refused, not skipped)
        assert crd_schema.rules_in(rec["openAPIV3Schema"]) <= set(crd_schema.CEL_RULES)
    assert crd_schema.rules_in(crd_schema.bundled("DisaggregatedSet")["openAPIV3Schema"]) == set(crd_schema.CEL_RULES)


def test_crd_schema_reduction_keeps_properties_named_description():
    crd = {"metadata": {"name": "xs.example.io"},
           "spec": {"group": "example.io", "names": {"kind": "X"}, "versions": [
               {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                   "type": "object", "description": "an X",
                   "properties": {"description": {"type": "string", "description": "the text"},
                                  "spec": {"type": "object", "properties": {"n": {"type": "integer"}}}}}}}]}}
    rec = crd_schema.schema_from_crd(crd, source="s", tag="t", commit="c", sha256="h")
    assert rec["openAPIV3Schema"] == {"type": "object", "properties": {"description": {"type": "string"},
                                      "spec": {"type": "object", "properties": {"n": {"type": "integer"}}}}}
    assert crd_schema.closed(rec["openAPIV3Schema"])["properties"]["spec"]["additionalProperties"] is False
    with pytest.raises(ValueError, match="expected one served storage version, found 0"):
        crd_schema.schema_from_crd({**crd, "spec": {**crd["spec"], "versions": []}}, source="s", tag="t", commit="c",
                                   sha256="h")


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


#: addresses a container may advertise or bind: its own pod's (``dialled`` ones name a peer)
OWN = "$(POD_IP)"


def _check_addresses(c: dict, kind: str) -> None:
    """Every address ``c`` binds or advertises is its pod's own; a worker dials its leader."""
    args, env = c["args"], _env(c)
    if "--host" in args:
        assert _arg(c, "--host") == OWN
    for name in ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_HOST_IP", "VLLM_MOONCAKE_BOOTSTRAP_HOST"):
        if name in env:
            assert env[name]["value"] == OWN, name
    if "--master-addr" in args:
        assert _arg(c, "--master-addr") == (OWN if kind == "leader" else "$(LWS_LEADER_ADDRESS)")
    assert "127.0.0.1" not in " ".join(args) and "localhost" not in " ".join(args)
    assert all("127.0.0.1" not in str(e.get("value", "")) for e in c.get("env", []))


#: each example expands and renders (two CLI runs, ~0.5 s): a handful in dev and CI, more under "long"
PROPERTY_EXAMPLES = 200 if HYPOTHESIS_PROFILE == "long" else 10


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None)
@given(ptp=st.sampled_from([1, 2, 4]), dtp=st.sampled_from([1, 2]), ddp=st.sampled_from([1, 2, 4]),
       prep=st.integers(1, 2), drep=st.integers(1, 2), gpn=st.sampled_from([None, 1, 2, 4, 8]),
       ds=st.booleans(), key=st.booleans(), placement=st.sampled_from([None, "{0: A, 1: B}", "{all: A}", "{0: B}"]))
def test_every_accepted_split_renders_manifests_that_validate(tmp_path_factory, ptp, dtp, ddp, prep, drep, gpn, ds,
                                                              key, placement):
    tmp = tmp_path_factory.mktemp("k8s")
    pd = tmp / "pd.yaml"
    inv: list[str] = []
    if placement is not None:  # an inventory placement: its host addresses must not reach a pod
        (tmp / "hosts.yaml").write_text("hosts:\n  A: {address: 10.201.0.1, count: 32}\n"
                                        f"  B: {{address: 10.201.0.2, count: 32}}\nplacement: {placement}\n")
        inv = ["--inventory", str(tmp / "hosts.yaml")]
    if main(["expand", "-q", str(LLM), "--pipeline", "llm", "--connector", "NixlConnector",
             "--prefill-tp", str(ptp), "--decode-tp", str(dtp), "--decode-dp", str(ddp),
             "--prefill-replicas", str(prep), "--decode-replicas", str(drep), *inv, "-o", str(pd)]) != 0:
        return  # a split expand refuses is not a placement omni-pd accepts
    to = tmp / "out"
    extra = (["--gpus-per-node", str(gpn)] if gpn else []) + (["--disaggregated-set"] if ds else []) + (
        ["--engine-arg=--api-key", f"--engine-arg={KEY}"] if key else [])
    rc = main(["render", str(pd), "--to", str(to), "--target", "kubernetes", "--model", "m", *inv, *extra])
    worlds = {"prefill": ptp, "decode": dtp * ddp}
    if gpn is not None and any(w > gpn and w % gpn for w in worlds.values()):
        assert rc == 2 and not to.exists()  # vLLM cannot split that world over the nodes
        return
    assert rc == 0
    texts = {f: (to / f).read_text() for f in os.listdir(to)}
    assert validate_manifests(texts) == []
    assert all(KEY not in t for t in texts.values())
    # the compiled config (the ConfigMap's data) keeps its hosts; no pod reads them
    assert all("10.201.0." not in t for f, t in texts.items() if f != "configmap.yaml")
    objs = _objects(to)
    if ds:
        roles = {r["name"]: {"kind": "LeaderWorkerSet", "spec": r["spec"]}
                 for r in objs["DisaggregatedSet/omni-pd"]["spec"]["roles"]}
    else:
        roles = {r: objs.get(f"Deployment/omni-pd-{r}") or objs[f"LeaderWorkerSet/omni-pd-{r}"]
                 for r in ("prefill", "decode")}
    for role, obj in roles.items():
        world = worlds[role]
        nodes = 1 if gpn is None or world <= gpn else world // gpn
        assert obj["kind"] == ("Deployment" if nodes == 1 and not ds else "LeaderWorkerSet")
        assert obj["spec"]["replicas"] == (prep if role == "prefill" else drep)
        cs = _containers(obj)
        per_pod = {c["resources"]["requests"]["nvidia.com/gpu"] for _, c in cs}
        assert per_pod == {world // nodes}
        if obj["kind"] == "LeaderWorkerSet":
            assert obj["spec"]["leaderWorkerTemplate"]["size"] == nodes
        for kind, c in cs:
            _check_addresses(c, kind)
            if kind != "worker":
                probe = c["readinessProbe"]
                assert ("exec" in probe) == key and ("httpGet" in probe) != key
    r = objs["Deployment/omni-pd-router"]["spec"]["template"]["spec"]["containers"][0]
    _check_addresses(r, "pod")


@pytest.mark.skipif(not HAS_KUBECTL, reason="no kubectl")
@pytest.mark.parametrize("golden, deployments, kinds", [
    ("render_k8s_1p1d_tp2", 3, {"PodMonitor": 1, "PrometheusRule": 1, "ConfigMap": 2}),
    ("render_k8s_tp_across_nodes", 1, {"LeaderWorkerSet": 2}),
    ("render_k8s_disaggregatedset", 1, {"DisaggregatedSet": 1}),
    ("render_k8s_omni_one_pod", 1, {"ConfigMap": 2, "PodMonitor": 1, "PrometheusRule": 1}),  # the deploy config, Grafana's
    ("render_k8s_omni_two_hosts", 2, {"ConfigMap": 2}),
])
def test_kubectl_kustomize_builds_the_directory(golden, deployments, kinds):
    r = subprocess.run(["kubectl", "kustomize", str(GOLDEN / golden)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    services = 3 if "omni" not in golden else deployments
    assert r.stdout.count("\nkind: Deployment\n") == deployments and r.stdout.count("\nkind: Service\n") == services
    for kind, n in kinds.items():
        assert r.stdout.count(f"\nkind: {kind}\n") == n


def test_an_ascend_pair_asks_for_npus_and_advertises_the_pod_ip(tmp_path, capsys):
    pd = tmp_path / "pd.yaml"
    assert main(["expand", "-q", str(LLM), "--pipeline", "llm", "--platform", "npu", "-o", str(pd)]) == 0
    to = tmp_path / "k8s"
    rc = main(["render", str(pd), "--to", str(to), "--target", "kubernetes", "--model", "m", "--platform", "npu"])
    assert rc == 0, capsys.readouterr()
    objs = _objects(to)
    for role, hccl in (("prefill", "61000"), ("decode", "61016")):
        c = objs[f"Deployment/omni-pd-{role}"]["spec"]["template"]["spec"]["containers"][0]
        assert c["resources"] == {"requests": {"huawei.com/Ascend910": 1}, "limits": {"huawei.com/Ascend910": 1}}
        env = _env(c)
        assert "ASCEND_RT_VISIBLE_DEVICES" not in env  # the device plugin picks the NPU
        # vllm-ascend's MooncakeConnectorV1 advertises vLLM's get_ip(): VLLM_HOST_IP
        assert env["VLLM_HOST_IP"]["value"] == "$(POD_IP)" and env["HCCL_IF_BASE_PORT"]["value"] == hccl
        assert '"kv_connector":"MooncakeConnectorV1"' in _arg(c, "--kv-transfer-config")
    assert validate_manifests({f: (to / f).read_text() for f in os.listdir(to)}) == []


# --- vllm-omni pipelines: one pod per host of the placement ------------------------------------------

OMNI = ROOT / "presets" / "qwen3_omni_moe.yaml"
OMNI_FILES = ["Kustomization", "configmap.yaml", "monitoring.yaml", "omni.yaml"]
HOSTS = {"A": "10.201.0.1", "B": "10.201.0.2", "C": "10.201.0.3"}
IMAGE = "registry.example/omni-pd-engine:0.30"


def _omni_render(tmp: Path, placement: str | None, *extra: str) -> tuple[int, Path]:
    inv: list[str] = []
    if placement is not None:
        (tmp / "hosts.yaml").write_text("hosts:\n" + "".join(f"  {h}: {{address: {a}, count: 8}}\n"
                                                             for h, a in HOSTS.items()) + placement)
        inv = ["--inventory", str(tmp / "hosts.yaml")]
    pd = tmp / "omni.yaml"
    if main(["expand", "-q", str(OMNI), *inv, "-o", str(pd)]) != 0:
        return -1, tmp
    to = tmp / "k8s"
    return main(["render", str(pd), "--to", str(to), "--target", "kubernetes", "--model", "Qwen/Qwen3-Omni",
                 *inv, *extra]), to


@pytest.mark.parametrize("golden, placement", [("render_k8s_omni_one_pod", None),
                                               ("render_k8s_omni_two_hosts", "")])
def test_omni_manifests_match_goldens_and_validate(tmp_path, capsys, golden, placement):
    rc, to = _omni_render(tmp_path, placement, "--image", IMAGE)
    assert rc == 0, capsys.readouterr()
    assert sorted(p.name for p in to.iterdir()) == OMNI_FILES
    for f in OMNI_FILES:
        text = (to / f).read_text().replace(str(tmp_path), "TMP")
        if UPDATE:
            (GOLDEN / golden).mkdir(exist_ok=True)
            (GOLDEN / golden / f).write_text(text)
        assert text == (GOLDEN / golden / f).read_text(), f
    texts = {f: (to / f).read_text() for f in OMNI_FILES}
    assert validate_manifests(texts) == []
    assert all(a not in t for a in HOSTS.values() for t in texts.values())  # no host address, the ConfigMap's too


def test_one_host_omni_pipeline_is_one_pod_with_every_stage_device():
    objs = _objects(GOLDEN / "render_k8s_omni_one_pod")
    assert sorted(objs) == ["ConfigMap/omni-pd-deploy-config", "ConfigMap/omni-pd-grafana-dashboard",
                            "Deployment/omni-pd-head", "PodMonitor/omni-pd-engines", "PrometheusRule/omni-pd-pd-health",
                            "Service/omni-pd"]
    dep = objs["Deployment/omni-pd-head"]
    assert dep["spec"]["strategy"] == {"type": "Recreate"} and dep["spec"]["replicas"] == 1
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["vllm"] and c["args"][:5] == ["serve", "Qwen/Qwen3-Omni", "--omni", "--deploy-config",
                                                          "/etc/omni-pd/deploy.yaml"]
    assert _arg(c, "--host") == "$(POD_IP)"
    # Thinker prefill on 0, decode on 1, Talker and Code2Wav sharing 2: devices 0..2
    assert c["resources"]["requests"] == {"nvidia.com/gpu": 3}
    assert dep["spec"]["template"]["metadata"]["labels"]["omni-pd.io/stages"] == "0-1-2-3"
    assert "initContainers" not in dep["spec"]["template"]["spec"]  # one pod: the config's 127.0.0.1 is its own
    assert c["readinessProbe"]["httpGet"]["path"] == "/v1/models"


def test_omni_pipeline_across_hosts_is_a_head_pod_and_a_pod_per_other_host():
    objs = _objects(GOLDEN / "render_k8s_omni_two_hosts")
    assert sorted(objs) == ["ConfigMap/omni-pd-deploy-config", "ConfigMap/omni-pd-grafana-dashboard",
                            "Deployment/omni-pd-head", "Deployment/omni-pd-host-b", "PodMonitor/omni-pd-engines",
                            "PrometheusRule/omni-pd-pd-health", "Service/omni-pd", "Service/omni-pd-head"]
    head = objs["Deployment/omni-pd-head"]["spec"]["template"]["spec"]
    hc = head["containers"][0]
    assert _arg(hc, "--omni-master-address") == "$(POD_IP)" and _arg(hc, "--host") == "$(POD_IP)"
    assert _arg(hc, "--stage-id") == "0" and _arg(hc, "--deploy-config") == "/run/omni-pd/deploy.yaml"
    assert hc["resources"]["requests"] == {"nvidia.com/gpu": 1}
    assert [p["name"] for p in hc["ports"]] == ["http", "omni-master", "kv-0"]
    b = objs["Deployment/omni-pd-host-b"]["spec"]["template"]["spec"]
    bc = b["containers"][0]
    assert bc["command"][:2] == ["bash", "-c"] and "readinessProbe" not in bc and "ports" not in bc
    lines = [ln for ln in bc["command"][2].splitlines() if ln.startswith("vllm serve")]
    assert [ln.split("--stage-id ")[1].split()[0] for ln in lines] == ["1", "2", "3"]
    for ln in lines:
        assert ("--omni-master-address omni-pd-head --omni-master-port 8400" in ln
                and "--headless --omni-replica-address '$(POD_IP)' &" in ln)
    assert bc["resources"]["requests"] == {"nvidia.com/gpu": 2}  # decode on 0, Talker + Code2Wav share 1
    for spec in (head, b):
        [init] = spec["initContainers"]
        assert init["command"] == ["sh", "-c", 'sed "s/__OMNI_PD_POD_IP__/$POD_IP/g" /etc/omni-pd/deploy.yaml '
                                                "> /run/omni-pd/deploy.yaml"]
        assert _env(spec["containers"][0])["VLLM_HOST_IP"]["value"] == "$(POD_IP)"
    reg = objs["Service/omni-pd-head"]["spec"]
    assert reg["clusterIP"] == "None" and reg["publishNotReadyAddresses"] is True
    assert reg["ports"] == [{"name": "omni-master", "port": 8400, "targetPort": "omni-master"}]
    assert objs["Service/omni-pd"]["spec"]["ports"][0]["port"] == 8000
    cm = YAML(typ="safe").load(objs["ConfigMap/omni-pd-deploy-config"]["data"]["deploy.yaml"])
    assert [s["kv_transfer_config"]["kv_ip"] for s in cm["stages"][:2]] == ["__OMNI_PD_POD_IP__"] * 2


def test_omni_pipelines_need_an_image_and_no_lws_options(tmp_path, capsys):
    rc, to = _omni_render(tmp_path, None)
    out = capsys.readouterr()
    assert rc == 2 and not to.exists()
    assert ("error[OPD006]: render --target kubernetes: a vllm-omni pipeline needs an engine image with vllm-omni "
            "0.30 and omni-pd installed (the default vllm/vllm-openai:v0.30.0 has neither)") in out.out + out.err
    (tmp_path / "b").mkdir()
    rc, to = _omni_render(tmp_path / "b", None, "--image", IMAGE, "--gpus-per-node", "2")
    out = capsys.readouterr()
    assert rc == 2 and "--gpus-per-node and --disaggregated-set shape plain-vLLM PD pairs" in out.out + out.err


def test_omni_pod_config_keeps_comments_and_rewrites_only_host_addresses():
    from omni_pd.render.kubernetes_omni import POD_IP_PLACEHOLDER, pod_config

    text = ("# top\nconnectors:\n  c: {name: NixlConnector, extra: {host: 10.201.0.1, zmq_port: 5}}\nstages:\n"
            "  - stage_id: 0  # keep\n    env: {VLLM_NIXL_SIDE_CHANNEL_HOST: \"10.201.0.1\", X: 10.201.0.10}\n"
            "    kv_transfer_config: {kv_ip: \"10.201.0.2\"}\n")
    out = pod_config(text, ["10.201.0.1", "10.201.0.2"])
    tree = YAML(typ="safe").load(out)
    assert tree["connectors"]["c"]["extra"]["host"] == "auto"
    assert tree["stages"][0]["env"] == {"VLLM_NIXL_SIDE_CHANNEL_HOST": POD_IP_PLACEHOLDER, "X": "10.201.0.10"}
    assert tree["stages"][0]["kv_transfer_config"]["kv_ip"] == POD_IP_PLACEHOLDER
    assert "# top" in out and "# keep" in out
    assert pod_config(text, []) == text and pod_config(text, ["10.9.9.9"]) == text


@settings(max_examples=4 if HYPOTHESIS_PROFILE != "long" else 60, deadline=None)
@given(hosts=st.lists(st.sampled_from(sorted(HOSTS)), min_size=4, max_size=4))
def test_every_accepted_omni_placement_renders_manifests_that_validate(tmp_path_factory, hosts):
    tmp = tmp_path_factory.mktemp("omni")
    rc, to = _omni_render(tmp, "placement: {" + ", ".join(f"{i}: {h}" for i, h in enumerate(hosts)) + "}\n",
                          "--image", IMAGE)
    if rc == -1:
        return  # expand refuses the placement: not one omni-pd accepts
    assert rc == 0
    texts = {f: (to / f).read_text() for f in os.listdir(to)}
    assert validate_manifests(texts) == []
    assert all(a not in t for a in HOSTS.values() for t in texts.values())
    objs = _objects(to)
    deps = [o for o in objs.values() if o["kind"] == "Deployment"]
    assert len(deps) == len(set(hosts))  # one pod per host
    for d in deps:
        c = d["spec"]["template"]["spec"]["containers"][0]
        words = " ".join(c.get("args", []) + c["command"]).split()
        for flag in ("--host", "--omni-replica-address"):
            assert all(words[i + 1].strip("'") == OWN for i, w in enumerate(words) if w == flag)
        on_head = d["metadata"]["name"] == "omni-pd-head"
        assert all(words[i + 1].strip("'") == (OWN if on_head else "omni-pd-head")  # shell-quoted on the head pod
                   for i, w in enumerate(words) if w == "--omni-master-address")
