"""``omni-pd validate``: the options; the run is :func:`omni_pd.cli_validate.run_validate`
(the console entry point runs a plain ``validate FILE...`` through it without typer).
"""

from pathlib import Path
from typing import Literal, Optional

import typer

from omni_pd.cli.options import IGNORE_HELP, LAUNCH_PLATFORM, OPTION_FILE_HELP, SELECT_HELP, load_yaml_option, pairs
from omni_pd.cli_validate import _cli_layer, _no_pydantic_plugins, run_validate
from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity


def validate(
    inputs: Optional[list[str]] = typer.Argument(
        None, help="deploy YAML files or directories (walked for *.yaml/*.yml); - reads stdin "
                   "(default: the bundled Qwen3-Omni preset)", show_default=False),
    platform: Optional[LAUNCH_PLATFORM] = typer.Option(
        None, "--platform", help="apply platforms.<P> first; cpu: the base stages, judged for a CPU run as launch does"),
    all_platforms: bool = typer.Option(False, "--all-platforms", help="check the base config and every platform overlay"),
    inventory: Optional[Path] = typer.Option(None, "--inventory", help="hosts (accelerator, count, memory_gib) and stage placement (YAML)"),
    model_info: Optional[Path] = typer.Option(None, "--model-info", help="the model's config.json (KV heads, MLA, hybrid, sub-configs)"),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version",
                                               help="target vLLM major.minor (default and known range: omni-pd --version)"),
    pipeline: Optional[str] = typer.Option(None, "--pipeline", help="pipeline name when the file does not say"),
    fmt: Literal["text", "json", "sarif", "concise", "github"] = typer.Option(
        "text", "--format", help="diagnostics as text, JSON, SARIF, concise (one line each: file:line:col: "
        "severity[CODE] message) or github (GitHub Actions annotations)"),
    env: Optional[list[str]] = typer.Option(None, "--env", help="launcher environment KEY=VALUE (repeatable), e.g. CUDA_VISIBLE_DEVICES=4,5"),
    serve_arg: Optional[list[str]] = typer.Option(None, "--serve-arg", help="global `vllm serve` flag KEY=VALUE the launch will pass "
                                                  "(broadcast to every stage), e.g. tensor_parallel_size=4"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="hide info diagnostics"),
    against_vllm_omni: bool = typer.Option(False, "--against-vllm-omni",
                                           help="also load the file with the real vllm-omni (its resolver and PD checks)"),
    vllm_omni_python: Optional[str] = typer.Option(None, "--vllm-omni-python",
                                                   help="python of an environment with vllm-omni and omni-pd installed"),
    model: Optional[str] = typer.Option(None, "--model", help="with --against-vllm-omni: the model vllm serve gets"),
    select: Optional[list[str]] = typer.Option(None, "--select", help=SELECT_HELP),
    ignore: Optional[list[str]] = typer.Option(None, "--ignore", help=IGNORE_HELP),
    fix: bool = typer.Option(False, "--fix", help="apply the exact replacements findings carry (a key typo, reversed "
                             "kv_roles, a misspelt name) to the files in place, then report what is left"),
    diff: bool = typer.Option(False, "--diff", help="print those replacements as a unified diff; write nothing "
                              "(exit 1 when a file would change)"),
) -> None:
    """Check deploy configs for every PD invariant; exit 0 clean, 1 errors, 2 unreadable input.

    Findings are suppressed by ``# omni-pd: ignore[CODE]`` comments, --select/--ignore and
    the [tool.omni-pd] table of pyproject.toml or .omni-pd.toml (omni-pd explain OPD009).

    Many files and directories are checked in one process; the exit status is the worst
    of all files (0 < 1 < 2 < 3).
    """
    with _no_pydantic_plugins():  # builds the deploy model's pydantic classes
        from omni_pd.check.context import Inventory, ModelInfo
        from omni_pd.check.validate import ValidateOptions

    from omni_pd import cli_options

    cli_options.vllm_version(vllm_version)
    known: dict = {}  # code -> rule name, read when a selector or a file needs it (_suppress)
    cli_layer = _cli_layer(select, ignore, known)
    if platform is not None and all_platforms:
        raise typer.BadParameter("give either --platform or --all-platforms", param_hint="--platform")
    inv = None
    if inventory is not None:
        try:
            inv = Inventory.from_dict(load_yaml_option(inventory, "--inventory"))
        except ValueError as e:
            raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=f"bad inventory: {e}",
                                         help="see `omni-pd explain OPD402` for the inventory format")) from None
    model_facts = None
    if model_info is not None:
        data = load_yaml_option(model_info, "--model-info")
        try:
            if not isinstance(data, dict):
                raise ValueError("not a mapping")
            model_facts = ModelInfo.from_config_json(data)
        except (ValueError, TypeError) as e:
            raise OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR,
                                         message=f"--model-info {model_info}: not a usable config.json ({e})",
                                         help=OPTION_FILE_HELP["--model-info"])) from None
    opts = ValidateOptions(platform=platform, all_platforms=all_platforms, inventory=inv, model=model_facts,
                           vllm_version=vllm_version, env=pairs(env, "--env"), pipeline=pipeline,
                           cli={k.replace("-", "_").lstrip("_"): v for k, v in pairs(serve_arg, "--serve-arg").items()})
    if inputs and inputs.count("-") > 1:  # omni_pd/check/inputs.py STDIN
        raise typer.BadParameter("- (stdin) can be given once", param_hint="INPUTS")
    if fix and diff:
        raise typer.BadParameter("give either --fix or --diff", param_hint="--fix")
    if (fix or diff) and (not inputs or "-" in inputs):
        raise typer.BadParameter("--fix and --diff work on files named on the command line (not stdin or the "
                                 "bundled preset)", param_hint="--fix")
    return run_validate(inputs, opts, cli_layer=cli_layer, known=known, fmt=fmt, quiet=quiet,
                        against=against_vllm_omni, python=vllm_omni_python, model=model,
                        fix="fix" if fix else "diff" if diff else None)
