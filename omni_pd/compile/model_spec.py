"""Compile the pydantic deploy model (:mod:`omni_pd.compile.model`) into a data file the
validate path reads without importing pydantic (:mod:`omni_pd.compile.model_lite`).

The pydantic classes stay the single source of truth; ``model_spec.json`` is their
projection, and tests/test_model_lite.py fails when regenerating it differs from the
committed file. Regenerate with ``python -m omni_pd.compile.model_spec -o
omni_pd/compile/model_spec.json``.

Spec shape: ``{"root": "DeployConfig", "models": {name: {"extra": "allow", "fields":
[field, ...]}}}`` with fields in the class's definition order (pydantic validates and dumps
in that order), each ``{"name", "alias" (null: the name), "type", "required", "default",
"default_factory" ("list" or null), "before" (names of
:data:`omni_pd.compile.model_checks.CHECKS` run first)}``. A type is one of
``{"kind": "int"|"float"|"bool"|"str", "strict": bool, "ge": n|null, "gt": n|null}``,
``{"kind": "any"}``, ``{"kind": "literal", "values": [...]}``, ``{"kind": "optional",
"of": T}``, ``{"kind": "list", "of": T}``, ``{"kind": "dict", "key": T, "of": T}``,
``{"kind": "model", "name": str}``, ``{"kind": "union", "of": [T, ...], "tags": [str, ...]}``
(smart-mode union; tags: the names pydantic adds to an error's loc). Raises TypeError for an
annotation outside that vocabulary, so a new kind of field cannot be projected silently.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

#: the committed spec, next to this module
SPEC_PATH = Path(__file__).with_name("model_spec.json")

_SCALARS = {int: "int", float: "float", bool: "bool", str: "str"}


def _type(ann: Any, metadata: list, models: dict[str, Any]) -> dict[str, Any]:
    """The spec type of annotation ``ann`` (with ``metadata``: Strict, Ge, Gt); nested model
    classes are added to ``models``."""
    from annotated_types import Ge, Gt
    from pydantic import BaseModel, Strict

    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(ann)
        return _type(base, list(metadata) + list(meta), models)
    if ann in _SCALARS:
        out: dict[str, Any] = {"kind": _SCALARS[ann], "strict": False, "ge": None, "gt": None}
        for m in metadata:
            if isinstance(m, Strict):
                out["strict"] = bool(m.strict)
            elif isinstance(m, Ge):
                out["ge"] = m.ge
            elif isinstance(m, Gt):
                out["gt"] = m.gt
            else:
                raise TypeError(f"unsupported constraint {m!r}")
        return out
    if metadata and origin not in (typing.Union, types.UnionType):
        raise TypeError(f"constraints {metadata!r} on {ann!r}")
    if ann is Any:
        return {"kind": "any"}
    if origin is typing.Literal:
        return {"kind": "literal", "values": list(typing.get_args(ann))}
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        if metadata and len(args) != 1:
            raise TypeError(f"constraints {metadata!r} on {ann!r}")
        inner = [_type(a, metadata, models) for a in args]  # Field(None, ge=1) bounds the int of int | None
        t = inner[0] if len(inner) == 1 else {"kind": "union", "of": inner, "tags": [_tag(a) for a in args]}
        return {"kind": "optional", "of": t} if len(args) < len(typing.get_args(ann)) else t
    if origin is list:
        return {"kind": "list", "of": _type(typing.get_args(ann)[0], [], models)}
    if origin is dict:
        k, v = typing.get_args(ann)
        return {"kind": "dict", "key": _type(k, [], models), "of": _type(v, [], models)}
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        _model(ann, models)
        return {"kind": "model", "name": ann.__name__}
    raise TypeError(f"unsupported annotation {ann!r}")


def _tag(ann: Any) -> str:
    return ann.__name__


def _model(cls: Any, models: dict[str, Any]) -> None:
    name = cls.__name__
    if name in models:
        return
    models[name] = None  # placeholder against recursion
    before: dict[str, list[str]] = {}
    for dec in cls.__pydantic_decorators__.field_validators.values():
        if dec.info.mode != "before" or not hasattr(dec.func, "check_name"):
            raise TypeError(f"{name}: validator {dec.cls_var_name} is not a shared before-check")
        for f in dec.info.fields:
            before.setdefault(f, []).append(dec.func.check_name)
    if cls.__pydantic_decorators__.model_validators or cls.__pydantic_decorators__.field_serializers:
        raise TypeError(f"{name}: model validators/serializers are not projected")
    fields = []
    for fname, f in cls.model_fields.items():
        factory = None
        if f.default_factory is not None:
            if f.default_factory is not list:
                raise TypeError(f"{name}.{fname}: default_factory {f.default_factory!r}")
            factory = "list"
        fields.append({
            "name": fname, "alias": f.alias, "type": _type(f.annotation, list(f.metadata), models),
            "required": f.is_required(), "default": None if f.is_required() or factory else f.default,
            "default_factory": factory, "before": before.get(fname, []),
        })
    cfg = cls.model_config
    models[name] = {"extra": cfg.get("extra") or "ignore", "populate_by_name": bool(cfg.get("populate_by_name")),
                    "fields": fields}


def generate() -> dict[str, Any]:
    """The spec of :class:`omni_pd.compile.model.DeployConfig` and every model it nests."""
    from omni_pd.compile.model import DeployConfig

    models: dict[str, Any] = {}
    _model(DeployConfig, models)
    return {"root": "DeployConfig", "models": models}


def render(spec: dict[str, Any]) -> str:
    """The committed text of ``spec``: sorted-free JSON (field order matters), one indent."""
    return json.dumps(spec, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m omni_pd.compile.model_spec [-o FILE]``: print or write the spec."""
    ap = argparse.ArgumentParser(prog="python -m omni_pd.compile.model_spec")
    ap.add_argument("-o", "--output", type=Path, help="file to write (default: print)")
    args = ap.parse_args(argv)
    text = render(generate())
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
