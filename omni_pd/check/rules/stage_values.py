"""OPD114 stage-value-refused: a stage value vllm-omni's typed stage configs refuse.

vllm-omni 0.30 builds each stage into typed configs (``vllm_omni/config/omni_config.py``
``OmniStage*Config``, pydantic dataclasses over vLLM's ``CacheConfig``, ``SchedulerConfig``,
``ParallelConfig``, ...) in ``resolve_omni_config``; a value one of them refuses stops ``vllm
serve`` with a ``ValidationError`` before any engine starts. The field table
(presets/targets/vllm_omni_stage_fields.yaml) is read from those classes with pydantic
(``omni_pd/upstream/stage_fields_table.py``), so every field and range is upstream's: a new
field in the next release is in the table when it is regenerated, not when a report arrives.

Values are checked against each field's JSON Schema (:func:`accepts`, the subset of JSON Schema
the table uses) as pydantic's lax mode judges them (the deploy file reaches the dataclasses as
Python objects): an integer field takes ``"16"``, ``16.0`` and ``true``; a number field takes an
integer; a boolean field takes ``0``/``1`` and ``"yes"``/``"off"``; a string field takes only a
string (``devices: 1`` is refused: ``OmniStageRuntimeConfig.devices: str | None``).

PASS::

    stages:
      - {stage_id: 0, gpu_memory_utilization: 0.8, devices: "0"}

FAIL::

    stages:
      - {stage_id: 0, gpu_memory_utilization: 0, devices: "0"}
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule

#: the vllm-omni release the table was read from; later releases are assumed to refuse the same
TABLE_RELEASE = "0.30"
#: the first vllm-omni release whose pipeline registry the table holds (older releases registered
#: fewer pipelines: a name is judged against this list only from here on)
FIRST_TYPED = (0, 30)
_BOOL_WORDS = {"0": False, "off": False, "f": False, "false": False, "n": False, "no": False,
               "1": True, "on": True, "t": True, "true": True, "y": True, "yes": True}


@lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    """The release's table: ``{"source", "pipelines", "fields": {name: {"owner", "schema"}}}``."""
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / "vllm_omni_stage_fields.yaml")["releases"][TABLE_RELEASE]


#: the JSON Schema keywords the table uses (pydantic's json_schema of the stage configs); a schema
#: with any other keyword is refused by :func:`accepts` (tests/test_stage_values.py checks the table
#: and compares :func:`accepts` with the jsonschema library over it)
KEYWORDS = frozenset({"type", "anyOf", "enum", "minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum",
                      "items", "additionalProperties"})
_TYPES = {"null": lambda v: v is None, "boolean": lambda v: isinstance(v, bool),
          "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
          or (isinstance(v, float) and v.is_integer()),
          "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
          "string": lambda v: isinstance(v, str), "array": lambda v: isinstance(v, list),
          "object": lambda v: isinstance(v, dict)}


def _same(a: Any, b: Any) -> bool:
    """JSON Schema equality: ``1 == 1.0``, but a boolean equals only a boolean."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def accepts(schema: dict, value: Any) -> bool:
    """True when ``value`` is valid for ``schema``, a JSON Schema (draft 2020-12) over
    :data:`KEYWORDS`, as the jsonschema library judges it. A small evaluator instead of
    jsonschema itself: validate runs on every save of an editor, and importing jsonschema (with
    referencing, rpds, attrs) costs more than the check (bench/fig2_coldstart.py keeps it lazy).
    Raises ValueError for a keyword outside :data:`KEYWORDS`."""
    unknown = set(schema) - KEYWORDS
    if unknown:
        raise ValueError(f"JSON Schema keywords not evaluated here: {sorted(unknown)}")
    if "anyOf" in schema and not any(accepts(s, value) for s in schema["anyOf"]):
        return False
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            return False
    if "enum" in schema and not any(_same(value, e) for e in schema["enum"]):
        return False
    if _TYPES["number"](value):
        if "minimum" in schema and value < schema["minimum"]:
            return False
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return False
        if "maximum" in schema and value > schema["maximum"]:
            return False
        if "exclusiveMaximum" in schema and value >= schema["exclusiveMaximum"]:
            return False
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        if not all(accepts(schema["items"], v) for v in value):
            return False
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        if not all(accepts(schema["additionalProperties"], v) for v in value.values()):
            return False
    return True


def lax_candidates(value: Any) -> list[Any]:
    """``value`` and what pydantic's lax mode could read it as: a numeric string as a number, a
    bool as 0/1, 0/1 and the words of :data:`_BOOL_WORDS` as a bool (pydantic's conversion table)."""
    out = [value]
    if isinstance(value, bool):
        out.append(int(value))
    elif isinstance(value, (int, float)) and value in (0, 1):
        out.append(bool(value))
    elif isinstance(value, str):
        s = value.strip()
        for cast in (int, float):
            try:
                out.append(cast(s))
                break
            except ValueError:
                pass
        if s.lower() in _BOOL_WORDS:
            out.append(_BOOL_WORDS[s.lower()])
    return out


def refusal(name: str, value: Any, kind: str = "fields") -> str | None:
    """Why vllm-omni's typed field ``name`` refuses ``value`` (what the field accepts), or None when
    one of :func:`lax_candidates` is valid or ``name`` is not a typed field. ``kind``: ``fields``
    (the stage configs) or ``kv_transfer_config_fields`` (vLLM's KVTransferConfig)."""
    if name not in table()[kind]:
        return None
    schema = table()[kind][name]["schema"]
    if any(accepts(schema, cand) for cand in lax_candidates(value)):
        return None
    return "the field accepts " + _accepts(table()[kind][name]["schema"])


def _accepts(schema: dict) -> str:
    if "anyOf" in schema:
        return " or ".join(_accepts(s) for s in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(map(str, schema["enum"]))
    t = schema.get("type", "any value")
    words = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true/false",
             "null": "null", "object": "a mapping", "array": "a list"}.get(t, str(t))
    rng = []
    for key, sym in (("exclusiveMinimum", ">"), ("minimum", ">="), ("exclusiveMaximum", "<"), ("maximum", "<=")):
        if key in schema:
            rng.append(f"{sym} {schema[key]}")
    return words + (" " + ", ".join(rng) if rng else "")


def _yaml(value: Any) -> str:
    """``value`` as the YAML flow text a user writes (``null``, ``true``, ``'x'``, ``[1, 2]``)."""
    import json

    if isinstance(value, str):
        return repr(value)
    try:
        return json.dumps(value, ensure_ascii=False).replace('"', "'")
    except (TypeError, ValueError):
        return repr(value)


# Values a dedicated rule judges on every stage of the topology, with a message and fix of its own:
# OPD114 does not report them a second time (OPD302 pd-kv-role: kv_role outside the three roles).
_DEDICATED = {("kv_transfer_config_fields", "kv_role")}


def _entries(ctx: Context) -> Iterable[tuple[tuple, str, Any, str]]:
    """``(path, key, value, table)`` of every key of every stage entry and of its ``engine_args``
    (table ``fields``), and of their ``kv_transfer_config`` (table ``kv_transfer_config_fields``)."""
    from omni_pd.check.rules.schema import stage_entries

    for base, st in stage_entries(ctx):
        inner = st.get("engine_args")
        for where, mapping in ((base, st), (base + ("engine_args",), inner if isinstance(inner, dict) else {})):
            for k, v in mapping.items():
                if isinstance(k, str):
                    yield where + (k,), k, v, "fields"
            kv = mapping.get("kv_transfer_config")
            for k, v in (kv.items() if isinstance(kv, dict) else ()):
                if isinstance(k, str):
                    yield where + ("kv_transfer_config", k), k, v, "kv_transfer_config_fields"


@rule("OPD114", "stage-value-refused", Severity.ERROR,
      "a stage value that vllm-omni's typed stage configs refuse (type or range, read from vllm-omni)",
      fail="stages:\n  - stage_id: 0\n    gpu_memory_utilization: 0\n    devices: \"0\"\n",
      passing="stages:\n  - stage_id: 0\n    gpu_memory_utilization: 0.8\n    devices: \"0\"\n",
      examples=(
          Example("an integer where a string belongs (devices)",
                  "stages:\n  - stage_id: 0\n    devices: 1\n", fires=True,
                  contains="OmniStageRuntimeConfig.devices"),
          Example("max_num_seqs 0 (SchedulerConfig: >= 1)",
                  "stages:\n  - stage_id: 0\n    max_num_seqs: 0\n", fires=True,
                  contains="OmniStageSchedulerConfig.max_num_seqs"),
          Example("kv_ip: null (vLLM's KVTransferConfig.kv_ip is a string)", "stages:\n  - stage_id: 0\n    "
                  "kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_producer, kv_ip: null}\n",
                  fires=True, contains="KVTransferConfig.kv_ip"),
      ))
def stage_value_refused(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Every stage key (and ``engine_args`` key) that is a field of vllm-omni's typed stage
    configs, and every ``kv_transfer_config`` key (vLLM's ``KVTransferConfig``), must hold a value
    that field accepts (``kv_ip: null`` is refused: ``kv_ip: str``): its type and vLLM's range (``gpu_memory_utilization``
    in (0, 1], ``max_num_seqs`` >= 1, ``tensor_parallel_size`` >= 1, ``devices`` a string, ...).
    vllm-omni refuses the file at load (``ValidationError`` in ``resolve_omni_config``), so nothing
    starts (vllm-omni 0.30+ at load; before 0.30, vLLM's own config classes refuse the same value when
    the engine starts). The table is read from vllm-omni 0.30.0 and vLLM 0.30 and assumed for the
    other releases until they are read (the note says so); a wrong type of a key omni-pd's own model
    types is OPD101's.
    Source: vllm-omni 0.30.0 ``vllm_omni/config/omni_config.py`` (``OmniStage*Config``), read with
    pydantic's ``TypeAdapter(cls).json_schema()`` into presets/targets/vllm_omni_stage_fields.yaml."""
    if not ctx.platform_first:  # every stage entry, platform overlays included, is read on the first pass
        return
    owned = {d.location.path for d in ctx.parse_diagnostics if d.location is not None}
    for path, key, value, kind in _entries(ctx):
        fields = table()[kind]
        if path in owned or key not in fields or (kind, key) in _DEDICATED and ctx.topology is not None:
            continue
        why = refusal(key, value, kind)
        if why is None:
            continue
        owner = fields[key]["owner"]
        fix = None
        if isinstance(value, int) and not isinstance(value, bool) and _accepts(fields[key]["schema"]).startswith("a string"):
            fix = (str(value), f'"{value}"')
        yield r.diag(f"`{key}: {_yaml(value)}` is refused by vllm-omni ({owner}.{key}): {why}",
                     ctx.loc(path, value=True),
                     notes=[f"`vllm serve --omni` stops at load with a ValidationError (resolve_omni_config); "
                            f"{ctx.release_words()}, table read from vllm-omni {TABLE_RELEASE}.0"],
                     help=f"write {_accepts(fields[key]['schema'])} for `{key}`"
                          + (f", e.g. {fix[1]}" if fix else ""),
                     replace=fix, reads=(path,))
