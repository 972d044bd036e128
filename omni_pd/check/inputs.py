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

from typing import TYPE_CHECKING

from omni_pd.diagnostics import Diagnostic, Location, Severity

if TYPE_CHECKING:
    from omni_pd.io import Document

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


#: stage keys only an omni-pd pipeline definition (presets/pipelines) has; a deploy
#: stage may set ``final_output``/``final_output_type`` (vllm-omni 0.30's shipped
#: hunyuan_image_3_moe.yaml does), so those do not count
_GRAPH_KEYS = frozenset({"role", "execution_type", "model_stage", "input_sources"})


def describe(plain: object) -> str | None:
    """What a loaded YAML document looks like when it is not a vllm-omni deploy config,
    or None when it looks like one: a mapping with a non-empty ``stages:`` list of stage
    settings, a child that names a ``base_config`` (its stages come from the base, as in
    vllm-omni 0.30's shipped bagel_think.yaml), or the legacy ``stage_args:`` layout.
    Pure; the OPD007 gate of both ``expand`` and ``validate`` (:func:`not_a_deploy_config`).

    Recognised: omni-pd pipeline definitions (presets/pipelines: ``stages[]`` with
    ``role``/``execution_type``/``model_stage``/``input_sources``, top-level
    ``model_arch``/``deploy_configs``), an empty ``stages:`` list, launch inventories
    (``hosts``/``placement``), Hugging Face config.json (``model_type``/``architectures``),
    JSON Schemas, omni-pd target facts (presets/targets), vllm-omni's forced-aligner
    stage settings (``forced_aligner:``, given with ``--forced-aligner-config``), and any
    other mapping without ``stages:`` (a CI workflow, a Kubernetes manifest)."""
    if not isinstance(plain, dict):
        return None
    stages = plain.get("stages")
    if isinstance(stages, list) and any(isinstance(s, dict) and _GRAPH_KEYS & set(s) for s in stages) \
            or ({"model_arch", "deploy_configs"} & set(plain) and "stages" in plain):
        return ("an omni-pd pipeline definition (the stage graph, like presets/pipelines/*.yaml: "
                "stages with role/execution_type/input_sources), not deploy settings")
    if "stage_args" in plain or plain.get("base_config"):
        return None
    if "stages" in plain:
        if isinstance(stages, list) and not stages:
            return "an empty deploy config (`stages: []` sets no stage, so there is nothing to run)"
        return None  # a stages: value of the wrong type is the schema's (OPD101)
    keys = set(plain)
    if "hosts" in keys or "placement" in keys:
        return "a launch inventory (hosts and placement; give it to `validate --inventory`)"
    if "model_type" in keys or "architectures" in keys:
        return "a Hugging Face config.json (give it to `validate --model-info`)"
    if "$schema" in keys and ("properties" in keys or "$defs" in keys or "type" in keys):
        return "a JSON Schema"
    if {"default_version", "kv_transfer_config_fields", "kv_connectors", "patches", "runtimes", "owned"} & keys:
        return "omni-pd target facts (presets/targets/*.yaml)"
    if keys == {"forced_aligner"}:
        return ("vllm-omni's forced-aligner stage settings (qwen3_tts_forced_aligner.yaml, given with "
                "`--forced-aligner-config`; appended to a TTS pipeline, not a deploy config of its own)")
    shown = ", ".join(sorted(map(str, keys))[:6]) + (", ..." if len(keys) > 6 else "")
    return f"a YAML mapping without `stages:` (top-level keys: {shown})"


#: the help OPD007 carries in ``validate`` (``expand`` adds that it wrote nothing)
NOT_A_DEPLOY_CONFIG_HELP = ("omni-pd checks vllm-omni deploy configs (a `stages:` list of per-stage engine "
                            "settings, like presets/qwen3_omni_moe.yaml)")


def not_a_deploy_config(doc: "Document", plain: object = None) -> Diagnostic | None:
    """The OPD007 gate shared by ``expand`` and ``validate``: an error located at the top
    of ``doc`` (line 1) saying what the file looks like (:func:`describe`), or None for a
    deploy config. vllm-omni's forced-aligner settings (shipped in ``vllm_omni/deploy/``
    with the deploy configs) get a warning instead; expand refuses both. Pure (reads
    ``doc.tree`` only; ``plain``: ``to_plain(doc.tree)`` when the caller has it already,
    not modified)."""
    from omni_pd.compile.parse import to_plain

    if plain is None:
        plain = to_plain(doc.tree)
    looks_like = describe(plain)
    if looks_like is None:
        return None
    if isinstance(plain, dict) and set(plain) == {"forced_aligner"}:
        # shipped in vllm_omni/deploy/ beside the deploy configs: a walk of that folder
        # must not fail on it, and expand still refuses it (it promotes any OPD007)
        return Diagnostic(code="OPD007", severity=Severity.WARNING, location=doc.loc(()),
                          message=f"not a deploy config: this looks like {looks_like}",
                          help="vllm-omni reads it with `--forced-aligner-config`; omni-pd checks nothing in it")
    return Diagnostic(code="OPD007", severity=Severity.ERROR, location=doc.loc(()),
                      message=f"not a deploy config: this looks like {looks_like}",
                      help=NOT_A_DEPLOY_CONFIG_HELP)
