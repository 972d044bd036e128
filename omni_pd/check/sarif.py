"""SARIF 2.1.0 rendering of diagnostics (for code-scanning UIs).

One run, tool ``omni-pd`` with every registered rule as a ``reportingDescriptor``;
one ``result`` per diagnostic with its physical location (1-based line/column) and
related locations. Severity maps to SARIF ``level``: error -> error, warning ->
warning, info -> note. Spec: https://docs.oasis-open.org/sarif/sarif/v2.1.0/sarif-v2.1.0.html
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from omni_pd.diagnostics import Diagnostic, Location

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def _uri(file: str) -> str:
    if file.startswith("<"):
        return file.strip("<>").replace(" ", "-")
    p = Path(file)
    try:
        return p.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return p.resolve().as_uri() if p.is_absolute() or p.exists() else p.as_posix()


def _physical(loc: Location) -> dict[str, Any]:
    phys: dict[str, Any] = {"artifactLocation": {"uri": _uri(loc.file)}}
    if loc.line is not None:
        region: dict[str, Any] = {"startLine": loc.line}
        if loc.column is not None:
            region["startColumn"] = loc.column
        phys["region"] = region
    return phys


def to_sarif(diags: Iterable[Diagnostic], version: str | None = None) -> dict[str, Any]:
    """The SARIF log object (a dict) for ``diags``."""
    return _log(diags, version)


def _log(diags: Iterable[Diagnostic], version: str | None) -> dict[str, Any]:
    from omni_pd.check.codes import explainable
    from omni_pd.check.explain import explain_text, plain_literals

    descriptors = []
    index: dict[str, int] = {}
    for code, r in explainable().items():  # every code omni-pd emits: each result has a ruleIndex
        index[code] = len(descriptors)
        descriptors.append({
            "id": code, "name": r.name,
            "shortDescription": {"text": r.summary},
            "fullDescription": {"text": plain_literals(" ".join(r.doc.split()))},
            "defaultConfiguration": {"level": _LEVEL[r.severity.value]},
            "help": {"text": explain_text(r)},
        })
    results = []
    for d in diags:
        res: dict[str, Any] = {"ruleId": d.code, "level": _LEVEL[d.severity.value],
                               "message": {"text": d.message + (f"\nhelp: {d.help}" if d.help else "")}}
        if d.code in index:
            res["ruleIndex"] = index[d.code]
        if d.location is not None:
            loc: dict[str, Any] = {"physicalLocation": _physical(d.location)}
            if d.location.path:
                loc["logicalLocations"] = [{"fullyQualifiedName": d.location.dotted(), "kind": "member"}]
            res["locations"] = [loc]
        if d.related:
            res["relatedLocations"] = [
                {"id": i, "physicalLocation": _physical(r), **({"message": {"text": r.label}} if r.label else {})}
                for i, r in enumerate(d.related)]
        results.append(res)
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "omni-pd", "informationUri": "https://github.com/vllm-project/vllm-omni",
                                "version": version or _pkg_version(), "rules": descriptors}},
            "results": results,
            "columnKind": "unicodeCodePoints",
        }],
    }


def _pkg_version() -> str:
    try:
        from importlib.metadata import version

        return version("omni-pd")
    except Exception:
        return "0"


def render_sarif(diags: Iterable[Diagnostic]) -> str:
    """SARIF 2.1.0 JSON text."""
    return json.dumps(_log(diags, None), indent=2)
