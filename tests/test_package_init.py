"""omni_pd is a regular package with a version (issue 24, "also left": it had no
``__init__.py``, so it was a namespace package by accident and ``omni_pd.__file__`` was None).
"""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import omni_pd

ROOT = Path(__file__).resolve().parents[1]
PROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_omni_pd_is_a_regular_package_with_the_pyproject_version() -> None:
    assert omni_pd.__file__ == str(ROOT / "omni_pd" / "__init__.py")
    assert omni_pd.__version__ == PROJECT_VERSION == "0.1.0"
    assert omni_pd.__all__ == ["__version__"]


def test_other_names_are_attribute_errors() -> None:
    try:
        omni_pd.no_such_name  # noqa: B018
    except AttributeError as e:
        assert str(e) == "module 'omni_pd' has no attribute 'no_such_name'"
    else:
        raise AssertionError("omni_pd.no_such_name did not raise")


def test_a_never_installed_tree_falls_back_to_pyproject_then_unknown(monkeypatch, tmp_path) -> None:
    import importlib.metadata

    def not_installed(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert omni_pd._find_version() == PROJECT_VERSION
    monkeypatch.setattr(omni_pd, "_pyproject_version", lambda: None)
    assert omni_pd._find_version() == "unknown"


def test_the_pyproject_reader_answers_none_for_what_it_cannot_read(tmp_path) -> None:
    (tmp_path / "ok.toml").write_text('[project]\nname = "x"\nversion = "2.3.4"\n')
    (tmp_path / "bad.toml").write_text("[project\nversion = 1\n")
    (tmp_path / "noversion.toml").write_text('[project]\nname = "x"\n')
    (tmp_path / "notstr.toml").write_text("[project]\nversion = 3\n")
    (tmp_path / "flat.toml").write_text('project = "x"\n')
    got = {p: omni_pd._pyproject_version(tmp_path / p)
           for p in ("ok.toml", "bad.toml", "noversion.toml", "notstr.toml", "flat.toml", "missing.toml")}
    assert got == {"ok.toml": "2.3.4", "bad.toml": None, "noversion.toml": None, "notstr.toml": None,
                   "flat.toml": None, "missing.toml": None}


def test_omni_pd_version_prints_the_package_version(monkeypatch, capsys) -> None:
    from omni_pd.cli import main

    monkeypatch.setattr(omni_pd, "_cached", ["9.8.7"])
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "omni-pd 9.8.7"
