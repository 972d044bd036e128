"""Parse a loaded :class:`~omni_pd.io.Document` into the typed :class:`DeployConfig`.

Pydantic validation errors become located diagnostics (OPD101, exit 2) that name the
expected type; a legacy ``stage_args`` file is recognised (OPD102) instead of being
reported as a pile of type errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity
from omni_pd.io import Document

if TYPE_CHECKING:  # pydantic is imported by parse_config only: validate reads to_plain/_TYPE_WORDS here
    from omni_pd.compile.model import DeployConfig


def to_plain(node: Any) -> Any:
    """ruamel round-trip nodes -> plain dict/list/str/int/float/bool/None."""
    if isinstance(node, dict):
        return {to_plain(k) if not isinstance(k, (str, int)) else (str(k) if isinstance(k, str) else k): to_plain(v)
                for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [to_plain(v) for v in node]
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, str):
        return str(node)
    if isinstance(node, int):
        if type(node).__name__ == "ScalarBoolean":
            return bool(node)
        return int(node)
    if isinstance(node, float):
        return float(node)
    return node


_TYPE_WORDS = {
    "int_parsing": "an integer", "int_type": "an integer", "int_from_float": "an integer",
    "float_parsing": "a number", "float_type": "a number",
    "bool_parsing": "true or false", "bool_type": "true or false",
    "string_type": "a string", "dict_type": "a mapping", "list_type": "a list",
    "model_type": "a mapping", "model_attributes_type": "a mapping",
    "greater_than_equal": "a positive integer",  # the model's only lower bound is ge=1 (parallel sizes)
    "missing": None, "literal_error": None,
}


def _tree_path(doc: Document, loc: tuple) -> tuple:
    """Keep the prefix of a pydantic error location that exists in the document."""
    node = doc.tree
    out: list[Any] = []
    for part in loc:
        key = "from" if part == "from_" else part
        if isinstance(node, dict) and key in node:
            out.append(key)
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            out.append(key)
            node = node[key]
        else:
            continue
    return tuple(out)


def _json_object(value: object) -> bool:
    """True for a string that is a JSON object (``'{"kv_role": "kv_producer"}'``): a
    mapping written as the string vLLM's ``--kv-transfer-config`` flag takes."""
    import json

    if not isinstance(value, str) or not value.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(value), dict)
    except ValueError:
        return False


def type_help(want: str, key: object, got: object) -> str:
    """OPD101's help for ``key`` that must be ``want`` (``a mapping``) but is ``got``: a
    mapping written as a JSON string is told to drop the quotes."""
    if want == "a mapping" and _json_object(got):
        return f"this is JSON text in a quoted string: remove the quotes around it, and `{key}: {{...}}` is a YAML mapping"
    return f"write {want} for `{key}`"


def parse_config(doc: Document) -> DeployConfig:
    """Validate ``doc`` against the deploy schema.

    Raises :class:`OmniPdError` (exit 2): OPD102 for a legacy ``stage_args`` file
    (vllm-omni 0.30.0 ``load_deploy_config`` rejects it), OPD101 for a wrong type,
    located at the offending key, with the expected type.
    """
    from pydantic import ValidationError

    from omni_pd.compile.model import DeployConfig

    if "stage_args" in doc.tree and "stages" not in doc.tree:
        raise OmniPdError(Diagnostic(
            code="OPD102", severity=Severity.ERROR,
            message="legacy `stage_args` file: vllm-omni 0.30 only reads the `stages:` deploy schema",
            location=doc.loc(("stage_args",)),
            help=f"rewrite it with `omni-pd migrate {doc.name} -o new.yaml` (one note per key it moves; "
                 "docs/migrate.md has the key map), then use new.yaml",
        ))
    try:
        return DeployConfig.model_validate(to_plain(doc.tree))
    except ValidationError as e:
        err = e.errors()[0]
        path = _tree_path(doc, tuple(err.get("loc", ())))
        want = _TYPE_WORDS.get(err.get("type", ""), None)
        key = path[-1] if path else ""
        got = err.get("input")
        if err.get("type") == "missing":
            msg = f"missing required key `{err['loc'][-1]}`"
            help_ = f"add `{err['loc'][-1]}:` here"
        elif want:
            msg = f"`{key}` must be {want}, found {_show(got)}"
            help_ = type_help(want, key, got)
        else:
            msg = f"invalid value for `{key}`: {err.get('msg')}"
            help_ = None
        raise OmniPdError(Diagnostic(code="OPD101", severity=Severity.ERROR, message=msg,
                                     location=doc.loc(path, value=True), help=help_)) from None


def _show(v: Any) -> str:
    if isinstance(v, str):
        return repr(v) if len(v) < 40 else repr(v[:37] + "...")
    if isinstance(v, dict):
        return "a mapping"
    if isinstance(v, list):
        return "a list"
    return repr(v)
