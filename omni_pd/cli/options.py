"""Option types and option values the commands share: closed choices as ``Literal`` (an unknown
value is the parser's usage error, exit 2), ``--inventory`` and other YAML option files,
``KEY=VALUE`` pairs, ``--select``/``--ignore`` help.
"""

from pathlib import Path
from typing import Literal, Optional

import typer

from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity

# Closed-set options are typer Choices (``Literal``): an unknown value is the parser's usage
# error (exit 2, the choices listed) before any file is read, on every command alike.
# Spelt out here because importing the modules that own them costs ~0.1 s per start
# (bench/RESULTS.md figure 5); tests/test_walkthrough_cli_values.py holds them equal.
#: ``--platform`` of validate, graph and diff: omni_pd/compile/topology.py ``PLATFORMS``
PLATFORM = Literal["cuda", "rocm", "npu", "xpu", "musa"]


#: launch's and validate's ``--platform``: omni_pd/compile/devices.py ``RUN_PLATFORMS``, one
#: per omni_pd/launch/plan.py ``DEVICE_ENV`` entry (``cpu`` selects no devices)
LAUNCH_PLATFORM = Literal["cuda", "rocm", "npu", "xpu", "musa", "cpu"]


def devices_opt(value: Optional[str], name: str):
    """Device indices of a ``--*-devices`` option (``"0,1"`` -> ``(0, 1)``), None when not
    given; anything else is the parser's usage error naming ``name`` (exit 2)."""
    if value is None:
        return None
    from omni_pd.compile.devices import parse_devices

    try:
        d = parse_devices(value)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint=name) from None
    if not isinstance(d, tuple):
        raise typer.BadParameter('give device indices like "0,1"', param_hint=name)
    return d


def npu_platform_opt(value: Optional[str]) -> Optional[str]:
    """``--platform``: only ``npu`` changes what expand writes (exit 2 otherwise)."""
    if value is None or value == "npu":
        return value
    raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                 message=f"--platform {value!r}: expand knows only npu here",
                                 help="leave --platform out for the CUDA base (overlays are rewritten as they are)"))


def npu_connector_opt(value: str) -> str:
    """``--npu-connector``: a vllm-ascend connector expand can emit
    (:func:`omni_pd.compile.ascend.emits`); OPD006 (exit 2) naming the choices otherwise."""
    from omni_pd.compile import ascend

    if not ascend.emits(value):
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                     message=f"--npu-connector {value!r} is not a vllm-ascend PD connector",
                                     help=f"use {ascend.PULL} (pull) or {ascend.PUSH} (layerwise push)"))
    return value


#: what each option file is, for the help of a diagnostic about it
OPTION_FILE_HELP = {
    "--inventory": "--inventory takes a YAML file of hosts and stage placement "
                   "(docs/validate.md, Inventory and model facts)",
    "--model-info": "--model-info takes the model's Hugging Face config.json (the file next to the weights, "
                    "e.g. <model dir>/config.json; docs/validate.md, Inventory and model facts)",
}


def load_yaml_option(path: Path, option: str):
    """Read a small YAML/JSON option file (``--inventory``, ``--model-info``) as plain data.
    A file that cannot be read or parsed is OPD001..OPD004 naming ``option`` with that
    option's help (exit 2)."""
    from dataclasses import replace

    from omni_pd.compile.parse import to_plain
    from omni_pd.io import load_file

    try:
        doc = load_file(path)
    except OmniPdError as e:
        d = e.diagnostic
        raise OmniPdError(replace(d, message=f"{option} {path}: {d.message}",
                                  help=OPTION_FILE_HELP.get(option, d.help)), e.exit_code) from None
    return to_plain(doc.tree)


def inventory_opt(path: Optional[Path]):
    """The :class:`~omni_pd.check.context.Inventory` of ``--inventory PATH`` (None without
    one); a malformed file is OPD006 (exit 2) naming the bad key."""
    if path is None:
        return None
    from omni_pd.check.context import Inventory

    try:
        return Inventory.from_dict(load_yaml_option(path, "--inventory"))
    except ValueError as e:
        raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=f"--inventory {path}: {e}",
                                     help="see `omni-pd explain OPD402` for the inventory format")) from None


def served_model_facts(model: str):
    """The :class:`~omni_pd.check.context.ModelInfo` of ``--model`` when it is a local
    checkpoint directory (its ``config.json``), else None: launch and render judge the
    model-dependent rules as ``validate --model-info`` does."""
    from omni_pd.check.context import ModelInfo

    return ModelInfo.from_model_dir(model)


def placed_inventory(inv, topo):
    """``inv`` with every stage of ``topo`` placed (:func:`omni_pd.compile.placement.
    resolve_placement`: the inventory's placement, else omni-pd's proposal), so validate and
    launch read the placement expand compiled for; None stays None."""
    from omni_pd.check.validate import placed_inventory

    return placed_inventory(inv, topo.pipeline if topo is not None else None)


def pairs(items: Optional[list[str]], name: str) -> dict[str, str]:
    """Repeatable ``KEY=VALUE`` options (``--env``, ``--serve-arg``) as a dict, the last of a
    repeated key winning; an item without ``=`` or with an empty key is a usage error naming
    ``name`` (exit 2)."""
    out: dict[str, str] = {}
    for it in items or []:
        k, sep, v = it.partition("=")
        if not sep or not k.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {it!r}", param_hint=name)
        out[k.strip()] = v.strip()
    return out


#: ``--select`` / ``--ignore`` of validate and launch (one meaning: omni_pd/check/suppress.py)
SELECT_HELP = ("report only these codes, code prefixes or rule names (comma-separated, repeatable; replaces the "
                "config file's select)")


IGNORE_HELP = "do not report these codes, code prefixes or rule names (comma-separated, repeatable; on top of [tool.omni-pd])"
