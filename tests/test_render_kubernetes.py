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
FILES = ["Kustomization", "configmap.yaml", "decode.yaml", "prefill.yaml", "router.yaml"]
DS_FILES = ["Kustomization", "configmap.yaml", "disaggregatedset.yaml", "router.yaml"]
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
        assert sorted(objs) == ["ConfigMap/omni-pd-deploy-config", "Deployment/omni-pd-decode",
                                "Deployment/omni-pd-prefill", "Deployment/omni-pd-router", "Service/omni-pd",
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
    ("render_k8s_1p1d_tp2", 3, {}),
    ("render_k8s_tp_across_nodes", 1, {"LeaderWorkerSet": 2}),
    ("render_k8s_disaggregatedset", 1, {"DisaggregatedSet": 1}),
])
def test_kubectl_kustomize_builds_the_directory(golden, deployments, kinds):
    r = subprocess.run(["kubectl", "kustomize", str(GOLDEN / golden)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("\nkind: Deployment\n") == deployments and r.stdout.count("\nkind: Service\n") == 3
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
