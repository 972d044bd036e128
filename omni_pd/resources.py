"""Where the bundled data lives (presets, pipeline catalogue, target facts, schema).

In a wheel they are under ``omni_pd/_data/``; in a source checkout (editable install)
they are the repository's top-level ``presets/`` and ``schemas/`` folders.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

_PKG = Path(__file__).resolve().parent


@lru_cache(maxsize=None)
def data_dir(name: str) -> Path:
    """Absolute path of the bundled folder ``name`` (``presets`` or ``schemas``)."""
    for cand in (_PKG / "_data" / name, _PKG.parent / name):
        if cand.is_dir():
            return cand
    raise FileNotFoundError(f"omni-pd data folder {name!r} is missing from the installation")


def load_data(path: Path) -> Any:
    """A bundled YAML data file (pipeline catalogue, target facts), parsed.

    Pure-Python YAML parsing of the bundled files costs tens of milliseconds at every
    CLI start (bench/RESULTS.md, figure 2), JSON a fraction of one. So, the way Python
    caches bytecode, the parsed value is cached as ``__pycache__/<file>.json`` next to
    the file, keyed on the file's size and mtime; written atomically, only when
    bytecode writing is allowed (``sys.dont_write_bytecode``, PYTHONDONTWRITEBYTECODE),
    and skipped when the folder is read-only or the data would not survive JSON
    unchanged. The YAML file stays the only source.
    """
    import json
    import os
    import sys

    st = path.stat()
    key = [st.st_size, st.st_mtime_ns]
    cache = path.parent / "__pycache__" / (path.name + ".json")
    try:
        with open(cache, encoding="utf-8") as f:
            cached = json.load(f)
        if cached["source"] == key:
            return cached["data"]
    except (OSError, ValueError, TypeError, KeyError):
        pass
    from ruamel.yaml import YAML

    # pure: the YAML 1.2 loader the files are written for; with ruamel.yaml.clib installed
    # typ="safe" alone picks libyaml (YAML 1.1), which refuses "module:Class" in a flow
    # mapping (presets/targets/vllm_ascend.yaml) and reads yes/no/on/off as booleans
    data = YAML(typ="safe", pure=True).load(path.read_text(encoding="utf-8"))
    if not sys.dont_write_bytecode:
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        try:
            text = json.dumps({"source": key, "data": data})
            if json.loads(text)["data"] == data:  # e.g. integer keys would come back as strings
                cache.parent.mkdir(exist_ok=True)
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, cache)
        except (OSError, TypeError, ValueError):
            pass
        finally:
            try:
                tmp.unlink()
            except OSError:
                pass
    return data


def preset_path(name: str) -> Path:
    """A bundled deploy preset, e.g. ``preset_path("qwen3_omni_moe")``."""
    return data_dir("presets") / f"{name}.yaml"


#: File name of the published JSON Schema (generated from omni_pd.compile.model).
SCHEMA_FILENAME = "omni-pd-deploy.schema.json"


def schema_path() -> Path:
    """The bundled JSON Schema of a deploy config (``schemas/omni-pd-deploy.schema.json``)."""
    return data_dir("schemas") / SCHEMA_FILENAME
