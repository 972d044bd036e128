"""Which vLLM and vllm-omni releases omni-pd targets: read from presets/targets data.

``presets/targets/vllm.yaml`` gives the default vLLM ``major.minor`` (``default_version``)
and the first and last release its facts were read from (``known_versions``);
``presets/targets/vllm_omni_stage_keys.yaml`` gives the vllm-omni release whose stage
keys and pipelines omni-pd checks against (``vllm_omni``). ``omni-pd --version`` and the
``--vllm-version`` option read them here, so a new release is one data edit.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from omni_pd.compile.targets import Target, parse_version, target


@lru_cache(maxsize=1)
def _vllm_facts() -> dict[str, Any]:
    from omni_pd.resources import data_dir, load_data

    return load_data(data_dir("presets") / "targets" / "vllm.yaml")


def default_vllm_version() -> str:
    """The vLLM ``major.minor`` used when ``--vllm-version`` is not given (e.g. ``"0.30"``)."""
    return str(_vllm_facts()["default_version"])


def known_vllm_versions() -> list[str]:
    """Every vLLM ``major.minor`` omni-pd has facts for, oldest first: each minor from
    ``known_versions.first`` to ``known_versions.last`` of presets/targets/vllm.yaml.

    Raises ValueError when the two bounds have different major versions (the data
    covers major 0 only)."""
    k = _vllm_facts()["known_versions"]
    first, last = parse_version(k["first"]), parse_version(k["last"])
    if first[0] != last[0]:
        raise ValueError("presets/targets/vllm.yaml known_versions must stay within one major version")
    return [f"{first[0]}.{m}" for m in range(first[1], last[1] + 1)]


def known_target(version: str | None) -> Target:
    """The :class:`~omni_pd.compile.targets.Target` for ``version`` (None: the default)
    when omni-pd has facts for it.

    Raises ValueError naming the known range for a malformed or unknown version
    (``"9.9"``, ``"0.5"``), so no ``--vllm-version`` is accepted silently."""
    t = target(version)
    known = known_vllm_versions()
    if t.label not in known:
        raise ValueError(f"omni-pd has no facts for vLLM {t.label}; known versions: "
                         f"{known[0]} to {known[-1]} (presets/targets/vllm.yaml)")
    return t


@lru_cache(maxsize=1)
def default_vllm_omni_version() -> str:
    """The vllm-omni ``major.minor`` whose stage keys and pipelines omni-pd checks
    against (``vllm_omni`` in presets/targets/vllm_omni_stage_keys.yaml, e.g. ``"0.30"``)."""
    from omni_pd.resources import data_dir, load_data

    return str(load_data(data_dir("presets") / "targets" / "vllm_omni_stage_keys.yaml")["vllm_omni"])


def vllm_omni_releases() -> list[str]:
    """vllm-omni ``major.minor`` releases, oldest first (``vllm_omni_releases`` in
    presets/targets/vllm.yaml)."""
    return [str(v) for v in _vllm_facts()["vllm_omni_releases"]]


def runtime_release(runtime: str, target: Target) -> str:
    """How a message names the runtime whose behaviour it states at ``--vllm-version``
    ``target``: ``"vLLM 0.24"`` for plain ``vllm serve`` engines (``runtime="vllm"``); for
    ``"vllm-omni"`` the vllm-omni release that runs on that vLLM minor, ``"vllm-omni 0.24"``,
    or where none does, the newest release before it whose facts apply, named with the
    vLLM version so nobody looks for a release that does not exist: ``"vllm-omni 0.30 (the
    newest release before vLLM 0.31)"`` / ``"vllm-omni (no release for vLLM 0.13; the
    first is 0.14)"``."""
    if runtime != "vllm-omni":
        return f"vLLM {target.label}"
    releases = vllm_omni_releases()
    if target.label in releases:
        return f"vllm-omni {target.label}"
    older = [r for r in releases if parse_version(r) < target.version]
    if not older:
        return f"vllm-omni (no release for vLLM {target.label}; the first is {releases[0]})"
    return f"vllm-omni {older[-1]} (the newest release before vLLM {target.label})"


def bootstrap_reader(key: str, runtime: str, target: Target) -> str:
    """Who reads the setting that decides a Mooncake prefill's bootstrap port at
    ``--vllm-version`` ``target``, as a message names it (``key``, ``runtime``: the
    :class:`omni_pd.compile.targets.MooncakeBootstrap` facts). ``key`` ``"env"``
    (``VLLM_MOONCAKE_BOOTSTRAP_PORT``) is read by vLLM's MooncakeConnector itself, whatever
    runs it (vllm-omni before 0.30 passes the stage env through unchanged:
    presets/targets/mooncake_bootstrap.yaml): ``"vLLM 0.24"``, never a vllm-omni release;
    a ``kv_transfer_config`` key is read by the runtime, named by :func:`runtime_release`
    (``"vllm-omni 0.30"``)."""
    return f"vLLM {target.label}" if key == "env" else runtime_release(runtime, target)


def omni_pd_version() -> str:
    """omni-pd's version: ``omni_pd.__version__`` (the installed distribution's, else
    pyproject.toml's, else ``"unknown"``; omni_pd/__init__.py)."""
    import omni_pd

    return omni_pd.__version__


def version_text() -> str:
    """What ``omni-pd --version`` prints (two lines, newline-terminated)."""
    known = known_vllm_versions()
    return (f"omni-pd {omni_pd_version()}\n"
            f"targets vLLM {default_vllm_version()} (--vllm-version {known[0]} to {known[-1]}), "
            f"vllm-omni {default_vllm_omni_version()}\n")
