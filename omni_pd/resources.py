"""Where the bundled data lives (presets, pipeline catalogue, target facts, schema).

In a wheel they are under ``omni_pd/_data/``; in a source checkout (editable install)
they are the repository's top-level ``presets/`` and ``schemas/`` folders.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    """Absolute path of the bundled folder ``name`` (``presets`` or ``schemas``)."""
    for cand in (_PKG / "_data" / name, _PKG.parent / name):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"omni-pd data folder {name!r} is missing from the installation")


def preset_path(name: str) -> Path:
    """A bundled deploy preset, e.g. ``preset_path("qwen3_omni_moe")``."""
    return data_dir("presets") / f"{name}.yaml"


def schema_path() -> Path:
    from .model import SCHEMA_FILENAME

    return data_dir("schemas") / SCHEMA_FILENAME
