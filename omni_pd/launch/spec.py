"""Launch plan data: what `omni-pd launch` starts, as plain, immutable data.

A :class:`LaunchPlan` is built from a compiled topology by :mod:`omni_pd.launch.plan`
(pure), checked by :mod:`omni_pd.launch.preflight`, and run by
:mod:`omni_pd.launch.supervisor`. Nothing here starts a process or touches a file.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from omni_pd.compile.port_plan import PortUse  # noqa: F401  (the port plan's; re-exported)

#: names (env names, or flags as ``API_KEY`` for ``--api-key``) whose values are secrets:
#: the whole name or its last ``_``-separated words are one of these. ``HF_TOKEN`` and
#: ``--hf-token`` (huggingface_hub; vLLM vllm/engine/arg_utils.py ``hf_token``),
#: ``VLLM_API_KEY`` and ``--api-key`` (vllm/envs.py, vllm/entrypoints/openai/cli_args.py),
#: ``OPENAI_API_KEY``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``*_PASSWORD``. Whole
#: words only: an engine argument that merely contains one (``--max-num-batched-tokens``,
#: ``--tokenizer``, ``--ssl-keyfile``) is a setting the user must see.
SECRET_ENV = re.compile(
    r"(?:.*_)?(?:TOKEN|API_KEY|APIKEY|SECRET|SECRET_KEY|SECRET_ACCESS_KEY|PRIVATE_KEY|ACCESS_TOKEN|AUTH_TOKEN"
    r"|PASSWORD|PASSWD|CREDENTIALS?)", re.IGNORECASE)
MASK = "***"


def is_secret(name: str) -> bool:
    """True when ``name`` (an env name such as ``HF_TOKEN``, or a flag's words such as
    ``api_key`` for ``--api-key``; ``-`` reads as ``_``) names a secret by
    :data:`SECRET_ENV`: ``HF_TOKEN``, ``OPENAI_API_KEY``, ``DB_PASSWORD`` are; the engine
    arguments ``max_num_batched_tokens``, ``tokenizer`` and ``kv_cache_dtype`` are not."""
    return bool(SECRET_ENV.fullmatch(name.replace("-", "_")))


def secret_flag(prev: str, arg: str) -> str | None:
    """The secret flag whose value ``arg`` carries, given the word before it (``prev``;
    ``""`` for the first word): ``"--api-key"`` when ``prev`` is that flag (``arg`` is
    the whole value), ``"--api-key="`` when ``arg`` is ``--api-key=VALUE`` (the value
    follows the ``=``); None when ``arg`` carries no secret (:func:`is_secret` on the
    flag's words). The one test masking (:meth:`ProcessSpec.masked_argv`) and the shell
    renderings (omni_pd/launch/shell.py) share."""
    if prev.startswith("--") and "=" not in prev and is_secret(prev[2:]):
        return prev
    if arg.startswith("--") and "=" in arg and is_secret(arg[2:].split("=", 1)[0]):
        return arg.split("=", 1)[0] + "="
    return None


@dataclass(frozen=True)
class HealthCheck:
    """Readiness probe: GET ``url`` until HTTP 200. ``timeout_s``: give up after this
    many seconds from the process start (sized for model load); the poll interval
    starts at ``interval_s`` and doubles up to ``max_interval_s``."""

    url: str
    timeout_s: float = 600.0
    interval_s: float = 0.25
    max_interval_s: float = 2.0


@dataclass(frozen=True)
class ProcessSpec:
    """One child process.

    ``name``: unique, used as the log prefix and log file name (``<run_dir>/<name>.log``).
    ``argv``: the full command as a list (no shell, ever). ``env``: variables added to
    the launcher's environment (values are strings). ``cwd``: working directory (None =
    the launcher's). ``devices``/``device_env``: the visible-device list and the variable
    that carries it (``CUDA_VISIBLE_DEVICES``, ``ASCEND_RT_VISIBLE_DEVICES``, ...; also
    present in ``env``): the physical ids the child sees, after the launcher's visibility
    variable (or the stage's own env value of it) remapped the stage's entries.
    ``logical_devices``: the stage's ``devices`` entries as written (``"0,1"``), set with
    ``devices``. ``visible_devices``: the visibility value they index
    (``CUDA_VISIBLE_DEVICES=4,5`` -> ``"4,5"``), None when unset (logical == physical;
    :func:`omni_pd.launch.plan.map_devices`). ``ports``: every port it binds (preflight try-binds them).
    ``health``: readiness probe, None = ready once started. ``depends_on``: names that
    must be healthy before this one starts. ``role``: ``prefill``/``decode``/``router``/
    ``omni``/``service``. ``modules``: Python modules the child needs importable
    (checked by preflight with ``python``). ``python``: the interpreter that must import
    ``modules`` (None: not checked). ``memory_fraction``: the share of each device's
    memory the engine takes (``gpu_memory_utilization``; preflight checks it).
    """

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    role: str = "engine"
    devices: str | None = None
    device_env: str | None = None
    logical_devices: str | None = None
    visible_devices: str | None = None
    ports: tuple[PortUse, ...] = ()
    health: HealthCheck | None = None
    depends_on: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    python: str | None = None
    memory_fraction: float = 0.9
    #: directories the process writes and a peer reads (EC shared storage): preflight OPD967
    writable_dirs: tuple[str, ...] = ()
    #: the inventory host it runs on (``launch --inventory``); None: the machine launch runs on.
    #: A ``role == "peer"`` process runs on another host: it has no ``argv``, is never started
    #: and only health-gated (:func:`omni_pd.launch.plan.for_host`)
    host: str | None = None
    #: a headless worker of an instance spanning hosts (vLLM's ``--nnodes``): the process (its
    #: node rank 0) whose ``health`` says the whole instance is up; on another host it is a
    #: peer there (:func:`omni_pd.launch.plan.for_host`). None: the process stands alone
    ready_with: str | None = None

    def masked_env(self) -> dict[str, str]:
        """``env`` with secret values replaced by ``***``."""
        return {k: (MASK if is_secret(k) else v) for k, v in self.env.items()}

    def masked_argv(self) -> list[str]:
        """``argv`` with the value after a secret flag (``--api-key``, ``--hf-token``) masked."""
        out: list[str] = []
        for i, a in enumerate(self.argv):
            flag = secret_flag(self.argv[i - 1] if i else "", a)
            out.append(a if flag is None else flag + MASK if flag.endswith("=") else MASK)
        return out


@dataclass(frozen=True)
class LaunchPlan:
    """Everything `omni-pd launch` will start, in start order.

    ``runtime``: ``vllm-omni`` (one ``vllm serve --omni`` process for the whole
    pipeline) or ``vllm`` (one ``vllm serve`` per prefill/decode instance + a router).
    ``entrypoint``: the URL clients call (router or omni server). ``connector``: the
    KV connector name (``none`` for E -> PD, which has no KV connector). ``config``: the
    compiled deploy file the plan was built from.
    """

    runtime: str
    model: str
    connector: str
    entrypoint: str
    config: str
    processes: tuple[ProcessSpec, ...]
    notes: tuple[str, ...] = ()
    #: encoder split (E->P->D, E->PD): the EC connector and its shared directory (None without E)
    ec_connector: str | None = None
    ec_storage: str | None = None

    def process(self, name: str) -> ProcessSpec:
        """The process called ``name`` (KeyError if absent)."""
        for p in self.processes:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict, secrets masked."""
        d = asdict(self)
        for p, spec in zip(d["processes"], self.processes):
            p["env"] = spec.masked_env()
            p["argv"] = spec.masked_argv()
        return d
