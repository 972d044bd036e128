"""The rule engine of ``omni-pd validate``: Rule, Context and the registry.

One module per rule family (yamllint style): ``schema`` (OPD1xx), ``topology``
(OPD2xx), ``pd_pair`` (OPD3xx), ``devices`` (OPD4xx), ``ports`` (OPD5xx),
``capability`` (OPD6xx), ``runtime`` (OPD7xx). A module declares its rules with the
:func:`rule` decorator; every module of this package is imported by :func:`registry`,
so adding a rule is one decorated function and nothing here changes.

Each rule carries a stable code, a severity, a one-line summary, a doc paragraph that
names its upstream source, and one FAILING and one PASSING YAML example. The examples
are tests (tests/test_rules.py); ``example_context`` gives the options an example
needs (``inventory``, ``model``, ``env``, ``cli``, ``platform``, ``vllm_version``).
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Callable, Iterable

from omni_pd.diagnostics import Diagnostic, Edit, Location, Severity
from omni_pd.compile.topology import as_int

if TYPE_CHECKING:
    from omni_pd.check.context import Inventory, ModelInfo
    from omni_pd.compile.model import DeployConfig
    from omni_pd.compile.targets import Target
    from omni_pd.compile.topology import StageNode, Topology

#: Parallel sizes a stage may set flat or under ``parallel_config`` (vllm-omni 0.30
#: OmniStageParallelConfig / OmniStageDiffusionParallelConfig size fields).
PARALLEL_SIZE_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                      "prefill_context_parallel_size", "cfg_parallel_size", "ulysses_degree", "ring_degree",
                      "allgather_degree", "hsdp_replicate_size", "hsdp_shard_size")

#: Parallel sizes only diffusion stages have (OmniStageDiffusionParallelConfig).
DIFFUSION_PARALLEL_KEYS = frozenset({"cfg_parallel_size", "ulysses_degree", "ring_degree", "allgather_degree",
                                     "use_hsdp", "hsdp_replicate_size", "hsdp_shard_size", "vae_patch_parallel_size",
                                     "text_encoder_tp_size", "sequence_parallel_size"})

FAMILIES = {
    "1": "schema", "2": "topology", "3": "pd_pair", "4": "devices",
    "5": "ports", "6": "capability", "7": "runtime",
}


@dataclass(frozen=True)
class Example:
    """One more example of a rule, beyond its failing and passing pair; each is a test.

    ``yaml`` validated with ``context`` (same keys as ``Rule.example_context``) must
    yield this rule's code at ``severity`` (``fires=True``; None = the rule's severity)
    with ``contains`` in the message when given, or must yield no error/warning of it
    (``fires=False``). ``name`` says which branch of the rule it covers.
    """

    name: str
    yaml: str
    fires: bool
    context: dict[str, Any] = field(default_factory=dict)
    severity: Severity | None = None
    contains: str | None = None


@dataclass(frozen=True)
class Rule:
    """One check. ``check(ctx)`` yields located :class:`Diagnostic` s with this code."""

    code: str
    name: str
    severity: Severity
    summary: str
    doc: str
    fail: str
    passing: str
    #: ``check(ctx, rule)`` yields this rule's diagnostics (``rule.diag(...)``)
    check: Callable[["Context", "Rule"], Iterable[Diagnostic]] = field(repr=False, compare=False)
    example_context: dict[str, Any] = field(default_factory=dict, compare=False)
    #: context of the passing example when it differs (None: same as the failing one)
    pass_context: dict[str, Any] | None = field(default=None, compare=False)
    #: case-catalogue labels this rule implements (shared/cases/README.md)
    labels: tuple[str, ...] = ()
    #: more examples, one per branch of the rule (tests/test_rules.py runs them)
    examples: tuple[Example, ...] = field(default=(), compare=False)
    #: the runtime whose behaviour the rule models: "vllm-omni" (one `vllm serve --omni`,
    #: its orchestrator and PD validator), "vllm" (plain `vllm serve` engines), or None
    #: (both). The pipeline's launcher selects the rules that run (:func:`run_rules`).
    runtime: str | None = None

    @property
    def family(self) -> str:
        return FAMILIES.get(self.code[3], "other")

    @property
    def runtime_scope(self) -> str | None:
        """What ``explain`` says after ``Runtime:`` (None for a rule of both runtimes)."""
        if not self.runtime:
            return None
        return f"{self.runtime} only (" + (
            "`vllm serve --omni`; not checked for pipelines launched as plain `vllm serve` engines)"
            if self.runtime == "vllm-omni" else "plain `vllm serve` engines)")

    def explain(self) -> str:
        """The text ``omni-pd explain CODE`` prints."""
        out = [f"{self.code} {self.name} ({self.severity.value}, {self.family})", "",
               self.summary, ""]
        if self.runtime:
            out += [f"Runtime: {self.runtime_scope}", ""]
        out += [self.doc.strip(), "", "Fails:", "",
               _indent(self.fail.strip()), "", "Passes:", "", _indent(self.passing.strip())]
        if self.example_context:
            out += ["", "Context of the failing example: " + ", ".join(
                f"{k}={v!r}" for k, v in self.example_context.items())]
        if self.pass_context is not None:
            out += ["Context of the passing example: " + (", ".join(
                f"{k}={v!r}" for k, v in self.pass_context.items()) or "none")]
        if self.examples:
            out += ["", "More examples (each is a test):"]
            out += [f"  {'fires' if e.fires else 'passes'}: {e.name}" for e in self.examples]
        return "\n".join(out) + "\n"

    def diag(self, message: str, location: Location | None, *, help: str | None = None,
             related: list[Location] | None = None, notes: list[str] | None = None,
             label: str | None = None, severity: Severity | None = None,
             reads: Iterable[tuple] = (), shadows: Iterable[tuple] = (),
             replace: tuple[str, str] | None = None) -> Diagnostic:
        """A diagnostic with this rule's code (and severity unless overridden).

        ``replace``: ``(old, new)``, the one replacement of the text at ``location`` that fixes
        the finding (an :class:`~omni_pd.diagnostics.Edit` for ``validate --fix``); dropped when
        ``location`` has no line/column.

        ``reads``: the key paths the finding judged (:meth:`Context.reads`), ``shadows``:
        the paths it leaves at their default (OPD103's key meant); both order findings
        root cause first (omni_pd/check/causes.py)."""
        return Diagnostic(code=self.code, severity=severity or self.severity, message=message,
                          location=location, help=help, related=list(related or []),
                          notes=list(notes or []), label=label, reads=tuple(reads), shadows=tuple(shadows),
                          edit=Edit(location.line, location.column, *replace)
                          if (replace and location is not None and location.line and location.column) else None)


def _indent(s: str) -> str:
    return "\n".join("    " + line for line in s.splitlines())


_DECLARED: list[Rule] = []


def rule(code: str, name: str, severity: Severity, summary: str, *, fail: str, passing: str,
         example_context: dict[str, Any] | None = None, pass_context: dict[str, Any] | None = None,
         labels: tuple[str, ...] = (), examples: tuple[Example, ...] = (), runtime: str | None = None):
    """Declare a rule; the decorated function's docstring is its doc paragraph."""

    def wrap(fn: Callable[["Context", Rule], Iterable[Diagnostic]]):
        r = Rule(code=code, name=name, severity=severity, summary=summary,
                 doc=(fn.__doc__ or "").strip(), fail=fail, passing=passing, check=fn,
                 example_context=dict(example_context or {}),
                 pass_context=dict(pass_context) if pass_context is not None else None, labels=labels,
                 examples=tuple(examples), runtime=runtime)
        _DECLARED.append(r)
        return fn

    return wrap


@lru_cache(maxsize=1)
def registry() -> dict[str, Rule]:
    """Code -> Rule, discovered by importing every module of this package."""
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")
    out: dict[str, Rule] = {}
    for r in _DECLARED:
        if r.code in out and out[r.code] is not r:
            raise RuntimeError(f"rule code {r.code} declared twice")
        out[r.code] = r
    return dict(sorted(out.items()))


def get(code: str) -> Rule | None:
    return registry().get(code.strip().upper())


@dataclass
class Context:
    """Everything a rule may read. ``topology`` is resolved for ``platform`` (None = base).

    ``env``: the launcher environment (e.g. CUDA_VISIBLE_DEVICES); ``cli``: global engine
    flags given on the command line, which vllm-omni broadcasts to every stage;
    ``raw``: the (base_config-merged) plain tree; ``parse_diagnostics``: OPD101s
    collected while parsing; ``pipeline_note``: how the pipeline was chosen.
    """

    doc: Any  # Document or a base_config-merged locator with the same loc() API
    config: "DeployConfig | None"
    topology: "Topology | None"
    target: "Target"
    platform: str | None = None
    inventory: "Inventory | None" = None
    model: "ModelInfo | None" = None
    env: dict[str, str] = field(default_factory=dict)
    cli: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)
    legacy: bool = False
    parse_diagnostics: list[Diagnostic] = field(default_factory=list)
    pipeline_note: Diagnostic | None = None
    #: False for the second and later platforms of --all-platforms (platform-independent
    #: rules run once)
    platform_first: bool = True
    #: the pipeline was named on the command line (``--pipeline``), not only guessed
    pipeline_given: bool = False
    #: the user named the vLLM release (``--vllm-version``); False: ``target`` is omni-pd's
    #: default and a release-dependent finding says which release it assumed
    #: (:meth:`release_words`)
    vllm_version_given: bool = False
    #: the :class:`~omni_pd.compile.placement.Placement` of the inventory (spans included:
    #: ``nodes_of``); None without an inventory
    placement: Any = None
    #: ``(--port, --engine-port-base)`` the launch derives its processes' ports from (launch's
    #: defaults unless the caller passes its own): the port plan OPD510 judges
    launch_ports: tuple[int, int] = (8000, 8100)
    #: the platform the engines run on (``--platform``, cpu included, which has no overlay)
    launch_platform: str | None = None

    # --- locating -------------------------------------------------------------------
    def exists(self, path: tuple) -> bool:
        return self.doc.exists(path)

    def stage_path(self, node: "StageNode", *keys: Any) -> tuple:
        """Path of ``keys`` inside the stage entry that sets it: the platform overlay
        entry when it does, else ``engine_args``/``runtime``/flat keys of the stage."""
        cands: list[tuple] = []
        if self.platform and keys:
            ov = self.raw_at(("platforms", self.platform, "stages"))  # any type when OPD101 reported it
            # the last entry of the stage first: vllm-omni applies them in file order, so it wins
            for j, o in reversed(list(enumerate(ov if isinstance(ov, list) else []))):
                if isinstance(o, dict) and o.get("stage_id") == node.stage_id:
                    base = ("platforms", self.platform, "stages", j)
                    cands += [base + ("runtime",) + keys, base + ("engine_args",) + keys, base + keys]
        if node.index is not None:
            base = ("stages", node.index)
            if keys:  # no keys: the stage entry itself, not its runtime/engine_args block
                cands += [base + ("runtime",) + keys, base + ("engine_args",) + keys]
            cands.append(base + keys)
            for i in range(len(keys) - 1, 0, -1):  # nearest existing ancestor inside the stage
                cands += [base + ("engine_args",) + keys[:i], base + keys[:i]]
            cands.append(base)
        for c in cands:
            if self.exists(c):
                return c
        return ("stages",) if self.exists(("stages",)) else ()

    def reads(self, node: "StageNode", *keys: str) -> tuple[tuple, ...]:
        """The stage paths ``("stages", i, key)`` of ``keys`` in ``node``'s entry, for a
        finding's ``reads`` (whether the key is set or left at its default); () for a
        stage without an entry of its own."""
        return tuple(("stages", node.index, k) for k in keys) if node.index is not None else ()

    def sloc(self, node: "StageNode", *keys: Any, value: bool = False, label: str | None = None) -> Location:
        """Location of ``keys`` in ``node``'s stage entry (see :meth:`stage_path`)."""
        path = self.stage_path(node, *keys)
        loc = self.doc.loc(path, value=value and bool(keys) and path[-1:] == keys[-1:])  # the key itself was found
        if label:
            loc = Location(file=loc.file, line=loc.line, column=loc.column, path=loc.path, label=label)
        return loc

    def loc(self, path: tuple, *, value: bool = False, label: str | None = None) -> Location:
        loc = self.doc.loc(path, value=value)
        if label:
            loc = Location(file=loc.file, line=loc.line, column=loc.column, path=loc.path, label=label)
        return loc

    def raw_at(self, path: tuple, default: Any = None) -> Any:
        """The value at ``path`` in the plain (base_config-merged) tree, as written."""
        from omni_pd.io import get_path

        return get_path(self.raw, path, default)

    # --- facts ----------------------------------------------------------------------
    def release_words(self) -> str:
        """``"vLLM 0.30"``, with ``" (assumed: no --vllm-version given)"`` when the user did
        not name the release, for messages whose finding depends on it."""
        return f"vLLM {self.target.label}" + self.assumed_note()

    def assumed_note(self) -> str:
        """``" (assumed: no --vllm-version given; pass --vllm-version X.Y)"`` when the user did
        not name the release, else ``""``: appended to a release a finding names (vLLM's, or the
        vllm-omni release aligned with it)."""
        return "" if self.vllm_version_given else " (assumed: no --vllm-version given; pass --vllm-version X.Y)"

    def host_of(self, node: "StageNode") -> str:
        """Host a stage runs on (inventory placement; one implicit host otherwise)."""
        return self.inventory.host_of(node.stage_id) if self.inventory else "localhost"

    def parallel(self, node: "StageNode") -> dict[str, int]:
        """The stage's effective parallel sizes (ints >= 1 where valid), by field name.

        Precedence, as vllm-omni 0.30 builds a stage's parallel config
        (config/omni_config.py ``_build_parallel_config`` merges the nested
        ``parallel_config`` over the flat keys; ``_stage_engine_values`` moves CLI
        parallel flags into the nested block for diffusion stages only): diffusion
        stages: CLI flag, nested, flat; other stages: nested, CLI flag, flat (the
        pipeline-wide ``pipeline_parallel_size``/``data_parallel_size`` count as flat)."""
        flat = {k: node.settings.get(k) for k in PARALLEL_SIZE_KEYS}
        # PP and DP fall back to the pipeline-wide top-level keys (node.pp/dp); TP is the stage's key
        flat["pipeline_parallel_size"], flat["data_parallel_size"] = node.pp, node.dp
        nested = node.settings.get("parallel_config")
        nested = nested if isinstance(nested, dict) else {}
        cli_wins = self.is_diffusion(node)  # LLM stages: the CLI value is flat, and nested wins over flat
        out: dict[str, int] = {}
        for k in PARALLEL_SIZE_KEYS:
            v = self.cli.get(k) if cli_wins or nested.get(k) is None else None
            if v is None:
                v = nested.get(k)
            if v is None:
                v = flat.get(k)
            out[k] = as_int(v)
        return out

    def is_diffusion(self, node: "StageNode") -> bool:
        """True for a diffusion stage: its pipeline says so, or it sets a diffusion-only
        parallel size (CFG, Ulysses, ring, all-gather, HSDP), flat or nested."""
        ps = self.topology.pipeline.stage(node.stage_id) if self.topology is not None else None
        if ps is not None and ps.execution_type.lower() == "diffusion":
            return True
        nested = node.settings.get("parallel_config")
        keys = set(node.settings) | (set(nested) if isinstance(nested, dict) else set())
        return bool(keys & DIFFUSION_PARALLEL_KEYS)

    def world_size(self, node: "StageNode") -> tuple[int, str]:
        """Devices one replica of the stage needs, and how (``"TP 4 x CFG 1"``).

        TP x PP x DP x PCP x SP x CFG, SP = allgather_degree if > 1 else ulysses x ring
        (vllm-omni 0.30 ``OmniStageDiffusionParallelConfig.__post_init__``,
        engine/stage_init_utils.py); with ``use_hsdp`` and the other sizes all 1, the
        HSDP replicate x shard product."""
        p = self.parallel(node)
        sp = p["allgather_degree"] if p["allgather_degree"] > 1 else p["ulysses_degree"] * p["ring_degree"]
        dims = [("TP", p["tensor_parallel_size"]), ("PP", p["pipeline_parallel_size"]),
                ("DP", p["data_parallel_size"]), ("PCP", p["prefill_context_parallel_size"]),
                ("SP", sp), ("CFG", p["cfg_parallel_size"])]
        world = 1
        for _, v in dims:
            world *= v
        shown = [f"{n} {v}" for n, v in dims if n in ("TP", "PP", "DP") or v > 1]
        nested = node.settings.get("parallel_config")
        hsdp = self.cli.get("use_hsdp", (nested or {}).get("use_hsdp") if isinstance(nested, dict) else None)
        if hsdp is None:
            hsdp = node.settings.get("use_hsdp")
        if hsdp is True and world == 1:
            shard = p["hsdp_shard_size"]
            if shard > 0:
                world = p["hsdp_replicate_size"] * shard
                shown = [f"HSDP {p['hsdp_replicate_size']} x {shard}"]
        return world, " x ".join(shown)

    def stage_tp(self, node: "StageNode") -> int:
        """Tensor parallel size, with a global ``--tensor-parallel-size`` broadcast.

        The flat stage key only: rules that must see a nested ``parallel_config``
        (world size, OPD112, OPD612) use :meth:`parallel`."""
        return as_int(self.cli.get("tensor_parallel_size"), node.tp)

    def stage_pp(self, node: "StageNode") -> int:
        return as_int(self.cli.get("pipeline_parallel_size"), node.pp)

    def stage_dp(self, node: "StageNode") -> int:
        return as_int(self.cli.get("data_parallel_size"), node.dp)

    def setting(self, node: "StageNode", key: str, default: Any = None) -> Any:
        if key in self.cli:
            return self.cli[key]
        return node.settings.get(key, default)

    @property
    def catalogued(self) -> bool:
        """True when the topology's pipeline is one of omni-pd's catalogue (roles known)."""
        from omni_pd.compile.pipelines import load_catalogue

        return self.topology is not None and load_catalogue().get(self.topology.pipeline.name) is self.topology.pipeline

    def stage_kind_known(self, node: "StageNode") -> bool:
        """True when the stage is known to be a vLLM LLM engine (defaults apply)."""
        ps = self.topology.pipeline.stage(node.stage_id) if self.topology is not None else None
        return ps is not None and ps.execution_type.startswith("LLM")

    @property
    def pd_pair(self) -> "tuple[StageNode, StageNode] | None":
        return self.topology.pd_pair if self.topology is not None else None

    @property
    def launcher(self) -> str | None:
        """How the pipeline's engines run: ``vllm-omni`` (one ``vllm serve --omni``) or
        ``vllm`` (one plain ``vllm serve`` per engine); None without a topology."""
        if self.topology is None:
            return None
        p = self.topology.pipeline
        return str(getattr(p, "launcher", None) or p.runtime)


def run_rules(ctx: Context, rules: Iterable[Rule] | None = None) -> list[Diagnostic]:
    """Run ``rules`` (default: all) over ``ctx``; a rule that crashes yields OPD000."""
    out: list[Diagnostic] = []
    for r in (rules if rules is not None else registry().values()):
        if r.runtime is not None and ctx.launcher is not None and r.runtime != ctx.launcher:
            continue  # the rule models another runtime's behaviour
        try:
            out.extend(r.check(ctx, r))
        except Exception as e:  # a bug in one rule must not hide the others
            import os

            if os.environ.get("OMNI_PD_DEBUG"):
                raise
            out.append(Diagnostic(code="OPD000", severity=Severity.ERROR,
                                  message=f"internal error in rule {r.code}: {type(e).__name__}: {e}",
                                  help="this is a bug in omni-pd; rerun with OMNI_PD_DEBUG=1"))
    return out
