"""A launch plan as shell text (pure): ``launch --dry-run`` and ``render --to DIR``.

:func:`words` turns one :class:`~omni_pd.launch.spec.ProcessSpec` into the shell words
that run exactly its ``argv`` with exactly its ``env``: every word quoted with
:func:`shlex.quote` (the JSON of ``--kv-transfer-config`` arrives byte for byte), and a
secret (an env name or a flag :func:`~omni_pd.launch.spec.is_secret` names: ``HF_TOKEN``,
``--api-key``) never written but read from the shell's environment when the command runs,
``"${HF_TOKEN:?set HF_TOKEN in the environment of this host}"`` (bash stops before
running the command when it is unset). ``render``'s scripts (omni_pd/render/scripts.py)
and the dry-run blocks here use these words; nothing else quotes a plan.

:func:`dry_run_text` is what ``omni-pd launch CONFIG --dry-run`` prints: a comment
header (pipeline, how launch serves it, connector, entrypoint), a summary table (process,
role, host, devices, ports, health) and the plan's notes as ``#`` comments, then one
block per process to start: its comment header (name, role, host, health URL, what it
waits for), its environment as ``VAR=value`` assignments and its command, one flag per
``\\``-continued line. The whole text is valid bash; each block pastes into a shell as is.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Any

from omni_pd.launch.spec import LaunchPlan, ProcessSpec, is_secret, secret_flag
from omni_pd.compile.connectors.mooncake import binds_every_interface

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def secret_ref(name: str) -> str:
    """``"${NAME:?...}"``: the value of the secret variable ``name`` in the environment of
    the shell that runs the command (bash refuses the command when it is unset)."""
    return f'"${{{name}:?set {name} in the environment of this host}}"'


def flag_var(flag: str) -> str:
    """``--api-key`` (or ``--api-key=``) -> ``API_KEY``: the variable a secret flag's value
    is read from."""
    return flag.strip("-=").replace("-", "_").upper()


@dataclass(frozen=True)
class Words:
    """The shell words of one process. ``env``: one ``NAME=value`` word per variable of
    ``spec.env``, in its order (``NAME`` as written when it is a shell name, quoted
    otherwise, so the words suit ``env`` and, for shell names, bash's own assignments);
    ``argv``: one word per argument; ``secrets``: the variables the words read from the
    environment (:func:`secret_ref`), first use first."""

    env: tuple[str, ...]
    argv: tuple[str, ...]
    secrets: tuple[str, ...]


def words(spec: ProcessSpec) -> Words:
    """:class:`Words` of ``spec`` (a process with an ``argv``). Pure."""
    env: list[str] = []
    secrets: list[str] = []
    for k, v in spec.env.items():
        name = k if _NAME.fullmatch(k) else shlex.quote(k)
        if is_secret(k):
            env.append(f"{name}={secret_ref(k)}")
            secrets.append(k)
        else:
            env.append(f"{name}={shlex.quote(v)}")
    argv: list[str] = []
    for i, a in enumerate(spec.argv):
        flag = secret_flag(spec.argv[i - 1] if i else "", a)
        if flag is None:
            argv.append(shlex.quote(a))
            continue
        var = flag_var(flag)
        argv.append(shlex.quote(flag) + secret_ref(var) if flag.endswith("=") else secret_ref(var))
        secrets.append(var)
    return Words(tuple(env), tuple(argv), tuple(dict.fromkeys(secrets)))


def command(spec: ProcessSpec) -> str:
    """The command that starts ``spec``, as lines joined by ``\\`` continuations: one
    ``NAME=value`` assignment per line (after an ``env`` line when a name is not a shell
    name), then the program and its leading words (``vllm serve MODEL``), then one
    ``--flag value`` per line. Run by bash, it executes ``spec.argv`` with ``spec.env``
    added to the shell's environment, and leaves the shell's own variables as they were."""
    w = words(spec)
    lines = ([] if all(_NAME.fullmatch(k) for k in spec.env) else ["env"]) + list(w.env)
    cmd: list[list[str]] = [[]]
    for word, raw in zip(w.argv, spec.argv):
        if raw.startswith("--") and cmd[-1]:
            cmd.append([])
        cmd[-1].append(word)
    lines += [" ".join(cmd[0])] + ["  " + " ".join(group) for group in cmd[1:]]
    return " \\\n".join(lines)


def _devices(p: ProcessSpec) -> str:
    if not p.device_env:
        return "-"
    out = f"{p.device_env}={p.devices}"
    if p.visible_devices is not None:  # remapped: the stage's entries index the variable
        out += f" (logical {p.logical_devices} of {p.device_env}={p.visible_devices})"
    return out


def summary_rows(plan: LaunchPlan) -> list[tuple[str, ...]]:
    """The summary table of ``plan`` (header first): process, role, host (only when a
    process has one), devices, ports, health URL; one row per process, peers included."""
    hosts = any(p.host for p in plan.processes)
    head = ("process", "role") + (("host",) if hosts else ()) + ("devices", "ports", "health")
    rows = [head]
    for p in plan.processes:
        ports = ", ".join(f"{u.port} {u.purpose}" + (" on 0.0.0.0" if binds_every_interface(u.purpose) else "")
                          for u in p.ports) or "-"
        rows.append((p.name, p.role) + ((p.host or "-",) if hosts else ())
                    + (_devices(p), ports, p.health.url if p.health else "-"))
    return rows


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(n) for c, n in zip(r, widths)).rstrip() for r in rows]


def block(spec: ProcessSpec, plan: LaunchPlan) -> str:
    """The dry-run block of ``spec`` (a process of ``plan`` to start): its comment header
    (name, role, host, health URL and timeout, the processes it waits for) and
    :func:`command`."""
    by_name = {p.name: p for p in plan.processes}
    head = [f"# {spec.name} ({spec.role})" + (f" on host {spec.host}" if spec.host else "")]
    if spec.health is not None:
        head.append(f"# health: {spec.health.url} (up to {spec.health.timeout_s:g} s)")
    waits = []
    for d in spec.depends_on:
        dep = by_name.get(d)
        on = f" (host {dep.host})" if dep is not None and dep.host and dep.host != spec.host else ""
        waits.append(d + on)
    head.append("# waits for: " + (", ".join(waits) + " (each healthy)" if waits else "nothing"))
    return "\n".join(head) + "\n" + command(spec) + "\n"


def dry_run_text(plan: LaunchPlan, *, launch_form: str, pipeline: str | None = None,
                 host: str | None = None) -> str:
    """What ``launch --dry-run`` prints for ``plan``.

    ``launch_form``: how launch serves the pipeline (:data:`omni_pd.compile.pipelines.
    LAUNCH_FORMS`, the text ``omni-pd pipelines`` lists); ``pipeline``: its name.
    ``host``: ``plan`` is the part of one inventory host (:func:`~omni_pd.launch.plan.
    for_host`, peers included); None with processes placed on hosts: every host's
    blocks, grouped by host in first-process order. Peers (processes of another host)
    appear in the summary and in ``waits for``, never as a block. Pure."""
    where = f" for host {host}" if host else ""
    title = f"{pipeline} ({launch_form})" if pipeline else launch_form
    out = [f"# launch plan{where}: {title}, {plan.connector}, entrypoint {plan.entrypoint}", "#"]
    out += ["# " + ln for ln in _table(summary_rows(plan))]
    exposed = sorted({u.port for p in plan.processes if p.role != "peer" for u in p.ports
                      if binds_every_interface(u.purpose)})
    notes = list(plan.notes) + ([
        f"port{'s' if len(exposed) > 1 else ''} {', '.join(map(str, exposed))} bind{'' if len(exposed) > 1 else 's'} "
        "0.0.0.0, every interface, whatever the config's addresses say (vLLM's Mooncake bootstrap server): "
        "reachable from the network, so firewall it"] if exposed else [])
    if notes:
        out.append("#")
        out += [f"# note: {n}" for n in notes]
    out += ["#", "# One block per process, in start order: run each in its own shell once the processes it",
            "# waits for answer their health URL (omni-pd launch without --dry-run does all of this)."]
    text = "\n".join(out) + "\n"
    started = [p for p in plan.processes if p.role != "peer"]
    groups: list[str | None] = [None]
    if host is None and any(p.host for p in started):
        groups = list(dict.fromkeys(p.host for p in started))
    for g in groups:
        mine = [p for p in started if g is None or p.host == g]
        if g is not None:
            text += f"\n# ===== host {g}: {', '.join(p.name for p in mine)} =====\n"
        text += "".join("\n" + block(p, plan) for p in mine)
    return text


def plan_json(plan: LaunchPlan) -> dict[str, Any]:
    """``plan.to_json()`` (secrets masked) with each process's ``shell``: its
    :func:`command` (a secret read from the environment), None for a peer."""
    d = plan.to_json()
    for p, spec in zip(d["processes"], plan.processes):
        p["shell"] = command(spec) if spec.argv else None
    return d
