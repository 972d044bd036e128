"""Encoder-cache transfer (OPD614 ec-connector, OPD615 ec-key-unknown; CAP-EC-REGISTRY,
capability family): ``ec_transfer_config`` per vLLM release, facts in
``presets/targets/ec_connectors.yaml`` (:mod:`omni_pd.compile.ec_connectors`). The EC
topology rules (OPD616-OPD619) are in omni_pd/check/rules/encoder.py. Issue 38 split
these out of omni_pd/check/rules/capability.py.
"""

from __future__ import annotations

from difflib import get_close_matches
from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules.capability import _v

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode


# OPD614 and OPD615 run on every platform of ``--all-platforms``: an overlay may set a stage's
# ``ec_transfer_config`` (validate merges a finding the base platform already made).


def _ec_facts() -> dict[str, Any]:
    from omni_pd.compile.ec_connectors.base import ec_facts

    return ec_facts()


def ec_fact(name: str, version: tuple[int, int]) -> dict[str, Any] | None:
    """The ec_connectors.yaml row of EC connector ``name`` for vLLM ``version``, or None
    (not registered in that release, or unknown): :func:`omni_pd.compile.ec_connectors.base.ec_row`."""
    from omni_pd.compile.ec_connectors.base import ec_row

    return ec_row(name, version)


def _ec_nodes(ctx: Context) -> list[tuple["StageNode", dict[str, Any]]]:
    if ctx.topology is None:
        return []
    return [(n, n.settings["ec_transfer_config"]) for n in ctx.topology.stages
            if isinstance(n.settings.get("ec_transfer_config"), dict)]


_EC = ("stages:\n"
       "  - {{stage_id: 0, devices: \"0\", mm_encoder_only: true{pe}, ec_transfer_config: {{ec_connector: {c}, ec_role: {pr}{px}}}}}\n"
       "  - {{stage_id: 1, devices: \"1\"{de}, ec_transfer_config: {{ec_connector: {c}, ec_role: {dr}{dx}}}}}\n")


def _ec(c: str = "ECExampleConnector", pr: str = "ec_producer", dr: str = "ec_consumer", px: str = "", dx: str = "",
        pe: str = "", de: str = "") -> str:  # pragma: no mutate block (runs at import only)
    return _EC.format(c=c, pr=pr, dr=dr, px=px, dx=dx, pe=pe, de=de)


_CPU_OK = ", ec_connector_extra_config: {ec_cpu_bytes: 1073741824, ec_enable_nixl: true}"


@rule("OPD614", "ec-connector", Severity.ERROR,
      "ec_transfer_config names an EC connector, role or option the target vLLM does not have (or ignores)",
      fail=_ec(c="ECCPUConnector", px=", ec_connector_extra_config: {ec_enable_nixl: true}",
               dx=", ec_connector_extra_config: {ec_enable_nixl: true}"),
      passing=_ec(c="ECCPUConnector", px=_CPU_OK, dx=_CPU_OK), example_context={"vllm_version": "0.29"},
      pass_context={"vllm_version": "0.30"}, labels=("CAP-EC-REGISTRY",),
      examples=(
          Example("connector not in this release", _ec(c="ECMooncakeConnector"), True, {"vllm_version": "0.29"},
                  contains="not registered"),
          Example("misspelt connector", _ec(c="ECExampleConnectr"), True, {"vllm_version": "0.30"},
                  contains="did you mean ECExampleConnector"),
          Example("pre-release name", _ec(c="ECSharedStorageConnector"), True, {"vllm_version": "0.30"},
                  contains="it is ECExampleConnector"),
          Example("module path loads an out-of-tree connector", _ec(
              c="MyEC", px=", ec_connector_module_path: my.ec", dx=", ec_connector_module_path: my.ec"), False,
              {"vllm_version": "0.30"}),
          Example("ec_connector without ec_role", _ec().replace(", ec_role: ec_consumer", ""), True,
                  {"vllm_version": "0.30"}, contains="no ec_role"),
          Example("unknown ec_role", _ec(dr="ec_reader"), True, {"vllm_version": "0.30"}, contains="ec_reader"),
          Example("consumer fed by no producer", _ec(pr="ec_consumer"), True, {"vllm_version": "0.30"},
                  contains="no ec_producer"),
          Example("producer with no consumer downstream", _ec(dr="ec_producer"), True, {"vllm_version": "0.30"},
                  severity=Severity.WARNING, contains="no ec_consumer"),
          Example("ec_both feeds itself and the next stage", _ec(pr="ec_both"), False, {"vllm_version": "0.30"}),
          Example("ECCPUConnector 0.30 needs ec_cpu_bytes", _ec(c="ECCPUConnector"), True, {"vllm_version": "0.30"},
                  contains="ec_cpu_bytes"),
          Example("ECCPUConnector with the V1 model runner forced", _ec(
              c="ECCPUConnector", px=_CPU_OK, dx=_CPU_OK, de=", env: {VLLM_USE_V2_MODEL_RUNNER: \"0\"}"), True,
              {"vllm_version": "0.30"}, contains="V2 model runner"),
          Example("ECMooncakeConnector producer with TP 2", _ec(c="ECMooncakeConnector").replace(
              'devices: "0", mm_encoder_only', 'devices: "0,1", tensor_parallel_size: 2, mm_encoder_only'), True,
              {"vllm_version": "0.30"}, contains="tensor_parallel_size 1"),
          Example("EC before vLLM 0.13", _ec(), True, {"vllm_version": "0.11"}, contains="0.13"),
          Example("ECCPUConnector producer with a wildcard side-channel host on vLLM 0.34", _ec(
              c="ECCPUConnector", px=_CPU_OK, dx=_CPU_OK, pe=', env: {VLLM_EC_SIDE_CHANNEL_HOST: "0.0.0.0"}'), True,
              {"vllm_version": "0.34"}, contains="refuses the wildcard side-channel host"),
          Example("the same wildcard host on vLLM 0.33 (bound on every interface; across hosts OPD507)", _ec(
              c="ECCPUConnector", px=_CPU_OK, dx=_CPU_OK, pe=', env: {VLLM_EC_SIDE_CHANNEL_HOST: "0.0.0.0"}'), False,
              {"vllm_version": "0.33"}),
          Example("ECCPUConnector side-channel port past 65535 with DP 2 on vLLM 0.34", _ec(
              c="ECCPUConnector", px=_CPU_OK, dx=_CPU_OK,
              pe=', data_parallel_size: 2, env: {VLLM_EC_SIDE_CHANNEL_PORT: "65535"}').replace(
              'devices: "0", mm_encoder_only', 'devices: "0,2", mm_encoder_only'), True,
              {"vllm_version": "0.34"}, contains="65535..65536"),
          Example("ECCPUConnector side-channel port 0 on vLLM 0.34 (the OS picks)", _ec(
              c="ECCPUConnector", px=_CPU_OK, dx=_CPU_OK, pe=', env: {VLLM_EC_SIDE_CHANNEL_PORT: "0"}'), False,
              {"vllm_version": "0.34"}),
      ))
def ec_connector(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Encoder disaggregation (E -> PD) through ``ec_transfer_config``, per vLLM release
    (``presets/targets/ec_connectors.yaml``): the ``ec_connector`` must be registered
    (ECExampleConnector 0.13+, ECCPUConnector 0.29+, ECMooncakeConnector in 0.30) unless
    ``ec_connector_module_path`` loads it; ``ec_role`` is required and one of
    ec_producer / ec_consumer / ec_both; every ec_consumer needs an ec_producer (or
    ec_both) among the stages feeding it, and a producer with no consumer downstream
    moves nothing (warning). Per connector: an option the release ignores is an error,
    because the transfer is then a silent no-op (``ec_enable_nixl`` on 0.29: every item
    is re-encoded; it arrives with vLLM PR #47941 in 0.30); keys it refuses to start
    without (ECCPUConnector 0.30: ``ec_cpu_bytes``); ECCPUConnector needs the V2 model
    runner (``VLLM_USE_V2_MODEL_RUNNER=0`` is refused); ECMooncakeConnector producers run
    TP = PP = DP = 1. Sources: vLLM 0.30.0 config/ec_transfer.py,
    distributed/ec_transfer/ec_connector/factory.py, cpu/connector.py, cpu/common.py,
    cpu/scheduler/__init__.py, mooncake/config.py; https://github.com/llm-d/llm-d/issues/2535,
    https://github.com/vllm-project/vllm/pull/47941."""
    nodes = _ec_nodes(ctx)
    if not nodes:
        return
    tgt = ctx.target
    facts = _ec_facts()
    roles = tuple(facts["ec_roles"])
    if tgt.version < (0, 13):
        n, _ = nodes[0]
        yield r.diag(f"ec_transfer_config (encoder disaggregation) arrived in vLLM 0.13; the target is {tgt.label}",
                     ctx.sloc(n, "ec_transfer_config"), help="target vLLM 0.13 or later, or remove ec_transfer_config")
        return
    known = sorted(facts["connectors"])
    for n, ec in nodes:
        name = ec.get("ec_connector")
        role = ec.get("ec_role")
        if name and role is None:
            yield r.diag(f"stage {n.stage_id}: ec_connector is set but there is no ec_role (vLLM refuses to start)",
                         ctx.sloc(n, "ec_transfer_config"), help="add `ec_role: ec_producer` (encoder) or `ec_role: ec_consumer`")
        elif role is not None and role not in roles:
            close = get_close_matches(str(role), roles, n=1, cutoff=0.5)
            yield r.diag(f"stage {n.stage_id}: unsupported ec_role `{role}`",
                         ctx.sloc(n, "ec_transfer_config", "ec_role", value=True),
                         help=(f"did you mean `{close[0]}`? " if close else "") + "ec_role is one of " + ", ".join(roles))
        if not name or ec.get("ec_connector_module_path"):
            continue
        row = ec_fact(str(name), tgt.version)
        where = ctx.sloc(n, "ec_transfer_config", "ec_connector", value=True)
        if row is None:
            rows = facts["connectors"].get(name)
            if rows:
                yield r.diag(f"stage {n.stage_id}: {name} is not registered in {ctx.release_words()} (added in vLLM {rows[0]['since']})",
                             where, help="pick an EC connector your vLLM has: " + ", ".join(
                                 c for c in known if ec_fact(c, tgt.version)))
            elif (facts.get("renames") or {}).get(name):
                new = facts["renames"][name]
                yield r.diag(f"stage {n.stage_id}: {name} is not registered; it is {new}", where,
                             help=f"write `ec_connector: {new}`")
            else:
                close = get_close_matches(str(name), known, n=1, cutoff=0.6)
                yield r.diag(f"stage {n.stage_id}: unknown ec_connector `{name}`" + (f"; did you mean {close[0]}?" if close else ""),
                             where, help=f"write `ec_connector: {close[0]}`" if close else
                             "set ec_connector_module_path for an out-of-tree EC connector")
            continue
        extra = ec.get("ec_connector_extra_config") or {}
        for key, why in (row.get("not_read") or {}).items():
            if key in extra:
                yield r.diag(f"stage {n.stage_id}: ec_connector_extra_config.{key} is not read by {name} in {ctx.release_words()}: "
                             f"{why}", ctx.sloc(n, "ec_transfer_config", "ec_connector_extra_config", key),
                             help=f"target the release that reads {key}, or use an EC connector that moves encoder "
                                  "outputs on this release (ECExampleConnector with a shared directory)")
        for key in row.get("required") or []:
            if extra.get(key) in (None, "", 0):
                yield r.diag(f"stage {n.stage_id}: {name} in {ctx.release_words()} requires ec_connector_extra_config.{key}",
                             ctx.sloc(n, "ec_transfer_config", "ec_connector_extra_config"),
                             help=f"add `{key}: <bytes>` (the CPU region size for encoder outputs)" if key.endswith("bytes")
                             else f"add `{key}:`")
        if row.get("needs_v2_runner"):
            v2 = {**ctx.env, **n.env}.get("VLLM_USE_V2_MODEL_RUNNER")
            runner = ctx.raw_at(("model_runner",))
            if (v2 is not None and str(v2).strip().lower() in ("0", "false", "no")) or runner == "v1":
                yield r.diag(f"stage {n.stage_id}: {name} requires the V2 model runner, which is switched off here",
                             ctx.sloc(n, "env", "VLLM_USE_V2_MODEL_RUNNER") if v2 is not None else ctx.loc(("model_runner",)),
                             help="set VLLM_USE_V2_MODEL_RUNNER=1 (and no `model_runner: v1`)")
        if row.get("side_channel") and role in ("ec_producer", "ec_both"):
            yield from _side_channel(ctx, r, n, str(name), row["side_channel"])
        if row.get("producer_single_rank") and role in ("ec_producer", "ec_both"):
            par = ctx.parallel(n)
            for key in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
                if par[key] > 1:
                    yield r.diag(f"stage {n.stage_id}: {name} producers need {key} 1 (got {par[key]})",
                                 ctx.sloc(n, key, value=True), help=f"run the encoder stage with `{key}: 1`")
    yield from _ec_roles_along_edges(ctx, r, nodes)


def _side_channel(ctx: Context, r: Rule, n: "StageNode", name: str, sc: dict[str, Any]) -> Iterable[Diagnostic]:
    """The producer's side-channel host and port values the release refuses at start
    (``side_channel`` of its ec_connectors.yaml row: ECCPUConnector from vLLM 0.34 raises
    ValueError on a wildcard ``VLLM_EC_SIDE_CHANNEL_HOST`` and on a set port whose
    ``base + DP index`` leaves 1..65535; 0 lets the OS pick). The stage's env wins over the
    launcher's ``--env``."""
    env = {**ctx.env, **n.env}
    host = env.get(sc["host_env"])
    where = (lambda key: ctx.sloc(n, "env", key, value=True) if key in n.env else ctx.sloc(n, "ec_transfer_config"))
    if host is not None and str(host).strip() in sc["wildcard_hosts"]:
        yield r.diag(f"stage {n.stage_id}: {name} on {ctx.release_words()} refuses the wildcard side-channel host "
                     f"{sc['host_env']}={str(host).strip()} (ValueError at start: the producer advertises this host to "
                     "its consumers, who cannot dial a wildcard)", where(sc["host_env"]),
                     notes=[f"source: {sc['source']}"],
                     help=f"remove {sc['host_env']} (vLLM {ctx.target.label} then uses the host's routable address, "
                          "get_ip()) or set it to that address")
    raw = env.get(sc["port_env"])
    if raw is None:
        return
    try:
        base = int(str(raw).strip())
    except ValueError:
        return  # not a number: vLLM's int() of the env refuses it; not judged here
    lo, hi = sc["port_range"]
    dp = ctx.parallel(n)["data_parallel_size"]
    if base != 0 and (base < lo or base + dp - 1 > hi):
        span = f"{base}..{base + dp - 1} (base + DP index, data_parallel_size {dp})" if dp > 1 else str(base)
        yield r.diag(f"stage {n.stage_id}: {name} on {ctx.release_words()} binds its side channel at {span}, outside "
                     f"{lo}..{hi} (ValueError at start)", where(sc["port_env"]), notes=[f"source: {sc['source']}"],
                     help=f"set {sc['port_env']} to a port from {lo} to {hi - dp + 1}, or 0 (the OS picks a free port)")


def _ec_roles_along_edges(ctx: Context, r: Rule, nodes: list) -> Iterable[Diagnostic]:
    """Every ec_consumer has a producer upstream; every producer a consumer downstream."""
    topo = ctx.topology
    role = {n.stage_id: ec.get("ec_role") for n, ec in nodes}
    ups: dict[int, set[int]] = {}
    for n in topo.stages:  # type: ignore[union-attr]
        seen: set[int] = set()
        todo = list(n.input_sources)
        while todo:
            s = todo.pop()
            if s in seen:
                continue
            seen.add(s)
            up = topo.node(s)  # type: ignore[union-attr]
            todo += list(up.input_sources) if up is not None else []
        ups[n.stage_id] = seen
    producers = {s for s, ro in role.items() if ro in ("ec_producer", "ec_both")}
    for n, ec in nodes:
        ro = ec.get("ec_role")
        if ro == "ec_consumer" and not (ups[n.stage_id] & producers):
            yield r.diag(f"stage {n.stage_id} is an ec_consumer but no ec_producer feeds it (upstream: "
                         f"{', '.join(map(str, sorted(ups[n.stage_id]))) or 'none'})",
                         ctx.sloc(n, "ec_transfer_config", "ec_role", value=True),
                         help="make the encoder-only stage upstream of it `ec_role: ec_producer`")
        if ro == "ec_producer":
            downstream = [s for s, u in ups.items() if n.stage_id in u and role.get(s) in ("ec_consumer", "ec_both")]
            if not downstream:
                yield r.diag(f"stage {n.stage_id} is an ec_producer but no ec_consumer is downstream of it: "
                             "its encoder outputs go nowhere", ctx.sloc(n, "ec_transfer_config", "ec_role", value=True),
                             severity=Severity.WARNING, help="give the stage that consumes its outputs `ec_role: ec_consumer`")


@rule("OPD615", "ec-key-unknown", Severity.WARNING,
      "an ec_transfer_config key or EC connector option is not known to the target vLLM",
      fail=_ec(c="ECCPUConnector", px=", ec_connector_extra_config: {ec_cpu_bytes: 1073741824, num_ec_blocks: 880}",
               dx=", ec_connector_extra_config: {ec_cpu_bytes: 1073741824}"),
      passing=_ec(c="ECCPUConnector", px=_CPU_OK, dx=_CPU_OK), example_context={"vllm_version": "0.30"},
      labels=("SCH-UNKNOWN-KEY",),
      examples=(
          Example("misspelt option", _ec(px=", ec_connector_extra_config: {shared_storage_pth: /tmp/ec}"), True,
                  {"vllm_version": "0.30"}, contains="`shared_storage_pth` is not an option"),
          Example("unknown ec_transfer_config field is an error from 0.18", _ec(px=", ec_bufer_size: 1.0e9"), True,
                  {"vllm_version": "0.30"}, severity=Severity.ERROR, contains="`ec_bufer_size` is not"),
          Example("unknown field only ignored before 0.18", _ec(px=", ec_bufer_size: 1.0e9"), True,
                  {"vllm_version": "0.13"}, contains="ec_bufer_size"),
          Example("ec_rank removed in 0.32", _ec(px=", ec_rank: 0"), True, {"vllm_version": "0.32"},
                  severity=Severity.ERROR, contains="removed"),
          Example("options not pinned for the release are not reported", _ec(
              c="ECCPUConnector", px=", ec_connector_extra_config: {ec_cpu_bytes: 1}"), False, {"vllm_version": "0.29"}),
      ))
def ec_key_unknown(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """``ec_transfer_config`` keys must be ECTransferConfig fields of the target release
    (from 0.18 an unknown key stops the server: error; before, it is ignored: warning;
    ``ec_rank``/``ec_parallel_size`` were removed in 0.32), and
    ``ec_connector_extra_config`` keys should be options the connector reads in that
    release: an unread key does nothing (``num_ec_blocks`` only ever existed in a fork,
    vLLM PR #42998). Releases whose option list omni-pd has not pinned are not
    checked. Sources: vLLM 0.30.0 config/ec_transfer.py, ec_connector/*
    (``get_from_extra_config`` calls); https://github.com/llm-d/llm-d/issues/2535."""
    nodes = _ec_nodes(ctx)
    if not nodes or ctx.target.version < (0, 13):
        return
    facts = _ec_facts()
    tgt = ctx.target
    fields = {k: f for k, f in facts["ec_transfer_config_fields"].items()}
    live = sorted(k for k, f in fields.items() if tgt.version >= _v(f["since"]) and
                  (not f.get("removed") or tgt.version < _v(f["removed"])))
    strict = tgt.rejects_unknown_kv_keys  # same @config(extra="forbid") switch as KVTransferConfig
    never = facts.get("never_upstream") or {}
    for n, ec in nodes:
        for key in ec:
            if key in live:
                continue
            if key in fields:
                f = fields[key]
                gone = f.get("removed") and tgt.version >= _v(f["removed"])
                when = f"was removed in vLLM {f['removed']}" if gone else f"is a field from vLLM {f['since']} on"
                msg = f"stage {n.stage_id}: ec_transfer_config.{key} {when}; judged for {ctx.release_words()}"
                help_ = f"remove `{key}`"
            else:
                close = get_close_matches(str(key), live, n=1, cutoff=0.75)
                msg = f"stage {n.stage_id}: `{key}` is not an ECTransferConfig field"
                help_ = f"did you mean `{close[0]}`?" if close else "move connector options under ec_connector_extra_config"
            yield r.diag(msg, ctx.sloc(n, "ec_transfer_config", key), help=help_,
                         severity=Severity.ERROR if strict else Severity.WARNING)
        name = ec.get("ec_connector")
        row = ec_fact(str(name), tgt.version) if name else None
        extra = ec.get("ec_connector_extra_config") or {}
        if row is None or not isinstance(extra, dict):
            continue
        keys = row.get("extra_keys")
        ignored_later = set(row.get("not_read") or {})
        for key in extra:
            if key in ignored_later:
                continue  # OPD614's finding
            loc = ctx.sloc(n, "ec_transfer_config", "ec_connector_extra_config", key)
            if key in never:
                yield r.diag(f"stage {n.stage_id}: {key} is not an option of {name} ({never[key]})", loc,
                             help=f"remove `{key}`")
            elif keys is not None and key not in keys:
                close = get_close_matches(str(key), keys, n=1, cutoff=0.75)
                yield r.diag(f"stage {n.stage_id}: `{key}` is not an option {name} reads in {ctx.release_words()}", loc,
                             help=f"did you mean `{close[0]}`?" if close else f"{name} reads: " + ", ".join(keys))
