"""omni_pd/io.py subclasses ruamel.yaml's round-trip scanner, composer and constructor
and overrides internal methods; pyproject.toml pins the ruamel.yaml range those were
tested with (issue 16). This file fails when the installed ruamel.yaml is outside that
range or no longer has the internals the subclasses rely on.

Tested range (tests/test_fuzz.py hostile inputs + tests/test_expand.py goldens, with
``pip install --no-deps --target DIR ruamel.yaml==V`` and ``PYTHONPATH=DIR``): 0.18.0,
0.18.6, 0.18.17, 0.19.1. ``validate``'s libyaml path (io.py ``_EventLoader``, ruamel.yaml.clib
0.2.15 under ruamel.yaml's composer and constructor): tests/test_io_fast.py on 0.18.0,
0.18.17 and 0.19.1. Widen the pin only after running them on the new release.
"""

from __future__ import annotations

import inspect
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def _pin() -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    return next(Requirement(d) for d in deps if d.startswith("ruamel.yaml"))


def test_the_pin_has_an_upper_bound_and_the_installed_release_is_inside() -> None:
    req = _pin()
    assert {s.operator for s in req.specifier} == {">=", "<"}, str(req)
    assert req.specifier.contains(version("ruamel.yaml")), (version("ruamel.yaml"), str(req))


def _params(cls: type, name: str) -> list[str]:
    return list(inspect.signature(getattr(cls, name)).parameters)


def test_the_internals_io_overrides_are_there() -> None:
    from ruamel.yaml.composer import Composer
    from ruamel.yaml.constructor import RoundTripConstructor
    from ruamel.yaml.scanner import RoundTripScanner

    assert _params(RoundTripScanner, "fetch_flow_collection_start") == ["self", "TokenClass", "to_push"]
    assert _params(RoundTripScanner, "add_indent") == ["self", "column"]
    assert _params(Composer, "compose_node") == ["self", "parent", "index"]
    assert _params(RoundTripConstructor, "construct_object") == ["self", "node", "deep"]
    assert _params(RoundTripConstructor, "check_mapping_key") == ["self", "node", "key_node", "mapping", "key", "value"]
    assert _params(RoundTripConstructor, "check_set_key") == ["self", "node", "key_node", "setting", "key"]


def test_the_scanner_state_io_reads_is_there() -> None:
    """``indents``, ``flow_context`` (scanner), ``reader.get_mark``, ``parser.peek_event``
    and ``constructed_objects`` are read by the subclasses."""
    from omni_pd.io import _yaml

    y = _yaml()
    y.load("a: {b: [1, 2]}\n")
    assert isinstance(y.scanner.indents, list) and isinstance(y.scanner.flow_context, list)
    assert callable(y.reader.get_mark) and callable(y.parser.peek_event)
    assert isinstance(y.constructor.constructed_objects, dict)


def test_the_internals_the_libyaml_path_relies_on_are_there() -> None:
    """io.py's ``_EventLoader`` gives ruamel.yaml's composer and constructor their parser
    and resolver as plain attributes (the base classes look them up through properties),
    and the resolver asks ``loader._scanner.yaml_version`` which YAML version to resolve
    scalars with (1.2 when none is declared, as the round-trip scanner says)."""
    from omni_pd import io

    classes = io._fast_classes()
    if classes is None:
        pytest.skip("ruamel.yaml.clib is not installed")
    loader = io._EventLoader("a: [1, {b: yes}]\n", classes, node_limit=True)
    assert loader._resolver.processing_version == (1, 2)
    assert loader._composer.parser is loader._parser and loader._constructor.composer is loader._composer
    assert loader.load() == {"a": [1, {"b": "yes"}]}
