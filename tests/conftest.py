"""Shared pytest fixtures and hypothesis profiles for the omni-pd test suite.

Hypothesis profiles (choose with the ``HYPOTHESIS_PROFILE`` env var):

* ``dev`` (default): the per-test example counts written in the test modules;
* ``ci``: at least 200 examples per property;
* ``long``: 2000 examples per property (a soak run, minutes).

``deadline`` is off in every profile: an expansion goes through ruamel.yaml and
pydantic, whose first call per process is slow, and timing must never fail a test.

Session fixture ``omni_wheel_deploy_dir``: the ``vllm_omni/deploy/*.yaml`` files of
the vllm-omni==0.30.0 wheel, downloaded once with pip into a cache folder
(``$OMNI_PD_CACHE``, else ``<repo>/.cache/wheels``, which is gitignored).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[1]

# --- hypothesis profiles --------------------------------------------------------------

_COMMON = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", **_COMMON)
settings.register_profile("ci", max_examples=100, **_COMMON)  # = dev: the CI budget (fast suite); "long" for depth
settings.register_profile("long", max_examples=2000, **_COMMON)
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
settings.load_profile(HYPOTHESIS_PROFILE)


# --- skip reasons: short, no path outside the project (the hooks live in skip_policy.py) --

from skip_policy import pytest_make_collect_report, pytest_runtest_makereport  # noqa: E402,F401


# --- parallel runs: every engine-starting test on one pytest-xdist worker ---------------

#: the work unit of every test that starts vLLM engines (the tests/test_e2e_*.py modules,
#: the only ones that may ask for a tiny model). pyproject's ``-n 2 --dist loadgroup`` sends
#: it whole to one worker, in collection order, so two engine runs never overlap (one omni
#: pipeline peaks near 11 GiB of the machine's 24) and the session's plain baselines
#: (``plain_llm``, ``plain_thinker``) start once; the other worker runs the fast and oracle
#: tests beside them. Every other module is one work unit, so its module fixtures (some
#: start an oracle subprocess that imports vLLM) are set up once, on one worker.
ENGINE_GROUP = "engines"
_ENGINE_FIXTURES = frozenset({"tiny_model", "plain_llm", "plain_thinker"})


def work_unit(nodeid: str) -> str:
    """The pytest-xdist work unit of the test ``nodeid``: :data:`ENGINE_GROUP` for a
    ``test_e2e_*`` module, an explicit ``@group`` suffix (``xdist_group``) when xdist
    wrote one, else the module's path."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        return nodeid.rsplit("@", 1)[1]
    path = nodeid.split("::", 1)[0]
    return ENGINE_GROUP if path.rpartition("/")[2].startswith("test_e2e_") else path


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` with :func:`work_unit` as the grouping (pytest 9.2 keeps node
    ids in ``Node._id``, so xdist 3.8's own ``xdist_group`` renaming of ``_nodeid`` no
    longer reaches its scheduler)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class EngineGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return EngineGroupScheduling(config, log)


def pytest_itemcollected(item):
    """Refuse an engine fixture outside a ``test_e2e_*`` module: :func:`work_unit` would not
    keep it on the engine worker, and two engine runs could overlap."""
    used = _ENGINE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    if used and work_unit(item.nodeid) != ENGINE_GROUP:
        raise pytest.UsageError(f"{item.nodeid} uses {', '.join(sorted(used))}: engine tests live in "
                                "tests/test_e2e_*.py (tests/conftest.py work_unit)")


def example_budget(dev_examples: int) -> int:
    """Examples for one property: ``dev_examples`` under the ``dev`` profile, else the
    loaded profile's ``max_examples`` (never fewer than ``dev_examples``).

    Needed because ``@settings(max_examples=...)`` on a test overrides the profile.
    """
    if HYPOTHESIS_PROFILE == "dev":
        return dev_examples
    return max(dev_examples, settings.default.max_examples)


# --- the vllm-omni 0.30.0 wheel --------------------------------------------------------

OMNI_WHEEL_SPEC = "vllm-omni==0.30.0"
_WHEEL_GLOB = "vllm_omni-0.30.0-*.whl"
_DEPLOY_MEMBER = re.compile(r"vllm_omni/deploy/([A-Za-z0-9_.\-]+\.yaml)")


def wheel_cache_dir() -> Path:
    """Where downloaded wheels are kept: ``$OMNI_PD_CACHE`` or ``<repo>/.cache/wheels``."""
    env = os.environ.get("OMNI_PD_CACHE")
    return Path(env) if env else REPO / ".cache" / "wheels"


def _cached_wheel(cache: Path) -> Path | None:
    """The vllm-omni 0.30.0 wheel already in ``cache`` (newest name first), or None."""
    found = sorted(cache.glob(_WHEEL_GLOB))
    return found[-1] if found else None


def _offline() -> bool:
    """True when the user asked for no network (``OMNI_PD_OFFLINE=1``)."""
    return os.environ.get("OMNI_PD_OFFLINE", "") == "1"


def _download_wheel(cache: Path) -> tuple[Path | None, str]:
    """Run ``python -m pip download vllm-omni==0.30.0 --no-deps -d cache``.

    Returns the wheel path (None on failure) and pip's last output lines.
    """
    cmd = [sys.executable, "-m", "pip", "download", OMNI_WHEEL_SPEC, "--no-deps",
           "--only-binary", ":all:", "-d", str(cache)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{' '.join(cmd)} could not run: {e}"
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
    if proc.returncode != 0:
        return None, f"`{' '.join(cmd)}` exited with {proc.returncode}:\n{tail}"
    wheel = _cached_wheel(cache)
    if wheel is None:
        return None, f"`{' '.join(cmd)}` left no {_WHEEL_GLOB} in {cache}:\n{tail}"
    return wheel, tail


def _download_locked(cache: Path) -> Path | None:
    """The wheel in ``cache``, downloaded by whichever pytest-xdist worker takes the lock
    ``cache/.download.lock`` first (pip copies the wheel into ``-d`` in place, so a second
    worker globbing the folder mid-copy would read a partial zip). None when the cache
    cannot be made or pip fails: the caller reports it."""
    import fcntl

    try:
        cache.mkdir(parents=True, exist_ok=True)
        lock = open(cache / ".download.lock", "w")
    except OSError:
        return None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _cached_wheel(cache) or _download_wheel(cache)[0]


@pytest.fixture(scope="session")
def omni_wheel_deploy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding every ``vllm_omni/deploy/*.yaml`` of the vllm-omni==0.30.0 wheel.

    Reuses a wheel already in :func:`wheel_cache_dir`, else downloads it with pip.
    When the wheel cannot be had the test FAILS with pip's message, unless
    ``OMNI_PD_OFFLINE=1`` (then it is skipped).
    """
    cache = wheel_cache_dir()
    if _offline():
        wheel = _cached_wheel(cache) if cache.is_dir() else None
    else:
        wheel = _download_locked(cache)
    if wheel is None:
        if _offline():
            where = "$OMNI_PD_CACHE" if os.environ.get("OMNI_PD_CACHE") else os.path.relpath(cache, REPO)
            pytest.skip(f"OMNI_PD_OFFLINE=1 and no {_WHEEL_GLOB} in {where}")
        try:
            cache.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            pytest.fail(f"cannot create the wheel cache {cache}: {e}", pytrace=False)
        wheel, why = _download_wheel(cache)
        if wheel is None:
            pytest.fail(
                f"could not download {OMNI_WHEEL_SPEC} for the wheel deploy-config tests.\n{why}\n"
                f"Put the wheel in {cache} (or set OMNI_PD_CACHE), or set OMNI_PD_OFFLINE=1 to skip.",
                pytrace=False)
    out = tmp_path_factory.mktemp("vllm_omni_deploy")
    try:
        with zipfile.ZipFile(wheel) as z:
            for member in z.namelist():
                m = _DEPLOY_MEMBER.fullmatch(member)
                if m:
                    (out / m.group(1)).write_bytes(z.read(member))
    except zipfile.BadZipFile as e:
        pytest.fail(f"{wheel} is not a valid wheel ({e}); delete it so the next run downloads it again",
                    pytrace=False)
    if not any(out.glob("*.yaml")):
        pytest.fail(f"{wheel} has no vllm_omni/deploy/*.yaml files", pytrace=False)
    return out


# --- tiny models for the CPU end-to-end tests -------------------------------------------


@pytest.fixture(scope="session")
def tiny_model():
    """``tiny_model(name) -> Path``: a tiny random-weight model (``qwen2`` or
    ``qwen3_omni``, tests/e2e/) built by the e2e venv's python (``OMNI_PD_E2E_PYTHON``),
    once per builder version, in ``<repo>/.cache/e2e-models`` (tests/e2e/harness.py
    ``tiny_model_dir``). Skips when ``OMNI_PD_E2E_PYTHON`` is unset."""
    from e2e.harness import tiny_model_dir

    python = os.environ.get("OMNI_PD_E2E_PYTHON")
    if not python:
        pytest.skip("OMNI_PD_E2E_PYTHON not set (build it with .ci/e2e_venv.sh)")
    return lambda name: tiny_model_dir(name, python)


def _e2e_vllm() -> str:
    """The e2e venv's ``vllm`` CLI (next to ``OMNI_PD_E2E_PYTHON``)."""
    return str(Path(os.environ["OMNI_PD_E2E_PYTHON"]).parent / "vllm")


@pytest.fixture(scope="session")
def plain_llm(tiny_model, tmp_path_factory):
    """The tiny qwen2's plain ``vllm serve`` answers to every completion request the
    plain-vLLM PD modules send (tests/e2e/baselines.py :data:`LLM`), one instance per
    session on port 18300, stopped before this returns. Skips without the e2e venv."""
    from e2e.baselines import llm_answers

    model = tiny_model("qwen2")
    return llm_answers(_e2e_vllm(), model, 18300, tmp_path_factory.mktemp("plain-llm"))


@pytest.fixture(scope="session")
def plain_thinker(tiny_model, tmp_path_factory):
    """The tiny Qwen3-Omni Thinker's plain answers to every chat the Thinker PD modules
    send (tests/e2e/baselines.py :func:`thinker_chats`), one instance per session on port
    19650, stopped before this returns. Skips without the e2e venv."""
    from e2e.baselines import thinker_answers

    model = tiny_model("qwen3_omni")
    return thinker_answers(_e2e_vllm(), model, 19650, tmp_path_factory.mktemp("plain-thinker"))
