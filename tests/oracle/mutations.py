"""Generated one-edit mutations of deploy files, for the validate ⊇ vllm-omni differential test.

Issue 35: "a differential test in the oracle venv feeds vllm-omni 0.30's own resolver and PD
checks a few thousand generated mutations of expand's outputs and of the cases (types, ranges,
names, ids, ports, keys moved or dropped); every file vllm-omni refuses must get an error from
`validate`". Each mutation is one edit of a base file's plain tree (the edit's name says what),
enumerated over every stage and key the operators apply to, so a new key or stage in expand's
output brings its own mutations. :func:`mutations` is deterministic (a seeded sample when the
enumeration is larger than ``limit``).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from typing import Any

Tree = dict[str, Any]
Mutation = tuple[str, Tree]

def _typo(s: str) -> str:
    """A misspelling of a name: its last letter dropped (``qwen3_omni_moe_pd`` -> ``qwen3_omni_moe_p``)."""
    return s[:-1] if len(s) > 3 else s + "x"


def _retypes(v: Any) -> list[tuple[str, Any]]:
    """Values of another YAML type that a user could write for ``v``."""
    if isinstance(v, bool):
        return [("str", str(v).lower()), ("int", int(v))]
    if isinstance(v, int):
        return [("str", str(v)), ("float", v + 0.5), ("list", [v]), ("null", None)]
    if isinstance(v, float):
        return [("str", str(v)), ("null", None)]
    if isinstance(v, str):
        out: list[tuple[str, Any]] = [("int", 1), ("list", [v]), ("null", None)]
        if v.isdigit():
            out.insert(0, ("int", int(v)))
        return out
    if isinstance(v, dict):
        return [("str", "x"), ("list", [dict(v)])]
    if isinstance(v, list):
        return [("str", "x"), ("map", {"a": 1})]
    return []


#: out-of-range values per key (vLLM's and vllm-omni's own ranges are what they refuse)
RANGES: dict[str, list[Any]] = {
    "gpu_memory_utilization": [0, -0.1, 1.5],
    "tensor_parallel_size": [0, -1],
    "pipeline_parallel_size": [0],
    "data_parallel_size": [0],
    "max_num_seqs": [0, -1],
    "max_model_len": [-1],
    "max_num_batched_tokens": [-1],
    "num_replicas": [0, -1],
    "stage_id": [-1],
}

#: names vllm-omni resolves (a misspelling of each must be refused by both)
NAMES = ("pipeline", "kv_connector", "kv_role", "model_stage", "worker_type", "engine_output_type",
         "final_output_type", "scheduler_cls", "name")


def _walk(tree: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield path + (k,), v
            yield from _walk(v, path + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield path + (i,), v
            yield from _walk(v, path + (i,))


def _get(tree: Any, path: tuple) -> Any:
    for p in path:
        tree = tree[p]
    return tree


def _edit(base: Tree, path: tuple, fn: Callable[[Any, Any], None]) -> Tree:
    t = copy.deepcopy(base)
    fn(_get(t, path[:-1]), path[-1])
    return t


def _set(value: Any) -> Callable[[Any, Any], None]:
    def f(parent: Any, key: Any) -> None:
        parent[key] = copy.deepcopy(value)
    return f


def _drop(parent: Any, key: Any) -> None:
    del parent[key]


def _name(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def all_mutations(base: Tree) -> Iterator[Mutation]:
    """Every one-edit mutation of ``base`` the operators make, each named ``op:path[:detail]``.

    Operators: ``type`` (the value as another YAML type), ``range`` (:data:`RANGES`), ``name``
    (a misspelt value of :data:`NAMES`), ``drop`` (the key removed), ``hoist`` (a stage key moved
    to the top level; a ``kv_transfer_config`` key moved to its stage), ``dup-id`` (a stage takes
    another's ``stage_id``), ``edge`` (an edge to a stage that does not exist), ``port`` (a port
    value out of range or not a number)."""
    for path, v in _walk(base):
        key = path[-1]
        if isinstance(key, int):
            continue
        for kind, nv in _retypes(v):
            yield f"type:{_name(path)}:{kind}", _edit(base, path, _set(nv))
        for nv in RANGES.get(str(key), []):
            yield f"range:{_name(path)}:{nv}", _edit(base, path, _set(nv))
        if key in NAMES and isinstance(v, str):
            yield f"name:{_name(path)}:{_typo(v)}", _edit(base, path, _set(_typo(v)))
        if "port" in str(key).lower() and not isinstance(v, (dict, list)):
            for nv in (70000, "abc"):
                yield f"port:{_name(path)}:{nv}", _edit(base, path, _set(nv))
        yield f"drop:{_name(path)}", _edit(base, path, _drop)
        if len(path) == 3 and path[0] == "stages" and key != "stage_id":  # stages.i.key -> top level
            t = copy.deepcopy(base)
            val = _get(t, path)
            del _get(t, path[:-1])[key]
            t[key] = val
            yield f"hoist:{_name(path)}", t
        if len(path) == 4 and path[0] == "stages" and path[2] == "kv_transfer_config":
            t = copy.deepcopy(base)
            val = _get(t, path)
            del _get(t, path[:-1])[key]
            _get(t, path[:2])[key] = val
            yield f"hoist:{_name(path)}", t
    stages = base.get("stages") if isinstance(base.get("stages"), list) else []
    ids = [s.get("stage_id") for s in stages if isinstance(s, dict)]
    for i, s in enumerate(stages):
        for j, other in enumerate(ids):
            if j != i and isinstance(s, dict) and "stage_id" in s:
                yield f"dup-id:stages.{i}:{other}", _edit(base, ("stages", i, "stage_id"), _set(other))
                break
    edges = base.get("edges") if isinstance(base.get("edges"), list) else []
    for i, e in enumerate(edges):
        if isinstance(e, dict):
            for end in ("from", "to"):
                if end in e:
                    yield f"edge:edges.{i}.{end}:99", _edit(base, ("edges", i, end), _set(99))


def mutations(base: Tree, limit: int, seed: int = 0) -> list[Mutation]:
    """At most ``limit`` of :func:`all_mutations` of ``base``: all of them when there are no more,
    else a sample drawn with ``random.Random(seed)`` that keeps every operator present."""
    every = list(all_mutations(base))
    if len(every) <= limit:
        return every
    rng = random.Random(seed)
    by_op: dict[str, list[Mutation]] = {}
    for m in every:
        by_op.setdefault(m[0].split(":", 1)[0], []).append(m)
    picked = {rng.choice(ms)[0] for ms in by_op.values()}
    rest = [m for m in every if m[0] not in picked]
    return [m for m in every if m[0] in picked] + rng.sample(rest, limit - len(picked))
