"""Read vllm-ascend's PD facts out of its released sources, without importing them.

vllm-ascend does not import on a CPU machine (it needs ``torch_npu``), so the facts
omni-pd relies on are read from the files of a downloaded distribution (a wheel, or the
sdist for releases published as source only, such as 0.23.0.post1) by text patterns,
each with the ``file:line`` it was read at. ``presets/targets/vllm_ascend.yaml`` keeps
the result; ``tests/test_ascend_facts.py`` re-runs :func:`extract` on the downloaded
archives and compares (a drift test).

Pure functions over ``{relative path: text}``; the archive reading is at the edge
(:func:`read_archive`).
"""

from __future__ import annotations

import re
import tarfile
import zipfile
from pathlib import Path
from typing import Any

#: where the Mooncake connectors live, per layout (0.13: flat; 0.18+: kv_transfer/kv_p2p)
_PULL = ("vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py",
         "vllm_ascend/distributed/mooncake_connector.py")
_PUSH = ("vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_layerwise_connector.py",
         "vllm_ascend/distributed/mooncake_layerwise_connector.py")
_REGISTER = ("vllm_ascend/distributed/kv_transfer/__init__.py", "vllm_ascend/distributed/__init__.py")
_PROXY = "examples/disaggregated_prefill_v1/load_balance_proxy_layerwise_server_example.py"
_GUIDE = "docs/source/tutorials/features/pd_disaggregation_mooncake_multi_node.md"
_POLICY = "docs/source/community/versioning_policy.md"


def read_archive(path: Path) -> dict[str, str]:
    """``{path inside the package root: text}`` for the ``.py``/``.md`` files of a
    vllm-ascend wheel (``*.whl``) or sdist (``*.tar.gz``; the ``name-version/`` prefix
    is removed). Raises OSError / zipfile.BadZipFile / tarfile.TarError on a bad file."""
    out: dict[str, str] = {}
    keep = (".py", ".md")
    if path.name.endswith(".whl"):
        with zipfile.ZipFile(path) as z:
            for n in z.namelist():
                if n.endswith(keep):
                    out[n] = z.read(n).decode("utf-8", "replace")
    else:
        with tarfile.open(path) as t:
            for m in t.getmembers():
                if m.isfile() and m.name.endswith(keep):
                    rel = m.name.split("/", 1)[1] if "/" in m.name else m.name
                    f = t.extractfile(m)
                    if f is not None:
                        out[rel] = f.read().decode("utf-8", "replace")
    return out


def _first(files: dict[str, str], candidates: tuple[str, ...]) -> str | None:
    return next((c for c in candidates if c in files), None)


def _find(files: dict[str, str], path: str | None, pattern: str, flags: int = 0) -> tuple[re.Match, str] | None:
    """First match of ``pattern`` in ``path`` and its ``path:line`` source, or None."""
    if path is None or path not in files:
        return None
    text = files[path]
    m = re.search(pattern, text, flags)
    if m is None:
        return None
    return m, f"{path}:{text.count(chr(10), 0, m.start()) + 1}"


def _expr(raw: str) -> str:
    return " ".join(raw.replace("(", " ").replace(")", " ").split())


def _side_channel(files: dict[str, str], path: str | None, after: str) -> dict[str, Any] | None:
    """The ``self.side_channel_port = (...)`` expression that follows ``after`` in ``path``."""
    if path is None or path not in files:
        return None
    text = files[path]
    start = text.find(after)
    if start < 0:
        return None
    at = text.find("self.side_channel_port = (", start)
    if at < 0:
        return None
    i, depth = at, 0
    for i in range(text.index("(", at), len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            break
    body = text[text.index("(", at) + 1:i]
    return {"value": _expr(body), "source": f"{path}:{text.count(chr(10), 0, at) + 1}"}


def _fact(found: tuple[re.Match, str] | None, value: Any = True) -> dict[str, Any] | None:
    if found is None:
        return None
    return {"value": value(found[0]) if callable(value) else value, "source": found[1]}


def _peer_blocks(files: dict[str, str], path: str | None) -> dict[str, Any] | None:
    """Keys the worker asserts in ``kv_connector_extra_config.prefill`` / ``.decode``
    (required) and reads with a default (optional), or None when it reads no peer block."""
    if path is None or path not in files:
        return None
    text = files[path]
    m = re.search(r'get_from_extra_config\(\s*"prefill"', text)
    if m is None:
        return None
    out: dict[str, Any] = {"source": f"{path}:{text.count(chr(10), 0, m.start()) + 1}"}
    for side in ("prefill", "decode"):
        req = sorted(set(re.findall(rf'assert "(\w+)" in {side}_parallel_config', text)))
        opt = sorted(set(re.findall(rf'{side}_parallel_config\.get\("(\w+)", 1\)', text)))
        out[side] = {"required": req, "optional_default_1": opt}
    return out


def extract(files: dict[str, str]) -> dict[str, Any]:
    """Every fact omni-pd encodes about vllm-ascend's Mooncake PD, read from ``files``.

    Returns ``{fact: {"value": ..., "source": "path:line"} | None}`` (None: not found in
    this release, e.g. the example proxy and docs, which only the sdist ships). Facts:
    ``connectors`` (registered name -> ``module:Class``), ``pull_peer_blocks`` /
    ``push_peer_blocks`` (required/optional keys), ``pull_decode_pp_must_be_1``,
    ``pull_prefill_tp_ge_decode_tp`` / ``push_prefill_tp_ge_decode_tp``,
    ``pull_side_channel_port`` / ``push_side_channel_port`` (the expression),
    ``pull_unique_engine_id``, ``push_metaserver_fields`` (the keys decode posts to the
    metaserver), ``proxy_metaserver_route``, ``proxy_decode_kv_transfer_params``,
    ``proxy_prefill_overrides``, ``transport_port_range`` (the guide's sentence),
    ``vllm_base`` (this table row: vllm-ascend version -> vLLM version).
    """
    pull, push, reg = _first(files, _PULL), _first(files, _PUSH), _first(files, _REGISTER)
    out: dict[str, Any] = {}

    if reg is not None:
        text = files[reg]
        names = {}
        first_line = None
        for m in re.finditer(r'register_connector\(\s*"(\w+)",\s*"([\w.]+)",\s*"(\w+)"', text):
            names[m.group(1)] = f"{m.group(2)}:{m.group(3)}"
            first_line = first_line or text.count("\n", 0, m.start()) + 1
        out["connectors"] = {"value": dict(sorted(names.items())), "source": f"{reg}:{first_line}"} if names else None
    else:
        out["connectors"] = None

    out["pull_peer_blocks"] = _peer_blocks(files, pull)
    out["push_peer_blocks"] = _peer_blocks(files, push)
    out["pull_decode_pp_must_be_1"] = _fact(_find(files, pull, r"assert self\._decode_pp_size == 1"))
    out["pull_prefill_tp_ge_decode_tp"] = _fact(_find(files, pull, r"if self\._prefill_tp_size < self\._decode_tp_size:"))
    out["push_prefill_tp_ge_decode_tp"] = _fact(_find(files, push, r"if self\._prefill_tp_size < self\._decode_tp_size:"))
    out["pull_side_channel_port"] = _side_channel(files, pull, "class MooncakeConnectorWorker")
    out["push_side_channel_port"] = _side_channel(files, push, "class MooncakeLayerwiseConnectorWorker")
    out["pull_unique_engine_id"] = _fact(_find(files, pull, r"Conflict engine id"))

    found = _find(files, push, r'Send request: %s to proxy metaserver.*?kv_transfer_params = dict\((.*?)\n\s*\)', re.S)
    out["push_metaserver_fields"] = _fact(found, lambda m: re.findall(r"^\s*(\w+)=", m.group(1), re.M))

    proxy = _PROXY if _PROXY in files else None
    out["proxy_metaserver_route"] = _fact(_find(files, proxy, r'@app\.post\("(/v1/metaserver)"\)'), lambda m: m.group(1))
    found = _find(files, proxy, r'req_data\["kv_transfer_params"\] = \{(.*?)\}', re.S)
    out["proxy_decode_kv_transfer_params"] = _fact(found, lambda m: re.findall(r'"(\w+)":', m.group(1)))
    found = _find(files, proxy, r'def send_request_to_service\(.*?(req_data\["stream"\] = False.*?)headers =', re.S)
    out["proxy_prefill_overrides"] = _fact(found, lambda m: [" ".join(ln.split()) for ln in m.group(1).splitlines()
                                                             if ln.strip()])

    guide = _GUIDE if _GUIDE in files else None
    out["transport_port_range"] = _fact(
        _find(files, guide, r"AscendDirectTransport.*?randomly allocates ports within range `(\[20000, [^`]+\))`"),
        lambda m: m.group(1))
    policy = _POLICY if _POLICY in files else None
    rows = {}
    src = None
    if policy is not None:
        for m in re.finditer(r"^\| (v0\.\d+\.\d+(?:\.post\d+)?)\s*\| (v0\.\d+\.\d+)\s*\|", files[policy], re.M):
            rows[m.group(1)[1:]] = m.group(2)[1:]
            src = src or f"{policy}:{files[policy].count(chr(10), 0, m.start()) + 1}"
    out["vllm_base"] = {"value": dict(sorted(rows.items())), "source": src} if rows else None
    return out
