"""The deploy model's compiled projection at run time: validate a plain YAML tree against
``model_spec.json`` (generated from the pydantic classes of :mod:`omni_pd.compile.model`
by :mod:`omni_pd.compile.model_spec`) with pydantic v2's lax-mode semantics, without
importing pydantic (a cold ``omni-pd validate`` then costs about half as much, issue 38).

Standard library only. ``model("DeployConfig").model_validate(tree)`` returns an object
with the pydantic model's attribute access (every field, defaults for unset ones, extra
keys as attributes), ``model_fields`` / ``model_fields_set`` / ``model_extra`` and
``model_dump(by_alias=..., exclude_unset=...)``; or raises :class:`ValidationError` whose
``errors()`` is pydantic's list (dicts with ``type``, ``loc``, ``msg``, ``input``, in
pydantic's order). The input domain is what :func:`omni_pd.compile.parse.to_plain` yields
(dict/list/str/int/float/bool/None, plus YAML timestamps); tests/test_model_lite.py checks
against pydantic itself that both give the same errors, dumps and attribute values.

Coercions (pydantic 2.14 lax mode): int from bool, from an integral finite float and from
a decimal string (whitespace, sign, ``_`` between digits, a ``.0`` tail); float from
bool/int and a numeric string (``inf``, ``nan``); bool from 0/1, 0.0/1.0 and the words
``true/false, yes/no, on/off, t/f, y/n, 1/0`` in any case; str only from str. A ``strict``
field takes only its own type (no bool for int).
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

_SPEC_PATH = Path(__file__).with_name("model_spec.json")
_FAIL = object()  # a value that did not validate (its errors are in the error list)
_INT_TEXT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*")
_FLOAT_TEXT = re.compile(r"[+-]?(?:(?:[0-9]+(?:_[0-9]+)*)?\.?[0-9]+(?:_[0-9]+)*(?:[eE][+-]?[0-9]+(?:_[0-9]+)*)?"
                         r"|[0-9]+(?:_[0-9]+)*\.(?:[eE][+-]?[0-9]+(?:_[0-9]+)*)?"
                         r"|inf|infinity|nan)", re.IGNORECASE)
_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
#: what pydantic-core strips around a number (Rust ``str::trim``: Unicode White_Space)
_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B))) + "\u2028\u2029\u202f\u205f\u3000"
_I64 = 2 ** 63


class ValidationError(ValueError):
    """The projection's refusal: :meth:`errors` as pydantic's ``ValidationError.errors()``."""

    def __init__(self, title: str, errors: list[dict[str, Any]]) -> None:
        super().__init__(f"{len(errors)} validation error(s) for {title}")
        self._errors = errors

    def errors(self) -> list[dict[str, Any]]:
        """``[{"type": str, "loc": tuple, "msg": str, "input": Any}, ...]``."""
        return list(self._errors)


class LiteModel:
    """Base of the projected model classes: fields in ``__dict__``, extras in ``model_extra``."""

    _spec: dict[str, Any] = {}
    model_fields: dict[str, dict[str, Any]] = {}

    def __init__(self, values: dict[str, Any], fields_set: set[str], extra: dict[str, Any]) -> None:
        self.__dict__.update(values)
        self.__dict__["model_fields_set"] = fields_set
        self.__dict__["model_extra"] = extra

    def __getattr__(self, name: str) -> Any:  # only reached for names not in __dict__: the extras
        extra = self.__dict__.get("model_extra") or {}
        if name in extra:
            return extra[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self._items())})"

    def _items(self) -> list[tuple[str, Any]]:
        return [(f, self.__dict__[f]) for f in self.model_fields] + list(self.model_extra.items())

    def model_dump(self, *, by_alias: bool = False, exclude_unset: bool = False) -> dict[str, Any]:
        """The pydantic dump: fields in definition order (only the ones the input set, with
        ``exclude_unset``; keyed by alias with ``by_alias``), then the extra keys in input order;
        nested models dumped alike, mappings and lists copied."""
        out: dict[str, Any] = {}
        for name, f in self.model_fields.items():
            if exclude_unset and name not in self.model_fields_set:
                continue
            out[(f["alias"] or name) if by_alias else name] = _dump(self.__dict__[name], by_alias, exclude_unset)
        for k, v in self.model_extra.items():
            out[k] = _dump(v, by_alias, exclude_unset)
        return out

    @classmethod
    def model_validate(cls, data: Any) -> "LiteModel":
        """Validate ``data`` (a plain tree); raises :class:`ValidationError`."""
        errors: list[dict[str, Any]] = []
        out = _model(cls.__name__, data, (), errors)
        if errors:
            raise ValidationError(cls.__name__, errors)
        return out


def _dump(v: Any, by_alias: bool, exclude_unset: bool) -> Any:
    if isinstance(v, LiteModel):
        return v.model_dump(by_alias=by_alias, exclude_unset=exclude_unset)
    if isinstance(v, dict):
        return {k: _dump(x, by_alias, exclude_unset) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_dump(x, by_alias, exclude_unset) for x in v]
    return v


@lru_cache(maxsize=None)
def spec() -> dict[str, Any]:
    """The committed spec (``model_spec.json``; shape: :mod:`omni_pd.compile.model_spec`)."""
    return json.loads(_SPEC_PATH.read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def model(name: str) -> type[LiteModel]:
    """The projected class of model ``name`` (``"DeployConfig"``, ``"StageDeploy"``, ...);
    KeyError for a name the spec does not have."""
    m = spec()["models"][name]
    return type(name, (LiteModel,), {"_spec": m, "model_fields": {f["name"]: f for f in m["fields"]},
                                     "__module__": __name__})


def _err(errors: list, type_: str, loc: tuple, msg: str, value: Any) -> object:
    errors.append({"type": type_, "loc": loc, "msg": msg, "input": value})
    return _FAIL


def _model(name: str, data: Any, loc: tuple, errors: list) -> Any:
    cls = model(name)
    m = cls._spec
    if not isinstance(data, dict):
        return _err(errors, "model_type", loc, f"Input should be a valid dictionary or instance of {name}", data)
    values: dict[str, Any] = {}
    fields_set: set[str] = set()
    used: set = set()
    bad = False
    for f in m["fields"]:
        fname, alias = f["name"], f["alias"]
        key = alias or fname
        if key not in data and alias and m["populate_by_name"] and fname in data:
            key = fname
        if key in data:
            used.add(key)
            v = data[key]
            n = len(errors)
            for check in f["before"]:
                from omni_pd.compile.model_checks import CHECKS, FieldCheckError

                try:
                    v = CHECKS[check](v)
                except FieldCheckError as e:
                    v = _err(errors, e.type, loc + (key,), e.message, v)
                    break
            if v is not _FAIL:
                v = _value(f["type"], v, loc + (key,), errors)
            if len(errors) > n:
                bad = True
                continue
            values[fname] = v
            fields_set.add(fname)
        elif f["required"]:
            _err(errors, "missing", loc + (alias or fname,), "Field required", data)
            bad = True
        else:
            values[fname] = [] if f["default_factory"] == "list" else f["default"]
    extra: dict[str, Any] = {}
    if m["extra"] == "allow":
        for k, v in data.items():
            if k not in used:
                if not isinstance(k, str):
                    _err(errors, "invalid_key", loc + (k,), "Keys should be strings", k)
                    bad = True
                else:
                    extra[k] = v
                    fields_set.add(k)  # pydantic counts an extra key as set
    if bad:
        return _FAIL
    return cls(values, fields_set, extra)


def _value(t: dict[str, Any], v: Any, loc: tuple, errors: list) -> Any:
    kind = t["kind"]
    if kind == "optional":
        return None if v is None else _value(t["of"], v, loc, errors)
    if kind == "any":
        return v
    if kind == "model":
        return _model(t["name"], v, loc, errors)
    if kind == "list":
        if not isinstance(v, list):
            return _err(errors, "list_type", loc, "Input should be a valid list", v)
        out = [_value(t["of"], x, loc + (i,), errors) for i, x in enumerate(v)]
        return _FAIL if any(x is _FAIL for x in out) else out
    if kind == "dict":
        if not isinstance(v, dict):
            return _err(errors, "dict_type", loc, "Input should be a valid dictionary", v)
        d: dict[Any, Any] = {}
        ok = True
        for k, x in v.items():
            k2 = _value(t["key"], k, loc + (k, "[key]"), errors)
            x2 = _value(t["of"], x, loc + (k,), errors)
            if k2 is _FAIL or x2 is _FAIL:
                ok = False
            else:
                d[k2] = x2
        return d if ok else _FAIL
    if kind == "union":
        tried: list = []
        for sub, tag in zip(t["of"], t["tags"]):
            errs: list = []
            out = _value(sub, v, loc + (tag,), errs)
            if not errs:
                return out
            tried += errs
        errors += tried
        return _FAIL
    if kind == "literal":
        vals = t["values"]
        if v in vals and type(v) is str:
            return v
        shown = [repr(x) for x in vals]
        expected = " or ".join(shown) if len(shown) <= 2 else ", ".join(shown[:-1]) + " or " + shown[-1]
        return _err(errors, "literal_error", loc, f"Input should be {expected}", v)
    if isinstance(v, bytes) and not t["strict"]:  # a YAML !!binary: lax mode reads it as UTF-8 text
        out = _from_bytes(t, v, loc, errors)
    else:
        out = _SCALAR[kind](t, v, loc, errors)
    if out is _FAIL:
        return out
    if t.get("ge") is not None and not out >= t["ge"]:
        return _err(errors, "greater_than_equal", loc, f"Input should be greater than or equal to {t['ge']}", v)
    if t.get("gt") is not None and not out > t["gt"]:
        return _err(errors, "greater_than", loc, f"Input should be greater than {t['gt']}", v)
    return out


def _from_bytes(t: dict, v: bytes, loc: tuple, errors: list) -> Any:
    try:
        text = v.decode("utf-8")
    except UnicodeDecodeError:
        if t["kind"] == "str":
            return _err(errors, "string_unicode", loc,
                        "Input should be a valid string, unable to parse raw data as a unicode string", v)
        text = "\ufffd"  # parses as no number or boolean: the kind's own parsing error
    errs: list = []
    out = _SCALAR[t["kind"]](t, text, loc, errs)
    for e in errs:
        e["input"] = v
    errors += errs
    return out


def _int(t: dict, v: Any, loc: tuple, errors: list) -> Any:
    if type(v) is int or (isinstance(v, int) and not isinstance(v, bool)):
        return int(v)
    if t["strict"]:
        return _err(errors, "int_type", loc, "Input should be a valid integer", v)
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return _err(errors, "finite_number", loc, "Input should be a finite number", v)
        if v != int(v):
            return _err(errors, "int_from_float", loc,
                        "Input should be a valid integer, got a number with a fractional part", v)
        if not -_I64 < v < _I64:
            return _err(errors, "int_parsing_size", loc,
                        "Unable to parse input string as an integer, exceeded maximum size", v)
        return int(v)
    if isinstance(v, str):
        s = v.strip(_WS)
        head, dot, tail = s.partition(".")
        if dot and tail and not tail.strip("0"):
            s = head
        if _INT_TEXT.fullmatch(s):
            return int(s)
        return _err(errors, "int_parsing", loc, "Input should be a valid integer, unable to parse string as an integer", v)
    return _err(errors, "int_type", loc, "Input should be a valid integer", v)


def _float(t: dict, v: Any, loc: tuple, errors: list) -> Any:
    if isinstance(v, float):
        return v
    if isinstance(v, int) and (not isinstance(v, bool) or not t["strict"]):
        return float(v)
    if isinstance(v, str) and not t["strict"]:
        s = v.strip(_WS)
        if _FLOAT_TEXT.fullmatch(s):
            return float(s)
        return _err(errors, "float_parsing", loc, "Input should be a valid number, unable to parse string as a number", v)
    return _err(errors, "float_type", loc, "Input should be a valid number", v)


def _bool(t: dict, v: Any, loc: tuple, errors: list) -> Any:
    if isinstance(v, bool):
        return v
    if t["strict"]:
        return _err(errors, "bool_type", loc, "Input should be a valid boolean", v)
    if isinstance(v, float) and not (math.isfinite(v) and v == int(v) and -_I64 < v < _I64):
        return _err(errors, "bool_type", loc, "Input should be a valid boolean", v)
    if isinstance(v, (int, float)):
        if v == 0 or v == 1:
            return bool(v)
        if not -_I64 <= v < _I64:  # beyond i64: pydantic-core does not read it as a number
            return _err(errors, "bool_type", loc, "Input should be a valid boolean", v)
        return _err(errors, "bool_parsing", loc, "Input should be a valid boolean, unable to interpret input", v)
    if isinstance(v, str):
        low = v.lower()
        if low in _TRUE or low in _FALSE:
            return low in _TRUE
        return _err(errors, "bool_parsing", loc, "Input should be a valid boolean, unable to interpret input", v)
    return _err(errors, "bool_type", loc, "Input should be a valid boolean", v)


def _str(t: dict, v: Any, loc: tuple, errors: list) -> Any:
    if isinstance(v, str):
        return str(v)
    return _err(errors, "string_type", loc, "Input should be a valid string", v)


_SCALAR = {"int": _int, "float": _float, "bool": _bool, "str": _str}


@lru_cache(maxsize=None)
def top_level_keys() -> frozenset[str]:
    """:data:`omni_pd.compile.model.TOP_LEVEL_KEYS` from the spec: the DeployConfig fields
    plus ``base_config``."""
    return frozenset(model("DeployConfig").model_fields) | {"base_config"}
