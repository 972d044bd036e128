"""OPD622 known-broken-combination: settings of one stage that a release is known to break.

Some reports are not a missing capability but a combination: a connector, a role, a
parallel layout and a flag that together fail on the releases without a fix. Each is a
row of ``presets/targets/known_broken.yaml`` (connectors, side, conditions on the
stage's effective settings, the releases, the message, the help and the sources), read
by this one rule: a new report of the kind is a new row.

PASS::

    stages:
      - {stage_id: 0, data_parallel_size: 4, kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer}}

FAIL::

    stages:
      - {stage_id: 0, data_parallel_size: 4, data_parallel_multi_port_external_lb: true,
         kv_transfer_config: {kv_connector: MooncakeConnector, kv_role: kv_producer}}
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.diagnostics import Diagnostic, Severity
from omni_pd.check.rules import PARALLEL_SIZE_KEYS, Context, Example, Rule, rule
from omni_pd.check.rules.capability import loaded_rows

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode


@lru_cache(maxsize=1)
def table() -> list[dict[str, Any]]:
    """The ``combinations`` rows of ``presets/targets/known_broken.yaml``."""
    from omni_pd.resources import data_dir, load_data

    return list(load_data(data_dir("presets") / "targets" / "known_broken.yaml")["combinations"])


def _value(ctx: Context, n: "StageNode", key: str) -> Any:
    return ctx.parallel(n)[key] if key in PARALLEL_SIZE_KEYS else ctx.setting(n, key)


def _holds(v: Any, cond: dict[str, Any]) -> bool:
    if "eq" in cond:
        return v == cond["eq"]
    if "in" in cond:
        return v in cond["in"]
    if "gt" in cond:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and v > cond["gt"]
    raise ValueError(f"unknown condition {cond!r}")


def _sides(ctx: Context) -> list[tuple["StageNode", str]]:
    pair = ctx.pd_pair
    if pair is not None:
        return [(pair[0], "prefill"), (pair[1], "decode")]
    out = []
    for n in ctx.topology.stages if ctx.topology is not None else ():
        role = (n.kv or {}).get("kv_role")
        if role in ("kv_producer", "kv_both"):
            out.append((n, "prefill"))
        if role in ("kv_consumer", "kv_both"):
            out.append((n, "decode"))
    return out


def _v(s: Any) -> tuple[int, int]:
    from omni_pd.compile.targets import parse_version

    return parse_version(str(s))


_Y = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
      "  - {{stage_id: 0, devices: \"0,1,2,3\", data_parallel_size: 4{x}, env: {{VLLM_MOONCAKE_BOOTSTRAP_PORT: \"8998\"}}, "
      "kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_producer, engine_id: p0}}}}\n"
      "  - {{stage_id: 1, devices: \"4\", kv_transfer_config: {{kv_connector: MooncakeConnector, kv_role: kv_consumer, engine_id: d0}}}}\n")


@rule("OPD622", "known-broken-combination", Severity.ERROR,
      "a stage combines settings the target release is known to break (one row per report in presets/targets/known_broken.yaml)",
      fail=_Y.format(x=", data_parallel_multi_port_external_lb: true"), passing=_Y.format(x=""),
      example_context={"vllm_version": "0.30"}, labels=("CAP-MULTI-DP-LB",),
      examples=(
          Example("multi-port external LB with DP 1 is one engine", _Y.format(x=", data_parallel_multi_port_external_lb: true")
                  .replace("data_parallel_size: 4", "data_parallel_size: 1").replace("0,1,2,3", "0"), False,
                  {"vllm_version": "0.30"}),
          Example("on decode the bootstrap server is not started", _Y.format(x="").replace(
              "kv_role: kv_consumer, engine_id: d0}", "kv_role: kv_consumer, engine_id: d0}, data_parallel_size: 2, "
              "data_parallel_multi_port_external_lb: true").replace('devices: "4"', 'devices: "4,5"'), False,
                  {"vllm_version": "0.30"}),
      ))
def known_broken(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Each row of ``presets/targets/known_broken.yaml`` names connectors, a PD side,
    conditions on one stage's effective settings (parallel sizes as the engine reads
    them, global CLI flags included) and the releases it is broken on (``since`` up to
    ``fixed_in``, or every release from ``since`` while the fix is not released). A
    stage that matches on the target release is an error at the row's key, with the
    row's message, help and sources. A row's connectors are vLLM's classes of those names
    (``capability.loaded_rows``: a class another package's ``kv_connector_module_path`` loads
    under the name is not judged by vLLM's report). First row: vLLM's MooncakeConnector prefill with
    ``data_parallel_size`` > 1 and ``data_parallel_multi_port_external_lb`` (every DP
    engine reads one ``VLLM_MOONCAKE_BOOTSTRAP_PORT`` and registers as dp_rank 0).
    Sources: https://github.com/vllm-project/vllm/issues/51531,
    https://github.com/vllm-project/vllm/pull/51532; the rows' ``sources``."""
    ver = ctx.target.version
    for n, side in _sides(ctx):
        if not n.kv:
            continue
        names = loaded_rows(ctx, n)  # the loaded classes: a row names vLLM's connectors
        for row in table():
            if row.get("side", "any") not in ("any", side):
                continue
            hit = next((label for c, label in names if c in row["connectors"]), None)
            if hit is None or ver < _v(row["since"]) or (row.get("fixed_in") and ver >= _v(row["fixed_in"])):
                continue
            if not all(_holds(_value(ctx, n, k), cond) for k, cond in row["when"].items()):
                continue
            fields: dict[str, Any] = {**{str(k): v for k, v in (row.get("defaults") or {}).items()},
                                      **{f"env_{k}": v for k, v in n.env.items()},
                                      **{k: _value(ctx, n, k) for k in row["when"]}}
            fields.update(connector=hit, side=side, dp=ctx.parallel(n)["data_parallel_size"])
            fix = row.get("fix")
            msg = " ".join(str(row["message"]).format(**fields).split())
            yield r.diag(msg + (f" on {ctx.release_words()}" + (f"; fix pending {fix}" if fix else "")),
                         ctx.sloc(n, row["at"], value=True),
                         notes=[f"source: {s}" for s in row.get("sources") or []],
                         help=" ".join(str(row["help"]).split()))
