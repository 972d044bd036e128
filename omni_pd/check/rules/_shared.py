"""What several rule modules share, written once (issue 38: hybrid_state, context_parallel,
speculative and pipeline_parallel each carried a copy). The versioned fact tables
(``presets/targets/*.yaml``): each file read once (:func:`load`), a release as
``(major, minor)`` (:func:`release`), and a connector's row for a release: its name's rows
with ``same_as`` followed (:func:`follow_same_as`), then the last row whose ``since`` the
release has reached (:func:`row_for`). And the plain-vLLM PD pair the rules' examples
start from (:func:`pair_yaml`). No rules here: the registry skips modules whose name
starts with ``_``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping


@lru_cache(maxsize=None)
def load(name: str) -> dict[str, Any]:
    """``presets/targets/<name>`` as a dict, read once per file (the same object every
    call: callers must not change it). Raises OSError/ValueError for a missing or broken
    bundled file."""
    from omni_pd.resources import data_dir, load_data

    return dict(load_data(data_dir("presets") / "targets" / name))


def release(s: Any) -> tuple[int, int]:
    """``"0.30"`` (or anything whose ``str`` is a vLLM version) -> ``(0, 30)``:
    :func:`omni_pd.compile.targets.parse_version`. Raises ValueError."""
    from omni_pd.compile.targets import parse_version

    return parse_version(str(s))


def follow_same_as(rows_by_name: Mapping[str, Any], name: str) -> Any:
    """``rows_by_name[name]`` with ``{same_as: other}`` entries followed (at most three
    hops); None for a name the table does not have."""
    rows = rows_by_name.get(name)
    for _ in range(3):
        if isinstance(rows, dict) and rows.get("same_as"):
            rows = rows_by_name.get(rows["same_as"])
    return rows


def row_for(rows: Any, version: tuple[int, int]) -> dict[str, Any] | None:
    """The last of ``rows`` (a list of mappings, each with a ``since`` release, oldest
    first) whose ``since`` is at or before ``version``; None when ``rows`` is not a list
    or ``version`` predates every row."""
    out = None
    for row in rows if isinstance(rows, list) else []:
        if version >= release(row["since"]):
            out = row
    return out


#: a plain-vLLM PD pair for rule examples: stage 0 ``kv_producer``, stage 1 ``kv_consumer``
#: over connector ``{c}``; ``{p}``/``{d}`` add keys to prefill/decode (``", key: value"``)
PAIR_YAML = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
             "  - {{stage_id: 0, devices: \"0\"{p}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_producer, engine_id: p0}}}}\n"
             "  - {{stage_id: 1, devices: \"1\"{d}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_consumer, engine_id: d0}}}}\n")


def pair_yaml(c: str, p: str = "", d: str = "") -> str:  # pragma: no mutate block (runs at import only)
    """:data:`PAIR_YAML` with connector ``c`` and prefill/decode extras ``p``/``d``."""
    return PAIR_YAML.format(c=c, p=p, d=d)
