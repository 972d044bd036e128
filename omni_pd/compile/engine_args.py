"""vLLM's engine arguments per release, each classified for a prefill/decode pair (issue 35).

Two data files under presets/targets: ``engine_args_fields.yaml`` (generated from the
released wheels by ``python -m omni_pd.upstream.engine_args_table``: each release's
``EngineArgs`` fields, annotation and default) and ``engine_args.yaml`` (judged: groups of
arguments with one class, ``must_agree`` / ``agree_if`` / ``may_differ`` / ``per_side``, a
reason or condition, a source and, where one exists, the dedicated rule's code). OPD317
(omni_pd/check/rules/engine_args.py) reads them through :func:`arg_rows`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

CLASSES = ("must_agree", "agree_if", "may_differ", "per_side")

#: the ``default`` of a field whose default is not a literal (engine_args_table.NOT_LITERAL)
NOT_LITERAL = "<not a literal>"


@dataclass(frozen=True)
class ArgRow:
    """One engine argument of one release with its classification.

    ``cls``: one of :data:`CLASSES`; ``group``: the table group's name; ``rule``: the
    dedicated rule's code (None: OPD317 reads it); ``why``: the group's reason or
    condition; ``source``: the upstream code it was read from; ``when``: the testable
    condition of an ``agree_if`` row (``{"hybrid": True}`` / ``{"connectors": [...]}``, {}
    when none); ``type``/``default``: the field's annotation text and literal default
    (:data:`NOT_LITERAL` when it has none) in that release's ``EngineArgs``."""

    name: str
    cls: str
    group: str
    rule: str | None
    why: str
    source: str
    when: dict[str, Any] = field(default_factory=dict)
    type: str = ""
    default: Any = NOT_LITERAL


@lru_cache(maxsize=1)
def fields_data() -> dict[str, Any]:
    """presets/targets/engine_args_fields.yaml, parsed: ``{"releases": {"0.30": {"source",
    "sha256", "fields": {name: {"type", "default", "default_expr"}}}}}``."""
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / "engine_args_fields.yaml")


@lru_cache(maxsize=1)
def table_data() -> dict[str, Any]:
    """presets/targets/engine_args.yaml, parsed: ``{"sources": {...}, "groups": [...]}``."""
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / "engine_args.yaml")


def releases() -> list[str]:
    """vLLM ``major.minor`` releases whose ``EngineArgs`` were read, oldest first."""
    return sorted(fields_data()["releases"], key=lambda r: tuple(int(x) for x in str(r).split(".")))


def release_fields(release: str) -> dict[str, dict[str, Any]]:
    """``{field: {"type", "default", "default_expr"}}`` of ``EngineArgs`` in ``release``
    (``"0.30"``). Raises KeyError for a release the table was not generated for."""
    return fields_data()["releases"][release]["fields"]


def release_source(release: str) -> str:
    """Where ``release``'s field list was read from (wheel file name and module)."""
    return str(fields_data()["releases"][release]["source"])


@lru_cache(maxsize=1)
def classification() -> dict[str, dict[str, Any]]:
    """Argument name -> its group (a mapping of engine_args.yaml ``groups``).

    Raises ValueError when an argument is in two groups or a group's class is unknown."""
    out: dict[str, dict[str, Any]] = {}
    for g in table_data()["groups"]:
        if g["class"] not in CLASSES:
            raise ValueError(f"engine_args.yaml group {g['name']}: unknown class {g['class']!r}")
        for a in g["args"]:
            if a in out:
                raise ValueError(f"engine_args.yaml: {a} is in groups {out[a]['name']} and {g['name']}")
            out[a] = g
    return out


def unclassified(release: str) -> list[str]:
    """The ``EngineArgs`` fields of ``release`` no group of engine_args.yaml names
    (empty when the table is complete for it)."""
    cls = classification()
    return [f for f in release_fields(release) if f not in cls]


@lru_cache(maxsize=None)
def arg_rows(release: str) -> dict[str, ArgRow]:
    """Every ``EngineArgs`` field of ``release`` as an :class:`ArgRow`, in declaration
    order. Raises KeyError for an unknown release or a field the table does not classify
    (tests/test_engine_args_table.py keeps that from shipping)."""
    cls = classification()
    out: dict[str, ArgRow] = {}
    for name, f in release_fields(release).items():
        g = cls[name]
        out[name] = ArgRow(name=name, cls=g["class"], group=g["name"], rule=g.get("rule"),
                           why=str(g.get("reason") or g.get("condition") or ""), source=str(g["source"]),
                           when=dict(g.get("when") or {}), type=str(f.get("type", "")),
                           default=f.get("default", NOT_LITERAL))
    return out


def class_counts(release: str) -> dict[str, int]:
    """How many of ``release``'s arguments are in each class (all of :data:`CLASSES`)."""
    counts = dict.fromkeys(CLASSES, 0)
    for r in arg_rows(release).values():
        counts[r.cls] += 1
    return counts


def table_release(version: str) -> str | None:
    """The table release to read for a target ``major.minor`` (``"0.30"``): that release
    when it was read, else None (OPD317 then says it has no table for the target)."""
    return version if version in fields_data()["releases"] else None
