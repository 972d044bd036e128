"""OPD314 pd-accelerator-generation: prefill and decode on accelerator generations the platform cannot pair.

An inventory host may name its accelerator ``generation`` (A2/A3, H100/H200/B200, ...;
presets/targets/accelerator_generations.yaml ``generations``). A PD pair across two
generations is refused where a row of that table's ``refused_pairs`` says the connector
or platform does not support it, with the row's source. First row: vllm-ascend does not
support prefill on A2 with decode on A3 (or the reverse).

PASS (both hosts A3)::

    hosts: {p: {accelerator: npu, generation: A3}, d: {accelerator: npu, generation: A3}}

FAIL::

    hosts: {p: {accelerator: npu, generation: A2}, d: {accelerator: npu, generation: A3}}
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterable

from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules.capability import connector_row
from omni_pd.diagnostics import Diagnostic, Severity


@lru_cache(maxsize=1)
def refused_pairs() -> list[dict[str, Any]]:
    """The ``refused_pairs`` rows of presets/targets/accelerator_generations.yaml."""
    from omni_pd.resources import data_dir, load_data

    return list(load_data(data_dir("presets") / "targets" / "accelerator_generations.yaml")["refused_pairs"])


def _inv(pg: str, dg: str, acc: str = "npu") -> dict[str, Any]:
    return {"inventory": {"hosts": {"host-p": {"accelerator": acc, "generation": pg, "address": "10.0.0.1"},
                                    "host-d": {"accelerator": acc, "generation": dg, "address": "10.0.0.2"}},
                          "placement": {0: "host-p", 1: "host-d"}}}


_Y = ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
      "  - {stage_id: 0, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeConnectorV1, kv_role: kv_producer, "
      "kv_port: 36000, engine_id: p, kv_connector_extra_config: {prefill: {dp_size: 1, tp_size: 1}, decode: {dp_size: 1, tp_size: 1}}}}\n"
      "  - {stage_id: 1, devices: \"0\", kv_transfer_config: {kv_connector: MooncakeConnectorV1, kv_role: kv_consumer, "
      "kv_port: 36100, engine_id: d, kv_connector_extra_config: {prefill: {dp_size: 1, tp_size: 1}, decode: {dp_size: 1, tp_size: 1}}}}\n")


@rule("OPD314", "pd-accelerator-generation", Severity.ERROR,
      "prefill and decode run on accelerator generations the platform or connector cannot pair (A2 with A3)",
      fail=_Y, passing=_Y, example_context={"platform": "npu", **_inv("A2", "A3")},
      pass_context={"platform": "npu", **_inv("A3", "A3")},
      examples=(
          Example("decode on A2, prefill on A3: refused both ways", _Y, True, {"platform": "npu", **_inv("A3", "A2")},
                  contains="prefill on A3, decode on A2"),
          Example("H100 prefill with H200 decode: no row refuses it", _Y.replace("MooncakeConnectorV1", "NixlConnector"),
                  False, _inv("H100", "H200", "cuda")),
      ))
def pd_generation(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """Reads each side's host ``generation`` (inventory) and the rows of
    presets/targets/accelerator_generations.yaml ``refused_pairs`` (platform, connectors,
    prefill and decode generations, symmetric; a row's connectors are vllm-ascend's registered
    classes, matched by the loaded connector's row name (``connector_row``), so an out-of-tree
    class of the same name is not judged by it); a PD pair that matches a row is an error
    at decode's stage with prefill as related location and the row's source as a note.
    Without an inventory, or a host without a generation, nothing is reported. Source:
    vllm-ascend docs/source/developer_guide/feature_guide/disaggregated_prefill.md
    (Limitations: P on A2 with D on A3 is not supported)."""
    pair = ctx.pd_pair
    if pair is None or ctx.inventory is None:
        return
    p, d = pair
    hp, hd = ctx.inventory.host(ctx.host_of(p)), ctx.inventory.host(ctx.host_of(d))
    if hp is None or hd is None or not hp.generation or not hd.generation:
        return
    name = connector_row(ctx, p)  # the loaded class's row: rows name vllm-ascend's registered classes
    for row in refused_pairs():
        plat = row["platform"]
        if not ({hp.accelerator, hd.accelerator} == {plat} or (ctx.platform == plat and not (hp.accelerator or hd.accelerator))):
            continue
        if row["connectors"] != "any" and name not in row["connectors"]:
            continue
        gens = (hp.generation, hd.generation)
        if gens != (row["prefill"], row["decode"]) and not (row.get("symmetric") and gens == (row["decode"], row["prefill"])):
            continue
        yield r.diag(" ".join(str(row["message"]).format(prefill=hp.generation, decode=hd.generation).split())
                     + f": prefill (stage {p.stage_id}) on {hp.name}, decode (stage {d.stage_id}) on {hd.name}",
                     ctx.sloc(d, label=f"decode on {hd.generation}"),
                     related=[ctx.sloc(p, label=f"prefill on {hp.generation}")],
                     notes=[f"source: {s}" for s in row.get("sources") or []], help=str(row["help"]))
