"""OPD623 nixl-kv-lease: a NIXL prefill's KV lease shorter than the platform needs, or not a number.

A NIXL prefill keeps a finished request's KV blocks for decode for ``kv_lease_duration``
seconds (``kv_connector_extra_config``, vLLM 0.30: default 30; decode's heartbeats extend it
while it waits). When decode reads later than that, prefill has freed the blocks and decode
may use another request's KV, while its counters grow as if all went well. Facts, sources
and the per-platform leases: ``presets/targets/nixl_lease.yaml`` (read by :func:`facts`).

``validate`` judges a value vLLM cannot compute with; the CPU's lease is judged by
:func:`launch_findings`, which ``validate --platform cpu`` (``omni_pd.check.validate._run_platform_findings``)
calls, and ``launch --platform cpu`` runs that same validate (:func:`omni_pd.launch.plan.validate_for_launch`),
so the two give the same finding. On the
``vllm`` runtime the launcher itself writes the platform's lease into each engine's
``--kv-transfer-config`` where the file sets none (:func:`planned_lease`), so only a lease
the file sets is judged there; on ``vllm-omni`` the file is passed as written, so an unset
lease counts as vLLM's default.
"""

from __future__ import annotations

from typing import Any, Iterable

from omni_pd.check.lease_facts import EXTRA, LeaseFacts, configured, facts, planned_lease, vllm_name  # noqa: F401  (re-exported)
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.diagnostics import Diagnostic, Severity


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _findings(ctx: Context, r: Rule, platform: str | None, unset_counts: bool, how: str) -> Iterable[Diagnostic]:
    f = facts()
    need = f.needed_s(platform)
    for n in ctx.pd_pair or ():
        kv = n.kv or {}
        if not f.applies(ctx.target, vllm_name(kv, platform)):
            continue
        is_set, value = configured(kv)
        where = f"stage {n.stage_id} ({n.pd_role})"
        if is_set and not _number(value):
            yield r.diag(f"{where}: {f.key} is {value!r}, not a number of seconds: the NIXL "
                         f"connector of {ctx.release_words()} computes with it (lease // 6, lease * 2 // 3) and the engine fails to start",
                         ctx.sloc(n, "kv_transfer_config", EXTRA, f.key, value=True), severity=Severity.ERROR,
                         help=f"give {f.key} in seconds as an integer, e.g. {need or f.default_s}")
            continue
        if is_set and value <= 0:
            yield r.diag(f"{where}: {f.key} {value!r}: prefill frees every request's KV blocks at once, before "
                         "decode can read them", ctx.sloc(n, "kv_transfer_config", EXTRA, f.key, value=True),
                         help=f"remove it (vLLM's default {f.default_s} s) or give a positive number of seconds")
            continue
        if need is None or (not is_set and not unset_counts):
            continue
        lease = value if is_set else f.default_s
        if lease >= need:
            continue
        said = f"{f.key} {lease:g} s" if is_set else f"{f.key} unset (the default of {ctx.release_words()}: {f.default_s} s)"
        yield r.diag(
            f"{where}: {said} is shorter than the {need} s NIXL KV lease {platform} needs: prefill can free a "
            "request's KV blocks before decode reads them, and decode then uses blocks that may hold another "
            "request's KV",
            ctx.sloc(n, "kv_transfer_config", EXTRA, f.key, value=True) if is_set else ctx.sloc(n, "kv_transfer_config"),
            help=f"set kv_transfer_config.{EXTRA}.{f.key}: {need} on both stages of the pair" + how,
            notes=[f"presets/targets/nixl_lease.yaml platform_lease_s: {platform} {need} s (and why)"])


@rule("OPD623", "nixl-kv-lease", Severity.WARNING,
      "a NIXL prefill's KV lease (kv_lease_duration) is shorter than the platform needs, or not a number",
      fail="""\
pipeline: llm_pd
stages:
  - stage_id: 0
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_producer
      kv_connector_extra_config: {kv_lease_duration: 0}
  - {stage_id: 1, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "5700"},
     kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer}}
""",
      passing="""\
pipeline: llm_pd
stages:
  - stage_id: 0
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_producer
      kv_connector_extra_config: {kv_lease_duration: 600}
  - {stage_id: 1, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "5700"},
     kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer}}
""",
      examples=(
          Example("a lease that is not a number stops the engine: an error", """\
pipeline: llm_pd
stages:
  - stage_id: 0
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_producer
      kv_connector_extra_config: {kv_lease_duration: "600"}
  - {stage_id: 1, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "5700"},
     kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer}}
""", True, severity=Severity.ERROR, contains="not a number of seconds"),
          Example("a release the lease facts were not read for (0.24) is not judged", """\
pipeline: llm_pd
stages:
  - stage_id: 0
    kv_transfer_config:
      kv_connector: NixlConnector
      kv_role: kv_producer
      kv_connector_extra_config: {kv_lease_duration: 0}
  - {stage_id: 1, env: {VLLM_NIXL_SIDE_CHANNEL_PORT: "5700"},
     kv_transfer_config: {kv_connector: NixlConnector, kv_role: kv_consumer}}
""", False, {"vllm_version": "0.24"}),
      ))
def nixl_kv_lease(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Source: vLLM 0.30's NIXL connector reads ``kv_connector_extra_config.kv_lease_duration``
    (seconds, default 30) on prefill and decode (v1/nixl/base_scheduler.py
    ``NixlBaseConnectorScheduler.__init__``, base_worker.py ``NixlBaseConnectorWorker``):
    prefill frees a finished request's blocks when it runs out (``get_transfer_results``,
    "Releasing expired KV blocks"), and a decode that reads them later uses freed blocks
    (pull_worker.py ``_get_new_notifs``, "Potentially invalid KV blocks"). A value that is
    not a number stops the engine (``lease // 6``): an error. A value of 0 or less frees
    the blocks at once. A lease shorter than the platform needs
    (``presets/targets/nixl_lease.yaml`` ``platform_lease_s``: ``cpu`` 480 s, where a
    loaded CPU delivered requests to decode after more than 30 s) is a warning;
    ``launch --platform cpu`` (dry run included) gives it before planning, and
    ``validate --platform cpu`` the same finding (cpu has no overlay: the base stages are
    judged). Judged for the releases the facts were read for (0.30-0.34: the 0.30,
    0.33 and 0.34 wheels read the key with the same default). Only vLLM's NIXL connector is
    judged: a ``kv_connector_module_path`` naming another package's class is that package's
    connector (:func:`omni_pd.compile.connectors.identity.identify`)."""
    return _findings(ctx, r, ctx.platform, unset_counts=True, how="")


def launch_findings(ctx: Context, platform: str, runtime: str) -> list[Diagnostic]:
    """OPD623 for ``launch --platform platform``: only the lease findings of the platform
    (the value checks are validate's, already reported). ``runtime``: ``vllm`` (the
    launcher sets the lease where the file has none, so only a lease the file sets is
    judged) or ``vllm-omni`` (the file is passed as written: an unset lease counts as
    vLLM's default)."""
    from omni_pd.check.rules import get

    r = get("OPD623")
    assert r is not None
    how = ("; `launch` writes it where the file sets none" if runtime == "vllm" else
           "; vllm-omni passes the file's kv_transfer_config as written, so `launch` cannot add it")
    return [d for d in _findings(ctx, r, platform, unset_counts=runtime != "vllm", how=how)
            if d.severity is Severity.WARNING and "shorter than" in d.message]
