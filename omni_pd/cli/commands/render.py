"""``omni-pd render``: scripts per host or Kubernetes manifests (omni_pd/render/)."""

import sys
from pathlib import Path
from typing import Literal, Optional

import typer

from omni_pd.cli.options import IGNORE_HELP, LAUNCH_PLATFORM, SELECT_HELP, inventory_opt, pairs, served_model_facts
from omni_pd.cli.shared import plan_suppression
from omni_pd.cli_validate import _hidden, _line_source
from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity


def render(
    config: Path = typer.Argument(..., help="compiled PD deploy YAML (the output of `omni-pd expand`)"),
    to: Path = typer.Option(..., "--to", help="directory to write (new or empty; never an input's); "
                            "- writes the Kubernetes manifests to stdout as one multi-document YAML"),
    model: str = typer.Option(..., "--model", help="model id or path every engine serves"),
    inventory: Optional[Path] = typer.Option(None, "--inventory", help="hosts and stage placement (YAML): one "
                                             "script per host"),
    target: Literal["scripts", "kubernetes"] = typer.Option(
        "scripts", "--target", help="what to render: scripts (one bash script per host) or kubernetes (llm-d-shaped "
        "manifests and a Kustomization: plain-vLLM NIXL pairs, vllm-omni pipelines one pod per host)"),
    image: Optional[str] = typer.Option(None, "--image", help="kubernetes: the engines' container image (default "
                                        "vllm/vllm-openai:v0.30.0; a vllm-omni pipeline needs one with vllm-omni "
                                        "and omni-pd)"),
    router_image: str = typer.Option("omni-pd:latest", "--router-image",
                                     help="kubernetes: an image with omni-pd installed (the PD router)"),
    name: str = typer.Option("omni-pd", "--name", help="kubernetes: name prefix of every object"),
    secret: str = typer.Option("omni-pd-secrets", "--secret",
                               help="kubernetes: the Secret that holds secret env values (HF_TOKEN, API keys)"),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", min=1,
                                                help="kubernetes: devices one node offers; an instance with more "
                                                     "becomes a LeaderWorkerSet across nodes (default: each fits one)"),
    disaggregated_set: bool = typer.Option(False, "--disaggregated-set",
                                           help="kubernetes: both roles in one LWS DisaggregatedSet (lws v0.9.0 or "
                                                "later) instead of a workload per role"),
    vllm: str = typer.Option("vllm", "--vllm", help="the `vllm` executable on the hosts"),
    python: str = typer.Option("python3", "--python", help="the Python with omni-pd installed on the hosts: runs "
                               "the PD router (default: python3 from the host's PATH)"),
    port: int = typer.Option(8000, "--port", help="client port: the PD router, or the vllm-omni server"),
    engine_port_base: int = typer.Option(8100, "--engine-port-base", help="prefill HTTP port (decode: +100)"),
    platform: LAUNCH_PLATFORM = typer.Option("cuda", "--platform", help="the accelerator the engines run on"),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="name clients use (default: --model)"),
    ready_timeout: float = typer.Option(1200.0, "--ready-timeout", help="seconds each engine may take to become healthy"),
    extra_arg: Optional[list[str]] = typer.Option(None, "--engine-arg", help="extra `vllm serve` argument for every engine (repeatable)"),
    env: Optional[list[str]] = typer.Option(None, "--env", help="KEY=VALUE for every process (repeatable; a secret's "
                                            "value is read from the host's environment, never written)"),
    router_workers: Optional[int] = typer.Option(None, "--router-workers", help="PD router processes (1..64; default: "
                                                 "sized by the router for the CPUs of the host it runs on)"),
    select: Optional[list[str]] = typer.Option(None, "--select", help=SELECT_HELP + "; as validate"),
    ignore: Optional[list[str]] = typer.Option(None, "--ignore", help=IGNORE_HELP + "; as validate"),
    force: bool = typer.Option(False, "--force", help="write into an existing directory, over the files render "
                               "writes there (others are left alone)"),
    namespace: Optional[str] = typer.Option(None, "--namespace", "-n",
                                            help="kubernetes: the namespace of every object (and the Kustomization)"),
    monitoring: bool = typer.Option(True, "--monitoring/--no-monitoring", help="kubernetes: monitoring.yaml (PodMonitor, "
                                    "PrometheusRule, Grafana dashboard ConfigMap; needs the Prometheus Operator's CRDs)"),
) -> None:
    """Write what runs the deployment: one script per host, the config and the placement.

    Validate's errors refuse the render, suppressed as validate and launch suppress them
    (``# omni-pd: ignore[CODE]`` comments, --select/--ignore, [tool.omni-pd]).
    """
    from omni_pd import cli_options
    from omni_pd.diagnostics import render_text, summary
    from omni_pd.io import load_file
    from omni_pd.io_write import atomic_write
    from omni_pd.launch.plan import LaunchOptions, plan_document
    from omni_pd.launch.preflight import plan_checks
    from omni_pd.render.scripts import DEPLOY, executable, render_scripts

    cli_options.port(port, "--port")
    cli_options.port(engine_port_base, "--engine-port-base")
    if router_workers is not None and not 1 <= router_workers <= 64:
        raise typer.BadParameter(f"{router_workers} is outside 1..64", param_hint="--router-workers")
    inputs = [str(config)] + ([str(inventory)] if inventory is not None else [])
    to_stdout = str(to) == "-"
    if to_stdout and target != "kubernetes":
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message="--to - writes Kubernetes manifests to stdout; scripts are one file per host",
                                     help="add --target kubernetes, or give --to a directory"))
    if not to_stdout and to.exists() and not to.is_dir():
        raise OmniPdError(Diagnostic(code="OPD005", severity=Severity.ERROR,
                                     message=f"--to {to}: exists and is not a directory",
                                     help="pass a directory (new, empty, or existing with --force)"))
    if not to_stdout and not force and to.exists() and any(to.iterdir()):
        raise OmniPdError(Diagnostic(code="OPD005", severity=Severity.ERROR,
                                     message=f"--to {to}: exists and is not an empty directory",
                                     help="pass a new directory, or --force to write over the files render writes there"))
    if target != "kubernetes" and (gpus_per_node is not None or disaggregated_set):
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message="--gpus-per-node and --disaggregated-set shape Kubernetes workloads",
                                     help="add --target kubernetes, or drop them for scripts"))
    if target != "kubernetes" and not monitoring:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message="--no-monitoring leaves monitoring.yaml out of a Kubernetes render; "
                                             "scripts write none",
                                     help="add --target kubernetes, or drop --no-monitoring"))
    if target != "kubernetes" and namespace is not None:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message="--namespace places Kubernetes objects; scripts have none",
                                     help="add --target kubernetes, or drop --namespace"))
    if namespace is not None:
        import re

        from omni_pd.render.kubernetes import NAMESPACE_RE

        if not re.fullmatch(NAMESPACE_RE, namespace):
            raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                         message=f"--namespace {namespace}: not a Kubernetes namespace name "
                                                 "(lowercase letters, digits and '-', at most 63)",
                                         help="e.g. --namespace team-a"))
    inv = inventory_opt(inventory)
    kept, hidden = plan_suppression(config, select, ignore)  # before the config is read, as launch
    doc = load_file(config)
    if inv is None:
        _require_header_inventory(doc)
    opts = LaunchOptions(model=model, vllm=vllm, port=port, engine_port_base=engine_port_base, platform=platform,
                         served_model_name=served_model_name, ready_timeout_s=ready_timeout,
                         extra_args=tuple(extra_arg or ()), env=pairs(env, "--env"), router_workers=router_workers,
                         router_python=python)
    planned = plan_document(doc, DEPLOY, opts, inventory=inv, suppress=kept, model=served_model_facts(model))
    res, plan = planned.validation, planned.plan
    problems = [d for d in res.diagnostics if d.severity is Severity.ERROR] if plan is None else plan_checks(plan)
    if problems:
        sys.stdout.write(render_text(problems, _line_source(res.docs)) + "\n")
        sys.stdout.write(f"{doc.name}: not rendered ({summary(problems)}{_hidden(hidden[0])})\n")
        raise SystemExit(1)
    from omni_pd.launch.plan import hosts_of

    if target == "kubernetes":
        where = _plan_placement(plan, inv, doc)
        files = _kubernetes_files(plan, planned.topology, doc, image, router_image, name, platform, secret,
                                  gpus_per_node, disaggregated_set,
                                  tuple(where.addresses.values()) if where is not None else (), namespace, monitoring)
        if to_stdout:
            from omni_pd.render.kubernetes import as_stream

            sys.stdout.write(as_stream(files))
            sys.stdout.flush()
            return
    else:
        files = render_scripts(plan, doc.text, _plan_placement(plan, inv, doc), source=config.name, platform=platform,
                               stages=_role_stages(planned.topology))
        _check_scripts(files)
    to.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        atomic_write(to / name, text, protect=inputs)
    for name in executable(files):
        (to / name).chmod(0o755)
    hosts = hosts_of(plan)
    said = ([f"hosts {', '.join(hosts)}"] if hosts else []) + ([f"{hidden[0]} suppressed"] if hidden[0] else [])
    sys.stderr.write(f"wrote {to}: {', '.join(files)}" + (f" ({'; '.join(said)})" if said else "") + "\n")


def _require_header_inventory(doc) -> None:
    """For ``render`` without ``--inventory``: a file compiled with ``expand --inventory``
    (its header records the placement, :func:`omni_pd.check.validate.header_placement`) is
    planned per host, with the hosts' addresses and devices: rendered as one host, its two
    sides collided on one port (OPD960). OPD006 asks for the inventory instead."""
    from omni_pd.check.validate import header_placement

    found = header_placement(doc.text or "")
    if found is not None:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message=f"{doc.name} was compiled for an inventory ({found[1]}); pass --inventory",
                                     help=f"pass the inventory it was compiled with: omni-pd render {doc.name} "
                                          "--inventory HOSTS.yaml ..."))


def _kubernetes_files(plan, topo, doc, image: Optional[str], router_image: str, name: str, platform: str,
                      secret: str, gpus_per_node: Optional[int] = None, disaggregated_set: bool = False,
                      addresses: tuple = (), namespace: Optional[str] = None, monitoring: bool = True) -> dict:
    """``render --target kubernetes``: the manifests (:mod:`omni_pd.render.kubernetes`),
    validated before anything is written: every core object with the kubernetes-validate
    package's schemas (strict), LeaderWorkerSet and DisaggregatedSet with their bundled CRD
    schemas (:mod:`omni_pd.render.crd_schema`), and ``kubectl kustomize`` where kubectl is installed. A
    plan without a Kubernetes rendering is OPD006 (exit 2); an object that does not
    validate is a bug (OPD000, exit 3)."""
    import shutil
    import subprocess
    import tempfile

    from omni_pd.render.kubernetes import RenderError, render_kubernetes, validate_manifests

    try:
        files = render_kubernetes(plan, doc.text, name=name, image=image, router_image=router_image,
                                  platform=platform, secret=secret, stages=_role_stages(topo),
                                  gpus_per_node=gpus_per_node, disaggregated_set=disaggregated_set,
                                  stage_devices={s.stage_id: s.devices for s in topo.stages} if topo else {},
                                  addresses=addresses, namespace=namespace, monitoring=monitoring)
    except RenderError as e:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=f"render --target kubernetes: {e}",
                                     help=e.help)) from None
    except ValueError as e:  # a manifest would carry a secret value
        raise OmniPdError(Diagnostic(code="OPD000", severity=Severity.ERROR, message=f"internal error: {e}",
                                     help="this is a bug in omni-pd (nothing was written); please report it"),
                          exit_code=3) from None
    try:
        problems = validate_manifests(files)
    except ImportError:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message="render --target kubernetes validates every manifest offline with the "
                                             "kubernetes-validate package, which is not installed",
                                     help="pip install kubernetes-validate (nothing was written)")) from None
    kubectl = shutil.which("kubectl")
    if not problems and kubectl is not None:
        with tempfile.TemporaryDirectory() as tmp:
            for fname, text in files.items():
                Path(tmp, fname).write_text(text)
            r = subprocess.run([kubectl, "kustomize", tmp], capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                problems.append(f"kubectl kustomize: {r.stderr.strip()}")
    if problems:
        raise OmniPdError(Diagnostic(code="OPD000", severity=Severity.ERROR,
                                     message="internal error: rendered manifests do not validate: " + "; ".join(problems),
                                     help="this is a bug in omni-pd (nothing was written); please report it"),
                          exit_code=3)
    return files


def _role_stages(topo) -> dict:
    """Process role -> the compiled stage id it runs (``prefill``, ``decode``, ``encoder``;
    an E -> PD instance: ``pd``), for the messages and labels of ``render``; {} without a
    topology."""
    if topo is None:
        return {}
    pair, pipe = topo.pd_pair, topo.pipeline
    out = {"prefill": pair[0].stage_id, "decode": pair[1].stage_id} if pair is not None else {}
    if pipe.encoder is not None:
        out["encoder"] = pipe.encoder.stage_id
        if pair is None and pipe.ec_consumer is not None:
            out["pd"] = pipe.ec_consumer.stage_id  # the one stage that runs prefill and decode
    return out


def _plan_placement(plan, inv, doc):
    """The :class:`~omni_pd.compile.placement.Placement` ``plan`` was built with (the
    inventory's, completed for the config's pipeline), None without an inventory."""
    if inv is None or not inv.hosts:
        return None
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.placement import resolve_placement

    pipe = load_catalogue().get(str(doc.tree.get("pipeline")))
    return resolve_placement(pipe.stages, inv) if pipe is not None else None


def _check_scripts(files: dict) -> None:
    """``bash -n`` on every rendered script before anything is written: a script bash
    cannot parse is a bug in omni-pd (OPD000, exit 3)."""
    import shutil
    import subprocess

    bash = shutil.which("bash")
    if bash is None:
        return
    for name, text in files.items():
        if not name.endswith(".sh"):
            continue
        r = subprocess.run([bash, "-n"], input=text, capture_output=True, text=True)
        if r.returncode != 0:
            raise OmniPdError(Diagnostic(code="OPD000", severity=Severity.ERROR,
                                         message=f"internal error: rendered {name} does not parse: {r.stderr.strip()}",
                                         help="this is a bug in omni-pd (nothing was written); please report it"),
                              exit_code=3)
