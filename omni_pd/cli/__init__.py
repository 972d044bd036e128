"""The ``omni-pd`` command line (typer): the app, and a table naming each command's module.

One module per command under ``omni_pd/cli/commands/``: it parses the options, calls the
layer that does the work, prints. A command's module is imported only when that command
runs or its ``--help`` is asked for (:data:`COMMANDS`, as pip's
``pip/_internal/commands/__init__.py``); ``omni-pd --help`` lists every command from the
table's one-line summaries without importing any. Shared pieces: :mod:`omni_pd.cli.options`
(option types and values), :mod:`omni_pd.cli.output` (printing), :mod:`omni_pd.cli.shared`
(what several commands resolve), :mod:`omni_pd.cli.expand_run` (expand's work, ``size
--write`` runs it too). The typer-free pieces stay beside the package:
:mod:`omni_pd.cli_entry` (the console entry point), :mod:`omni_pd.cli_validate` (validate's
run, the exit-status tail), :mod:`omni_pd.cli_options` (OPD006 value checks).

Exit status: 0 success (warnings/infos allowed), 1 errors found, 2 unreadable input or
bad usage, 3 internal error (a bug in omni-pd; set OMNI_PD_DEBUG=1 for the traceback).

``omni_pd.cli.app`` is the app with every command registered (tests, ``CliRunner``):
built on first use, it imports every command module; :func:`main` runs a lazy one.
"""

# no `from __future__ import annotations` in this package: typer reads every command's
# annotations, and string annotations cost a compile() each (bench figure 5)
import sys
from collections.abc import MutableMapping
from importlib import import_module
from typing import Callable, NamedTuple, Optional

import typer
from typer.core import TyperGroup

from omni_pd.cli_validate import GC_THRESHOLD_0, exit_status, with_gc_threshold  # noqa: F401  (tests read it here)


class Command(NamedTuple):
    """Where a command lives: ``omni_pd.cli.commands.<module>``, its function, and the
    one-line summary ``omni-pd --help`` prints (the first paragraph of the function's
    docstring; tests/test_cli.py holds them equal)."""

    module: str
    function: str
    summary: str


#: every command, in ``omni-pd --help`` order
COMMANDS: dict[str, Command] = {
    "expand": Command("expand", "expand",
                      "Split the Thinker of a deploy config into a prefill/decode pair (three stages -> four)."),
    "migrate": Command("migrate", "migrate",
                       "Rewrite a legacy `stage_args` file into the `stages:` deploy schema of the target release, "
                       "or (`--from A --to B`) a `stages:` file written for release A into B's form."),
    "schema": Command("schema", "schema",
                      "Print the JSON Schema of a deploy config (generated from omni-pd's pydantic model and the "
                      "target's facts: kv_role/kv_connector/ec_role/platform enums, port and size ranges, unknown "
                      "top-level and kv_transfer_config keys refused; omni_pd/compile/editor_schema.py)."),
    "pipelines": Command("pipelines", "pipelines", "List the catalogued pipelines and their stages."),
    "size": Command("size", "size",
                    "Size the Thinker's prefill/decode split with NVIDIA AIConfigurator for a traffic shape and "
                    "TTFT/TPOT targets, place the Talker and Code2Wav on the devices left, print why (extra: "
                    "omni-pd[sizing])."),
    "connectors": Command("connectors", "connectors",
                          "List the KV connectors omni-pd can emit, with the platforms they run on (a vllm-ascend "
                          "connector: npu only, at the vllm-ascend releases of presets/targets/vllm_ascend.yaml)."),
    "validate": Command("validate", "validate",
                        "Check deploy configs for every PD invariant; exit 0 clean, 1 errors, 2 unreadable input."),
    "graph": Command("graph", "graph",
                     "Draw the stage graph: roles, devices, KV connectors with kv_role, ports (tree, Mermaid or DOT)."),
    "diff": Command("diff", "diff_cmd",
                    "Show what expand changed, stage by stage (each output stage against the input stage it came "
                    "from)."),
    "rules": Command("rules", "rules_cmd",
                     "List every diagnostic code: the validate rules, then the codes of input, usage, expand, launch."),
    "explain": Command("explain", "explain",
                       "Print one code's documentation (a rule: with its failing and passing examples)."),
    "launch": Command("launch", "launch",
                      "Validate, plan, preflight, start and supervise the engines of a compiled PD config."),
    "render": Command("render", "render",
                      "Write what runs the deployment: one script per host, the config and the placement."),
    "status": Command("status", "status_cmd",
                      "Is PD happening? Each pair's verdict (PD working, falling back to local prefill, transfers "
                      "failing, instance down) from the engines' own metrics over a window; exit 0 healthy, 1 not "
                      "doing PD or an instance down, 2 nothing reachable or bad input."),
}

_HELP = "Compile vllm-omni deploy configs into prefill/decode (PD) disaggregated topologies."


def callback(name: str) -> Callable:
    """The function of command ``name`` (a key of :data:`COMMANDS`), its module imported.
    Raises KeyError for a name the table does not hold."""
    c = COMMANDS[name]
    return getattr(import_module(f"omni_pd.cli.commands.{c.module}"), c.function)


class _LazyCommands(MutableMapping):
    """A group's commands: the ones added to it, then every :data:`COMMANDS` entry, whose
    click command is built (module imported, typer's parameters made) on first lookup."""

    def __init__(self, added: MutableMapping) -> None:
        self._cmds = dict(added)

    def __getitem__(self, name: str):
        if name not in self._cmds:
            if name not in COMMANDS:
                raise KeyError(name)
            from typer.main import get_command_from_info
            from typer.models import CommandInfo

            self._cmds[name] = get_command_from_info(
                CommandInfo(name=name, short_help=COMMANDS[name].summary, callback=callback(name)),
                pretty_exceptions_short=True, rich_markup_mode=None)
        return self._cmds[name]

    def __setitem__(self, name: str, cmd) -> None:
        self._cmds[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self._cmds[name]

    def __iter__(self):
        yield from COMMANDS
        yield from (n for n in self._cmds if n not in COMMANDS)

    def __len__(self) -> int:
        return len(COMMANDS) + sum(n not in COMMANDS for n in self._cmds)

    def __contains__(self, name: object) -> bool:
        return name in COMMANDS or name in self._cmds


class LazyGroup(TyperGroup):
    """The root group: commands from :data:`COMMANDS`, each imported when looked up (run,
    its ``--help``, completion); the root ``--help`` lists them from the table's summaries
    without importing any (the rows typer's own ``format_commands`` writes)."""

    def __init__(self, **attrs) -> None:
        super().__init__(**attrs)
        self.commands = _LazyCommands(self.commands)

    def list_commands(self, ctx) -> list[str]:
        """Every command's name in table order (typer's own reads each command)."""
        return list(self.commands)

    def format_commands(self, ctx, formatter) -> None:
        """The ``Commands:`` section: name and summary per command, as typer writes it."""
        rows = [(name, COMMANDS[name].summary if name in COMMANDS else self.commands[name].get_short_help_str(
            formatter.width - 6 - max(len(n) for n in self.commands))) for name in self.list_commands(ctx)]
        if rows:
            from gettext import gettext as _  # typer's own heading, translated as it does

            with formatter.section(_("Commands")):
                formatter.write_dl(rows)


def _version_cb(value: bool) -> None:
    if value:
        from omni_pd.compile.versions import version_text

        sys.stdout.write(version_text())
        raise typer.Exit(0)


def _root(
    version: bool = typer.Option(False, "--version", callback=_version_cb, is_eager=True,
                                 help="print omni-pd's version and the vLLM / vllm-omni versions it targets, then exit"),
) -> None:
    """Compile vllm-omni deploy configs into prefill/decode (PD) disaggregated topologies."""


def make_app(register: bool = False) -> typer.Typer:
    """A typer app for ``omni-pd``: its commands come from :data:`COMMANDS` as they are
    looked up; ``register``: every command registered now (each module imported), for code
    that reads ``registered_commands``."""
    a = typer.Typer(name="omni-pd", help=_HELP, add_completion=True, no_args_is_help=True,
                    pretty_exceptions_enable=False, rich_markup_mode=None, cls=LazyGroup)
    a.callback()(_root)
    if register:
        for name, c in COMMANDS.items():
            a.command(name, short_help=c.summary)(callback(name))
    return a


def __getattr__(name: str):
    # ``omni_pd.cli.app``: every command registered, built on first use (module __getattr__)
    if name == "app":
        globals()["app"] = a = make_app(register=True)
        return a
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point: run the app, turning every failure into a diagnostic and exit code
    (:func:`omni_pd.cli_validate.exit_status`). The collector's thresholds are raised
    (:data:`GC_THRESHOLD_0`) for the run and restored on return."""
    return with_gc_threshold(lambda: _run(argv))


def _classify(e: Exception) -> Optional[int]:
    """The exit status typer/click give ``e``: ``Exit`` its code, a usage error 2 (shown),
    ``Abort`` 130; None for anything else."""
    if isinstance(e, typer.Exit):
        return e.exit_code
    if hasattr(e, "show") and hasattr(e, "exit_code"):  # click/typer usage errors
        e.show()
        return 2
    if type(e).__name__ == "Abort":
        return 130
    return None


def _run(argv: Optional[list[str]]) -> int:
    return exit_status(lambda: make_app()(args=argv, prog_name="omni-pd", standalone_mode=False), _classify)
