"""Offline checks of custom resources against their published CRD schemas.

``render --target kubernetes`` writes two kinds no core schema covers: ``LeaderWorkerSet``
(``leaderworkerset.x-k8s.io/v1``) and ``DisaggregatedSet`` (``disaggregatedset.x-k8s.io/v1``),
both from kubernetes-sigs/lws. Their schemas are the ``openAPIV3Schema`` of the CRDs that
repository publishes under ``config/crd/bases/`` at a release tag, kept in ``crds/*.json``
next to this module with the source URL, tag, commit and the SHA-256 of the CRD file they
were read from (:func:`schema_from_crd` wrote them; ``python -m omni_pd.render.crd_schema``
writes them again from a CRD file). ``DisaggregatedSet`` first ships in lws v0.9.0
(added in commit c60da2c, April 2026); v0.8.0 and earlier have no such CRD.

:func:`validate_custom` checks one object the way the API server's structural schema
would, offline:

* the schema, closed: an object schema with ``properties`` and neither
  ``additionalProperties`` nor ``x-kubernetes-preserve-unknown-fields`` takes no other key
  (the API server would prune an unknown field silently; kubernetes-validate's ``strict``
  makes it an error for core kinds, and so does this for CRDs);
* ``x-kubernetes-list-type: map`` (items unique by ``x-kubernetes-list-map-keys``) and
  ``set`` (unique items), which JSON Schema does not express;
* the CRDs' CEL rules (``x-kubernetes-validations``): each one this module knows is
  checked by a Python function (:data:`CEL_RULES`); a schema with a rule it does not
  know is refused (:class:`UnknownRule`), so a new rule in a re-read CRD cannot pass
  unchecked.

Pure apart from reading the bundled JSON (cached).
"""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterator

#: the bundled schemas: kind -> file under crds/
FILES = {"LeaderWorkerSet": "leaderworkerset.x-k8s.io_leaderworkersets.json",
         "DisaggregatedSet": "disaggregatedset.x-k8s.io_disaggregatedsets.json"}
_DIR = Path(__file__).resolve().parent / "crds"


class UnknownRule(ValueError):
    """A CEL rule in a bundled schema that :data:`CEL_RULES` has no check for."""


def _strip(schema: Any) -> Any:
    """``schema`` without ``description`` keywords (the bulk of a CRD file). A property
    *named* ``description`` (a key of ``properties``) is kept."""
    if isinstance(schema, list):
        return [_strip(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k == "description":
            continue
        if k == "properties" and isinstance(v, dict):
            out[k] = {name: _strip(sub) for name, sub in v.items()}
        else:
            out[k] = _strip(v)
    return out


def schema_from_crd(crd: dict[str, Any], *, source: str, tag: str, commit: str, sha256: str) -> dict[str, Any]:
    """The bundled form of one CRD (parsed YAML ``crd``): ``group``, ``version`` (the
    served storage version), ``kind``, the provenance fields and ``openAPIV3Schema``
    without descriptions. Raises ValueError when the CRD has no served storage version."""
    spec = crd["spec"]
    versions = [v for v in spec["versions"] if v.get("served") and v.get("storage")]
    if len(versions) != 1:
        raise ValueError(f"{crd['metadata']['name']}: expected one served storage version, found {len(versions)}")
    v = versions[0]
    return {"kind": spec["names"]["kind"], "group": spec["group"], "version": v["name"],
            "source": source, "tag": tag, "commit": commit, "sha256": sha256,
            "openAPIV3Schema": _strip(v["schema"]["openAPIV3Schema"])}


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` on every object schema that lists
    ``properties`` and says nothing about other keys (see the module docstring)."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: ({n: closed(s) for n, s in v.items()} if k == "properties" else closed(v)) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@lru_cache(maxsize=None)
def bundled(kind: str) -> dict[str, Any]:
    """The bundled record of ``kind`` (KeyError for a kind with none)."""
    return json.loads((_DIR / FILES[kind]).read_text())


def _nonzero_replicas_together(obj: Any) -> bool:
    """DisaggregatedSet v1 (lws v0.10.0) ``spec``: the roles not scaled externally have
    ``replicas`` all zero (or unset) or all above zero."""
    fixed = [r for r in obj.get("roles", []) if r.get("scaling", {}).get("mode") != "External"]
    reps = [r.get("spec", {}).get("replicas") for r in fixed]
    return all(x is None or x == 0 for x in reps) or all(x is not None and x > 0 for x in reps)


#: CEL rule text (whitespace-normalised) -> its check in Python, over the object the rule sits on
CEL_RULES: dict[str, Callable[[Any], bool]] = {
    "self.roles.filter(r, !has(r.scaling) || r.scaling.mode != 'External').all(r, !has(r.spec.replicas) "
    "|| r.spec.replicas == 0) || self.roles.filter(r, !has(r.scaling) || r.scaling.mode != 'External')"
    ".all(r, has(r.spec.replicas) && r.spec.replicas > 0)": _nonzero_replicas_together,
}


def _walk(schema: Any, value: Any, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], str]]:
    """The list-type and CEL problems of ``value`` under ``schema`` as (path, message)."""
    if not isinstance(schema, dict):
        return
    for rule in schema.get("x-kubernetes-validations", ()):
        text = " ".join(rule["rule"].split())
        check = CEL_RULES.get(text)
        if check is None:
            raise UnknownRule(text)
        if not check(value):
            yield path, rule.get("message", text)
    if isinstance(value, dict):
        for k, v in value.items():
            sub = schema.get("properties", {}).get(k)
            if sub is None and isinstance(schema.get("additionalProperties"), dict):
                sub = schema["additionalProperties"]
            yield from _walk(sub, v, path + (k,))
    elif isinstance(value, list):
        kind = schema.get("x-kubernetes-list-type")
        if kind == "map":
            keys = schema.get("x-kubernetes-list-map-keys", [])
            seen = [tuple(item.get(k) for k in keys) for item in value if isinstance(item, dict)]
            dup = sorted({s for s in seen if seen.count(s) > 1}, key=str)
            if dup:
                yield path, f"duplicate entries for key {keys}: {dup}"
        elif kind == "set":
            blobs = [json.dumps(v, sort_keys=True) for v in value]
            if len(set(blobs)) != len(blobs):
                yield path, "duplicate items in a set"
        for i, v in enumerate(value):
            yield from _walk(schema.get("items"), v, path + (i,))


@lru_cache(maxsize=None)
def _validator(kind: str) -> Any:
    import jsonschema

    return jsonschema.Draft4Validator(closed(bundled(kind)["openAPIV3Schema"]))


def validate_custom(obj: dict[str, Any]) -> list[str]:
    """Problems of ``obj`` (a LeaderWorkerSet or DisaggregatedSet) against its bundled
    CRD schema, as ``path: message``; [] when it validates. Raises KeyError for another
    kind, :class:`UnknownRule` for a CEL rule without a check."""
    rec = bundled(obj["kind"])
    problems: list[str] = []
    want = f"{rec['group']}/{rec['version']}"
    if obj.get("apiVersion") != want:
        problems.append(f"apiVersion: {obj.get('apiVersion')!r} is not {want!r} (lws {rec['tag']})")
    for err in sorted(_validator(obj["kind"]).iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        problems.append(f"{'/'.join(str(p) for p in err.absolute_path)}: {err.message}")
    for path, msg in _walk(rec["openAPIV3Schema"], obj, ()):
        problems.append(f"{'/'.join(str(p) for p in path)}: {msg}")
    return problems


def rules_in(schema: Any) -> set[str]:
    """Every CEL rule text (whitespace-normalised) in ``schema``."""
    out: set[str] = set()
    if isinstance(schema, dict):
        for rule in schema.get("x-kubernetes-validations", ()):
            out.add(" ".join(rule["rule"].split()))
        for v in schema.values():
            out |= rules_in(v)
    elif isinstance(schema, list):
        for v in schema:
            out |= rules_in(v)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m omni_pd.render.crd_schema CRD.yaml URL TAG COMMIT``: the bundled JSON
    of one CRD file on stdout (see :func:`schema_from_crd`)."""
    import sys

    from ruamel.yaml import YAML

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 4:
        sys.stderr.write("usage: python -m omni_pd.render.crd_schema CRD.yaml SOURCE_URL TAG COMMIT\n")
        return 2
    path, source, tag, commit = args
    raw = Path(path).read_bytes()
    crd = next(d for d in YAML(typ="safe").load_all(raw.decode()) if d)
    rec = schema_from_crd(crd, source=source, tag=tag, commit=commit, sha256=hashlib.sha256(raw).hexdigest())
    sys.stdout.write(json.dumps(rec, separators=(",", ":"), sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
