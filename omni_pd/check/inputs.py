"""Which files one ``omni-pd validate`` run checks: arguments -> an ordered list of inputs.

Like yamllint and check-jsonschema: files are checked as given (any extension), a
directory is walked recursively for ``*.yaml`` / ``*.yml`` (sorted, hidden files and
directories such as ``.git`` skipped, symlinked directories not followed), and ``-``
means standard input. Pure apart from reading the directory tree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from omni_pd.diagnostics import Diagnostic, Location, Severity

#: file name suffixes a directory walk picks up
YAML_SUFFIXES = (".yaml", ".yml")
#: the argument that means standard input
STDIN = "-"


@dataclass(frozen=True)
class Inputs:
    """``paths``: what to check, in order (``"-"`` for stdin, each at most once);
    ``problems``: OPD001 errors for arguments that name nothing checkable (a directory
    without YAML files)."""

    paths: tuple[str, ...]
    problems: tuple[Diagnostic, ...] = ()


def _walk(root: Path) -> list[str]:
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            if not f.startswith(".") and f.endswith(YAML_SUFFIXES):
                out.append(os.path.join(dirpath, f))
    return out


def collect_inputs(args: list[str]) -> Inputs:
    """Expand ``args`` (files, directories, ``-``) into the files to check, keeping the
    order given and dropping repeats. A missing path is kept (loading it reports OPD001
    with the path); a directory holding no ``*.yaml``/``*.yml`` file is an OPD001 error."""
    seen: set[str] = set()
    paths: list[str] = []
    problems: list[Diagnostic] = []
    for a in args:
        found = _walk(Path(a)) if a != STDIN and Path(a).is_dir() else [a]
        if not found:
            problems.append(Diagnostic(code="OPD001", severity=Severity.ERROR, location=Location(file=a),
                                       message="directory holds no *.yaml or *.yml file",
                                       help="give deploy files or a directory that contains them"))
        for f in found:
            key = f if f == STDIN else os.path.normpath(f)
            if key not in seen:
                seen.add(key)
                paths.append(f)
    return Inputs(tuple(paths), tuple(problems))


def describe(plain: object) -> str | None:
    """What a loaded YAML document looks like when it is not a vllm-omni deploy config,
    or None when it looks like one (a mapping with a ``stages:`` list of stage settings,
    or the legacy ``stage_args:`` layout). Pure; used by ``expand`` to say why it refuses
    a file (OPD007).

    Recognised: omni-pd pipeline definitions (presets/pipelines: ``stages[]`` with
    ``role``/``execution_type``/``model_stage``, top-level ``model_arch``/``deploy_configs``),
    launch inventories (``hosts``/``placement``), Hugging Face config.json
    (``model_type``/``architectures``), JSON Schemas, omni-pd target facts
    (presets/targets), and any other mapping without ``stages:``."""
    if not isinstance(plain, dict):
        return None
    stages = plain.get("stages")
    graph_keys = {"role", "execution_type", "model_stage", "input_sources", "final_output_type"}
    if isinstance(stages, list) and any(isinstance(s, dict) and graph_keys & set(s) for s in stages) \
            or ({"model_arch", "deploy_configs"} & set(plain) and "stages" in plain):
        return ("an omni-pd pipeline definition (the stage graph, like presets/pipelines/*.yaml: "
                "stages with role/execution_type/input_sources), not deploy settings")
    if "stages" in plain or "stage_args" in plain:
        return None
    keys = set(plain)
    if "hosts" in keys or "placement" in keys:
        return "a launch inventory (hosts and placement; give it to `validate --inventory`)"
    if "model_type" in keys or "architectures" in keys:
        return "a Hugging Face config.json (give it to `validate --model-info`)"
    if "$schema" in keys and ("properties" in keys or "$defs" in keys or "type" in keys):
        return "a JSON Schema"
    if {"default_version", "kv_transfer_config_fields", "kv_connectors", "patches", "runtimes", "owned"} & keys:
        return "omni-pd target facts (presets/targets/*.yaml)"
    shown = ", ".join(sorted(map(str, keys))[:6]) + (", ..." if len(keys) > 6 else "")
    return f"a YAML mapping without `stages:` (top-level keys: {shown})"
