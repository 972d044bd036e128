"""omni-pd: compiles vllm-omni deploy configs into prefill/decode (PD) disaggregated
topologies (``expand``), checks them (``validate``) and launches them (``launch``).

The package root holds nothing but the version: every ``omni_pd.*`` import passes through
here, including the plugin vLLM and vllm-omni load in each of their processes
(``omni_pd.upstream.vllm_plugin``), so ``__version__`` is computed on first access
(PEP 562 module ``__getattr__``), not at import.

``__version__`` (str): the installed ``omni-pd`` distribution's version
(``importlib.metadata``); in a source tree that was never installed, the ``version`` of
the ``[project]`` table of the ``pyproject.toml`` beside this folder; ``"unknown"`` when
neither can be read. ``omni-pd --version`` prints it (``omni_pd.compile.versions``).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["__version__"]

_DIST = "omni-pd"
_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
_cached: list[str] = []


def _pyproject_version(path: Path = _PYPROJECT) -> str | None:
    """``[project] version`` of the pyproject file at ``path``, or None when the file is
    missing, unreadable, not TOML, or has no such string."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: tomli (a dependency there, pyproject.toml)
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            return None
    try:
        v = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {}).get("version")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return v if isinstance(v, str) and v else None


def _find_version() -> str:
    """The version :data:`__version__` reports: see the module docstring."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(_DIST)
    except PackageNotFoundError:
        return _pyproject_version() or "unknown"


def __getattr__(name: str) -> str:
    """``__version__``, computed once on first access; AttributeError for any other name."""
    if name == "__version__":
        if not _cached:
            _cached.append(_find_version())
        return _cached[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
