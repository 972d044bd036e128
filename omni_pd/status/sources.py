"""Where ``omni-pd status`` looks: the instances of a deployment and its PD pairs.

Three sources, one :class:`~omni_pd.status.verdict.Target`:

* a local ``omni-pd launch`` run directory: its ``plan.json`` (every process, its health
  URL, its role) and ``<name>.log`` beside it (read for expired KV leases);
* a compiled deploy config (+ inventory): the same plan ``launch`` and ``render`` build
  (:func:`omni_pd.launch.plan.plan_document`: hosts' addresses and ports as they compute
  them), without logs;
* explicit ``role=URL`` pairs (``prefill=``, ``decode=``, ``router=``; a vllm-omni
  server's stage as ``decode=http://h:8000#stage=1``, the fragment naming the ``stage``
  label of that stage's series, never sent).

On the vllm-omni runtime prefill and decode are stages of one server: both instances
have its URL and are told apart by the ``stage`` label (the stage ids of the compiled
config's PD pair, as ``launch --smoke`` reads them).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import urlsplit

from omni_pd.status.verdict import Instance, Pair, Target

#: roles ``status`` looks at; others (encoder, the headless ``*-worker`` of an instance
#: spanning hosts, the ascend proxy) have no PD counters of their own
ROLES = ("prefill", "decode", "router")


class SourceError(ValueError):
    """The input does not say where a deployment is (a missing ``plan.json``, a URL
    that is not ``role=http://host:port``); the message names the input."""


def _base(url: str) -> str:
    """``http://h:p`` of a health URL ``http://h:p/health``."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _role(p: dict[str, Any]) -> str:
    """A process's role; a ``peer`` (a process on another host) by its name."""
    role = p.get("role") or ""
    if role == "peer":
        role = re.sub(r"-\d+$", "", p.get("name") or "")
    return role


def from_plan(plan: dict[str, Any], source: str, run_dir: str | None = None,
              stages: tuple[int, int] | None = None) -> Target:
    """The :class:`Target` of a launch plan as ``plan.json`` holds it (``LaunchPlan.to_json``).

    ``run_dir``: where ``<name>.log`` files are (None: logs not read); ``stages``: the
    (prefill, decode) stage ids of a vllm-omni pipeline. Raises :class:`SourceError` when
    the plan has no decode (nothing moves KV: E -> PD) or a vllm-omni plan has no stages."""
    runtime = plan.get("runtime") or "vllm"
    procs = [p for p in plan.get("processes") or [] if isinstance(p, dict)]
    entry, model = plan.get("entrypoint"), _served_name(procs) or plan.get("model")

    def log(name: str) -> str | None:
        return os.path.join(run_dir, name + ".log") if run_dir is not None else None

    if runtime == "vllm-omni":
        head = next((p for p in procs if _role(p) == "omni"), None)
        url = _base(head["health"]["url"]) if head and head.get("health") else (plan.get("entrypoint") or "")
        if stages is None:
            raise SourceError(f"{source}: a vllm-omni plan, and the PD stages of its config are not known")
        name = head["name"] if head else "omni"
        ps, ds = (str(s) for s in stages)
        # one server, one log: read once (under prefill's name), or every lease line would count twice
        insts = (Instance(f"prefill (stage {ps})", "prefill", url, ps, log(name)),
                 Instance(f"decode (stage {ds})", "decode", url, ds, None))
        return Target(runtime, insts, (Pair(insts[1].name, (insts[0].name,)),), source, entry, model)
    insts = []
    for p in procs:
        role = _role(p)
        if role not in ROLES:
            continue
        health = p.get("health") or {}
        url = _base(health["url"]) if health.get("url") else None
        if url is None and role == "router":
            url = (plan.get("entrypoint") or "").rstrip("/") or None
        if url is None:
            continue
        insts.append(Instance(p["name"], role, url, None, log(p["name"]) if role != "router" else None))
    prefills = tuple(i.name for i in insts if i.role == "prefill")
    pairs = tuple(Pair(i.name, prefills) for i in insts if i.role == "decode")
    if not pairs:
        raise SourceError(f"{source}: the plan has no decode instance, so no KV moves between instances")
    return Target(runtime, tuple(insts), pairs, source, entry, model)


def _served_name(procs: list[dict[str, Any]]) -> str | None:
    """The ``--served-model-name`` of the first engine that has one (the name clients use)."""
    for p in procs:
        argv = list(p.get("argv") or [])
        for i, a in enumerate(argv):
            if a == "--served-model-name" and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith("--served-model-name="):
                return a.split("=", 1)[1]
    return None


def omni_stages(config: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(prefill, decode) stage ids of a compiled vllm-omni config's PD pair, resolved as
    ``validate`` resolves it; None when it has none. Raises OmniPdError for a file that
    cannot be read or parsed."""
    from omni_pd.check.validate import Locator, ValidateOptions, choose_pipeline
    from omni_pd.compile.parse import parse_config, to_plain
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve
    from omni_pd.io import load_file

    doc = load_file(Path(config))
    cfg = parse_config(doc)
    pipe, _ = choose_pipeline(cfg, Locator(doc), load_catalogue(), ValidateOptions(),
                              base_name=to_plain(doc.tree).get("base_config"))
    pair = resolve(cfg, pipe, None, doc).pd_pair
    return None if pair is None else (pair[0].stage_id, pair[1].stage_id)


def from_run_dir(run_dir: str | os.PathLike[str]) -> Target:
    """The :class:`Target` of a local ``omni-pd launch`` run directory (its ``plan.json``;
    logs ``<name>.log``). Raises :class:`SourceError` when ``plan.json`` is missing or not
    a plan."""
    rd = Path(run_dir)
    path = rd / "plan.json"
    try:
        plan = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SourceError(f"{path}: cannot read the launch plan ({e.strerror or e}); is {rd} the run "
                          "directory of `omni-pd launch`?") from None
    except ValueError as e:
        raise SourceError(f"{path}: not JSON: {e}") from None
    if not isinstance(plan, dict) or "processes" not in plan:
        raise SourceError(f"{path}: not a launch plan (no `processes`)")
    stages = None
    if plan.get("runtime") == "vllm-omni":
        stages = omni_stages(plan["config"]) if plan.get("config") else None
    return from_plan(plan, f"run directory {rd}", str(rd), stages)


_URL = re.compile(r"^(?P<role>[a-z]+)=(?P<url>https?://[^\s#]+)(?:#stage=(?P<stage>\d+))?$")


def from_urls(items: Iterable[str]) -> Target:
    """The :class:`Target` of ``--url role=URL`` values (roles ``prefill``, ``decode``,
    ``router``; ``#stage=N`` after a vllm-omni server's URL). Every decode is paired with
    every prefill. Raises :class:`SourceError` for a malformed value, an unknown role, or
    no decode."""
    insts: list[Instance] = []
    count: dict[str, int] = {}
    for item in items:
        m = _URL.match(item.strip())
        if not m or m.group("role") not in ROLES:
            raise SourceError(f"--url {item!r}: expected ROLE=http://HOST:PORT with ROLE one of "
                              f"{', '.join(ROLES)} (a vllm-omni stage: decode=http://HOST:PORT#stage=N)")
        role, stage = m.group("role"), m.group("stage")
        base = _base(m.group("url"))
        n = count.get(role, 0)
        count[role] = n + 1
        name = role if role == "router" else (f"{role} (stage {stage})" if stage is not None else f"{role}-{n}")
        if role == "router" and n:
            raise SourceError(f"--url {item!r}: one router only")
        insts.append(Instance(name, role, base, stage))
    prefills = tuple(i.name for i in insts if i.role == "prefill")
    pairs = tuple(Pair(i.name, prefills) for i in insts if i.role == "decode")
    if not pairs:
        raise SourceError("--url: no decode=URL given; status judges a pair by decode's counters")
    runtime = "vllm-omni" if any(i.stage is not None for i in insts) else "vllm"
    router = next((i.url for i in insts if i.role == "router"), None)
    omni = next((i.url for i in insts if i.stage is not None), None)
    return Target(runtime, tuple(insts), pairs, "--url", router or omni)


def from_config(config: str | os.PathLike[str], inventory: Any = None, *, port: int = 8000,
                engine_port_base: int = 8100, platform: str = "cuda") -> Target:
    """The :class:`Target` of a compiled deploy config (+ ``inventory``, an
    :class:`~omni_pd.check.context.Inventory`): the plan ``launch``/``render`` build with
    these ports (``port``: router or vllm-omni server; ``engine_port_base``: prefill's
    first HTTP port, decode +100). Raises :class:`SourceError` when the config does not
    plan (its errors counted in the message), OmniPdError when it cannot be read."""
    from omni_pd.io import load_file
    from omni_pd.launch.plan import LaunchOptions, plan_document

    doc = load_file(Path(config))
    host = "127.0.0.1"
    opts = LaunchOptions(model="status", port=port, engine_port_base=engine_port_base, platform=platform, host=host)
    planned = plan_document(doc, str(Path(config).resolve()), opts, inventory=inventory)
    if planned.plan is None or planned.topology is None:
        errors = [d for d in planned.validation.diagnostics if d.severity.name == "ERROR"]
        first = f": {errors[0].code} {errors[0].message}" if errors else ""
        raise SourceError(f"{config}: does not plan ({len(errors)} error{'s' if len(errors) != 1 else ''}{first}); "
                          "`omni-pd validate` shows them")
    plan = planned.plan.to_json()
    pair = planned.topology.pd_pair
    stages = (pair[0].stage_id, pair[1].stage_id) if pair else None
    where = f"{config}" + (" + inventory" if inventory is not None else "")
    return from_plan(plan, where, None, stages)
