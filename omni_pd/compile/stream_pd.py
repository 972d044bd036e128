"""Streaming under PD (``async_chunk: true``): when a vllm-omni PD pipeline can keep it (issue 34).

The facts, from vllm-omni 0.30.0's code (the seam and why in omni_pd/upstream/stream_pd.py):

* vllm-omni 0.30 refuses to start any stage with a ``kv_transfer_config`` while
  ``async_chunk`` is on (``config/omni_config.py`` ``_validate_async_chunk_support``, a check
  written for AR-to-DiT KV transfer); omni-pd's compatibility layer accepts a prefill/decode
  pair on the releases its table lists (``presets/targets/vllm_omni_compat.yaml``: the
  ``stream_*`` patches and ``stream_pipelines``), and hands decode's first Talker chunk
  prefill's prompt rows.
* A stage edge from prefill to decode makes decode a chunk *receiver*
  (``distributed/omni_connectors/utils/initialization.py`` auto-configures a
  SharedMemoryConnector on every ``edges:`` entry; ``engine/stage_init_utils.py``
  ``get_stage_connector_spec`` gives the receiving end ``role: receiver``), which the
  orchestrator pre-submits with a placeholder prompt at request start
  (``engine/orchestrator.py`` ``_prewarm_async_chunk_stages``) and never routes prefill's
  output to. Without that edge decode is a *sender* (its outgoing edge's connector with
  ``role: sender``): submitted by the orchestrator after prefill, streaming to the Talker.
  ``omni-pd expand`` therefore writes no prefill -> decode entry in ``edges:`` when it
  keeps streaming; the KV connector carries that hop.

So streaming PD holds when (:func:`gap` is None): the target's vllm-omni release is covered,
the pipeline is listed, the layer and its streaming patches are on in the launcher
environment (``OMNI_PD_VLLM_OMNI_COMPAT``, ``OMNI_PD_VLLM_OMNI_STREAM_PD``), and the file has
no stage edge into decode (:func:`edge_into_decode`). Shared by ``expand``
(omni_pd/compile/passes/pd_split.py, OPD901) and ``validate`` (OPD310). Pure: the table is
read as data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from omni_pd.compile.pipelines import Pipeline
    from omni_pd.compile.targets import Target

#: the environment switches of omni_pd/upstream/vllm_omni_compat.py (the layer, its streaming patches)
SWITCHES = ("OMNI_PD_VLLM_OMNI_COMPAT", "OMNI_PD_VLLM_OMNI_STREAM_PD")
#: the compat table's rows that together make a PD pair stream
STREAM_PATCHES = ("stream_async_chunk_ok", "stream_decode_request", "stream_chunk0")
#: the one-piece route, for users who want it or a release that cannot stream
NO_STREAM = "`omni-pd expand --no-stream` (or `async_chunk: false` in the input) for the one-piece answer"


def covered_pipelines(series: str) -> tuple[str, ...]:
    """PD pipelines that stream on vllm-omni ``series`` (``"0.30"``): the table's
    ``stream_pipelines`` when the series lists every streaming patch, else ()."""
    from omni_pd.compile.talker_pd import compat_table

    v = (compat_table().get("versions") or {}).get(series) or {}
    return tuple(v.get("stream_pipelines") or ()) if set(STREAM_PATCHES) <= set(v.get("patches") or ()) else ()


def switched_off(env: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(variable, value) of the first :data:`SWITCHES` entry set to 0/false/off/no in ``env``."""
    from omni_pd.compile.talker_pd import switched_off as first_off

    return first_off(env, SWITCHES)


@dataclass(frozen=True)
class Gap:
    """Why ``pipeline`` cannot stream under PD: ``where`` is ``release``, ``pipeline`` or
    ``launcher`` (an environment switch, ``var``); ``why`` and ``help`` are message text."""

    where: str
    why: str
    help: str
    var: str | None = None


def gap(pipeline: "Pipeline", target: "Target", launcher_env: Mapping[str, Any] | None = None) -> Gap | None:
    """None when ``pipeline`` (a ``*_pd`` vllm-omni pipeline) streams at ``target`` with
    ``launcher_env`` (the API process's environment, where the orchestrator patches run),
    else the :class:`Gap`."""
    from omni_pd.compile.talker_pd import omni_release
    from omni_pd.compile.versions import runtime_release

    release = omni_release(target)
    if release is None or not covered_pipelines(release):
        return Gap("release", f"{runtime_release('vllm-omni', target)} refuses async_chunk with a kv_transfer_config "
                              "and omni-pd's compatibility layer does not make it stream there",
                   f"target a release it covers (`--vllm-version 0.30`), or {NO_STREAM}")
    if pipeline.name not in covered_pipelines(release):
        return Gap("pipeline", f"omni-pd's compatibility layer streams {', '.join(covered_pipelines(release))} "
                               f"under PD, not {pipeline.name}", NO_STREAM)
    off = switched_off(launcher_env)
    if off:
        return Gap("launcher", f"{off[0]}={off[1]} turns omni-pd's streaming patches off: vllm-omni then refuses "
                               "async_chunk with a kv_transfer_config", f"unset {off[0]}, or {NO_STREAM}", var=off[0])
    return None


def streams(pipeline: "Pipeline") -> bool:
    """True when ``pipeline`` has a stage after its decode stage (a Talker that reads chunks):
    streaming is a question only there (``llm_pd``, ``*_thinker_only_pd`` are served as plain
    ``vllm serve`` engines, which never read ``async_chunk``)."""
    d = next((s for s in pipeline.stages if s.pd_role == "decode"), None)
    return d is not None and pipeline.launcher == "vllm-omni" and any(
        d.stage_id in s.input_sources for s in pipeline.stages)


def edge_into_decode(edges: Any, prefill: int, decode: int) -> bool:
    """Whether a deploy file's ``edges:`` list (plain data) holds the ``prefill -> decode``
    entry that makes decode a chunk receiver under ``async_chunk``."""
    return isinstance(edges, list) and any(
        isinstance(e, Mapping) and str(e.get("from")) == str(prefill) and str(e.get("to")) == str(decode)
        for e in edges)
