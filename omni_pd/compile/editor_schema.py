"""The editor schema: pydantic's JSON Schema of a deploy YAML, tightened with omni-pd's facts.

``DeployConfig.model_json_schema()`` (omni_pd/compile/model.py) knows the field types
only: every model keeps unknown keys (``extra="allow"``: engine arguments pass through),
so its schema says ``additionalProperties: true`` everywhere and a free string for
``kv_role`` and ``kv_connector``. :func:`tighten` adds what an editor (yaml-language-server,
check-jsonschema) can check without running omni-pd, for one vLLM target:

* enums: ``kv_role`` (vLLM ``KVRole``), ``kv_connector`` (the target's connector registry
  plus vllm-ascend's names, unless ``kv_connector_module_path`` loads an out-of-tree one),
  ``ec_role``, and the platform names under ``platforms:``;
* ranges: ports 1..65535 (``kv_port``, ``ec_port``, ``*_port`` connector options,
  ``*_PORT`` env vars; an int or a digit string, as KVTransferConfig coerces and
  ``VLLM_*_PORT`` env values are written), ``gpu_memory_utilization`` in (0, 1],
  ``max_num_seqs``/``max_num_batched_tokens`` >= 1, ``max_model_len`` >= -1;
* unknown keys refused where the runtime or omni-pd refuses them: the top level of the
  file (vllm-omni reads its own fields only and drops the rest; ``validate`` reports each
  such key, OPD103; ``x-`` keys are extensions and stay allowed) and
  ``kv_transfer_config`` from vLLM 0.18 (``@config`` sets ``extra="forbid"``; OPD609).
  Stage entries, platform overlays, ``engine_args``, ``parallel_config`` and every
  connector option block stay open: they forward engine arguments verbatim.

The constraints live here, not on the pydantic fields, so parsing (and the located
diagnostics ``validate`` gives for a bad value) is unchanged. A pure function of the
schema dict and the target's facts; the published ``schemas/omni-pd-deploy.schema.json``
is its output for the default target.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from omni_pd.compile import ascend
from omni_pd.compile.devices import PLATFORMS
from omni_pd.compile.ec_connectors.base import ec_facts, zero_port_envs
from omni_pd.compile.targets import Target
from omni_pd.compile.tp_pairs import ASCEND_CONNECTORS


#: vLLM ``vllm/config/kv_transfer.py``: ``KVRole = Literal[KVProducer, KVConsumer]`` with
#: ``KVProducer = Literal["kv_producer", "kv_both"]``, ``KVConsumer = Literal["kv_consumer",
#: "kv_both"]``; ``KVTransferConfig.__post_init__`` raises "Unsupported kv_role" otherwise.
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")

#: one port 1..65535 written as digits (leading zeros and surrounding blanks allowed, as
#: ``int(str(v).strip())`` reads it in omni_pd/check/rules/ports.py OPD504)
_PORT = r"0*(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
PORT_STRING = rf"^\s*{_PORT}\s*$"
#: one port per rank, comma-separated (LMCache's per-rank port lists in the environment)
PORT_LIST_STRING = rf"^\s*{_PORT}(?:\s*,\s*{_PORT})*\s*$"

_SRC_PORT = ("1..65535, the operating system's port range; an int or a digit string (vLLM "
             "vllm/config/kv_transfer.py KVTransferConfig.kv_port: int, validated in lax mode; "
             "omni-pd OPD504)")


def port_schema(*, lists: bool = False, nullable: bool = False) -> dict[str, Any]:
    """A port value: an integer 1..65535 or a string of one (``lists``: also a
    comma-separated string of ports, or an array of them: per-rank port lists).
    ``nullable``: null allowed (an unset pydantic field)."""
    s: dict[str, Any] = {"type": ["integer", "string"] + (["null"] if nullable else []),
                         "minimum": 1, "maximum": 65535,
                         "pattern": PORT_LIST_STRING if lists else PORT_STRING}
    if lists:
        s["type"].append("array")
        s["items"] = port_schema()
    return s


def connector_names(target: Target) -> list[str]:
    """The ``kv_connector`` names ``validate`` accepts for ``target`` (OPD601): the names
    vLLM's ``KVConnectorFactory`` registers in that release (presets/targets/vllm.yaml
    ``kv_connectors``) and vllm-ascend's (accepted on npu; the schema cannot know the
    platform a base stage runs on). Sorted."""
    return sorted(target.connectors() | ASCEND_CONNECTORS | ascend.registered())


def _describe(s: dict[str, Any], old: dict[str, Any], source: str) -> dict[str, Any]:
    """``s`` with the title/default of the pydantic property ``old`` kept and its
    description extended by the upstream ``source`` of the constraint."""
    for k in ("title", "default"):
        if k in old:
            s[k] = old[k]
    s["description"] = (old["description"] + "; " if old.get("description") else "") + source
    return s


def _object_branch(prop: dict[str, Any]) -> dict[str, Any]:
    """The object schema of a mapping property (``X | None`` after :func:`flatten_nullable`)."""
    for alt in prop.get("anyOf", [prop]):
        if "object" in (alt.get("type") if isinstance(alt.get("type"), list) else [alt.get("type")]):
            return alt
    raise KeyError("no object branch")


_NULL = {"type": "null"}
_KEEP = ("title", "default", "description")


def _nullable_pair(node: Any) -> dict[str, Any] | None:
    """The non-null alternative of pydantic's ``X | None`` (``anyOf: [X, {type: null}]``), or None."""
    alts = node.get("anyOf") if isinstance(node, dict) else None
    if isinstance(alts, list) and len(alts) == 2 and _NULL in alts:
        return alts[0] if alts[1] == _NULL else alts[1]
    return None


def flatten_nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (changed in place and returned) with pydantic's ``anyOf: [X, {type: null}]``
    written as one schema: ``X`` with ``null`` added to its ``type`` (or ``enum``), and a
    ``$ref`` to a definition that is only ever referenced that way as the bare ``$ref``
    with ``null`` added to the definition's ``type``. A JSON Schema validator reports a
    failed ``anyOf`` at the key that holds it ("is not valid under any of the given
    schemas"); one schema gets each error at the key that is wrong
    (``$.stages[0].kv_transfer_config.kv_role: 'producer' is not one of ...``). Accepts
    the same documents."""
    refs: dict[str, list[bool]] = {}

    def count(node: Any, nullable: bool = False) -> None:
        if isinstance(node, dict):
            if "$ref" in node:
                refs.setdefault(node["$ref"], []).append(nullable)
            alt = _nullable_pair(node)
            for k, v in node.items():
                if k == "anyOf" and alt is not None:
                    count(alt, True)
                else:
                    count(v)
        elif isinstance(node, list):
            for v in node:
                count(v)

    count(schema)
    only_nullable = {r for r, uses in refs.items() if all(uses)}

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        node = {k: walk(v) for k, v in node.items()}
        alt = _nullable_pair(node)
        if alt is None:
            return node
        keep = {k: node[k] for k in _KEEP if k in node}
        if set(alt) == {"$ref"} and alt["$ref"] in only_nullable:
            return {**alt, **keep}
        if isinstance(alt.get("type"), str) and "$ref" not in alt and "anyOf" not in alt:
            out = {**alt, "type": [alt["type"], "null"], **keep}
            if "enum" in out:
                out["enum"] = [*out["enum"], None]
            return out
        return node

    out = walk(schema)
    for ref in only_nullable:
        d = out["$defs"][ref.rsplit("/", 1)[1]]
        d["type"] = [d["type"], "null"]
    schema.clear()
    schema.update(out)
    return schema


def _stage(d: dict[str, Any], target: Target) -> None:
    """Ranges of a stage entry's engine sizes (``StageDeploy``, ``StageOverlay``) and its env ports."""
    p = d["properties"]
    p["gpu_memory_utilization"] = _describe(
        {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1}, p["gpu_memory_utilization"],
        "a fraction in (0, 1] (vLLM vllm/config/cache.py CacheConfig.gpu_memory_utilization: Field(gt=0, le=1))")
    for name, src in (("max_num_seqs", "SchedulerConfig.max_num_seqs"),
                      ("max_num_batched_tokens", "SchedulerConfig.max_num_batched_tokens")):
        p[name] = _describe({"type": ["integer", "null"], "minimum": 1}, p[name],
                            f">= 1 (vLLM vllm/config/scheduler.py {src}: Field(ge=1))")
    p["max_model_len"] = _describe(
        {"type": ["integer", "null"], "minimum": -1}, p["max_model_len"],
        ">= -1, -1: fit to memory (vLLM vllm/config/model.py ModelConfig.max_model_len: Field(ge=-1))")
    _env(p["env"], target)


def stage_key_names(target: Target) -> frozenset[str] | None:
    """The keys an LLM stage entry (vllm-omni ``LLM_AR``/``LLM_GENERATION``; plain vLLM
    engines) may carry for ``target``, when omni-pd has them for that release (None: stage
    keys stay open): vllm-omni's StageDeployConfig fields and the engine arguments it can
    place (``presets/targets/vllm_omni_stage_keys.yaml``, from vllm-omni 0.30.0; any other
    key raises "no structured config owner": omni-pd OPD111/OPD103), and every ``vllm
    serve`` flag of that vLLM release as a key (``serve_flags.yaml``: what a plain-vLLM
    stage's keys become, ``--max-model-len`` -> ``max_model_len``)."""
    from omni_pd.resources import data_dir, load_data

    keys = load_data(data_dir("presets") / "targets" / "vllm_omni_stage_keys.yaml")
    if str(keys["vllm_omni"]) != target.label:
        return None
    flags = load_data(data_dir("presets") / "targets" / "serve_flags.yaml")["releases"].get(target.label) or {}
    names = {f[2:].replace("-", "_") for f in flags.get("serve", []) if f.startswith("--")}
    names |= {n[3:] for n in names if n.startswith("no_")}
    return frozenset(keys["deploy"]) | frozenset(keys["owned"]) | frozenset(names)


def _catalogued_stage_keys(s: dict[str, Any], defs: dict[str, Any], target: Target) -> None:
    """A file whose ``pipeline:`` names a catalogued pipeline (every one runs LLM stages:
    the omni Thinker/Talker/Code2Wav, plain LLMs, their PD and encoder splits) gets its
    stage entries (and its overlays' entries) closed to :func:`stage_key_names`: a
    misspelt key (``gpu_memory_utilisation``) is an editor error where vllm-omni refuses to
    start (OPD103/OPD111). Files that name no pipeline, or another one, stay open: a
    diffusion stage has other keys (``model_config``, ``engine_backend``), and the schema
    cannot tell a stage's kind otherwise."""
    from omni_pd.compile.pipelines import load_catalogue

    known = stage_key_names(target)
    if known is None:
        return
    names = sorted(known | set(defs["StageDeploy"]["properties"]) | set(defs["StageOverlay"]["properties"]))
    closed = {"properties": {k: True for k in names}, "patternProperties": {"^x-": True},
              "additionalProperties": False}
    s["allOf"] = [*s.get("allOf", []), {
        "if": {"required": ["pipeline"], "properties": {"pipeline": {"enum": sorted(load_catalogue().names())}}},
        "then": {"properties": {
            "stages": {"items": closed},
            "platforms": {"additionalProperties": {"properties": {"stages": {"items": closed}}}}}},
        "description": f"stage keys of a catalogued pipeline: vllm-omni {target.label}'s stage fields, the engine "
                       "arguments it places, or `vllm serve` flags as keys (omni-pd OPD103/OPD111)"}]


def _env(prop: dict[str, Any], target: Target) -> None:
    """``*_PORT`` variables of an ``env:`` mapping hold ports (VLLM_NIXL_SIDE_CHANNEL_PORT,
    VLLM_MOONCAKE_BOOTSTRAP_PORT, ...; omni-pd OPD504); other variables stay free. A variable
    ``target`` reads as "0: the OS picks a free port" (ECCPUConnector's
    ``VLLM_EC_SIDE_CHANNEL_PORT`` from vLLM 0.34: omni_pd/compile/ec_connectors/base.py
    ``zero_port_envs``) also takes 0, and the ``*_PORT`` pattern leaves it out (JSON Schema
    applies every matching pattern and property)."""
    zero = sorted(zero_port_envs(target.version))
    branch = _object_branch(prop)
    if not zero:
        branch["patternProperties"] = {"_PORT$": port_schema(lists=True)}
        return
    names = "|".join(re.escape(z) for z in zero)
    branch["patternProperties"] = {rf"^(?!(?:{names})$).*_PORT$": port_schema(lists=True)}
    branch.setdefault("properties", {}).update({z: {
        "type": ["integer", "string"], "minimum": 0, "maximum": 65535, "pattern": rf"^\s*(?:0+|{_PORT})\s*$",
        "description": "0 (the OS picks a free port; the release's default) or a port 1..65535 (vLLM 0.34 "
                       "vllm/envs.py, omni-pd OPD504)"} for z in zero})


def _kv(d: dict[str, Any], target: Target) -> None:
    """``KVTransferConfig``: role and connector enums, ports, and from vLLM 0.18 no unknown key."""
    p = d["properties"]
    p["kv_role"] = _describe({"enum": [*KV_ROLES, None]}, p["kv_role"],
                             "vLLM vllm/config/kv_transfer.py KVRole (omni-pd OPD302)")
    p["kv_port"] = _describe(port_schema(nullable=True), p["kv_port"], _SRC_PORT)
    _object_branch(p["kv_connector_extra_config"])["patternProperties"] = {"_port$": port_schema(lists=True)}
    if target.version >= (0, 11):  # registry facts start at 0.11 (presets/targets/vllm.yaml)
        d["if"] = {"required": ["kv_connector_module_path"],
                   "properties": {"kv_connector_module_path": {"type": "string", "minLength": 1}}}
        d["else"] = {"properties": {"kv_connector": {
            "enum": [*connector_names(target), None],
            "description": f"registered in vLLM {target.label}'s KVConnectorFactory "
                           "(vllm/distributed/kv_transfer/kv_connector/factory.py) or vllm-ascend's; "
                           "any name with kv_connector_module_path (omni-pd OPD601)"}}}
    if target.rejects_unknown_kv_keys:
        allowed = target.kv_fields()
        for k in [k for k in p if k not in allowed]:
            del p[k]
        d["additionalProperties"] = False
        d["description"] += (f" From vLLM 0.18 an unknown key is a hard error (vllm/config/utils.py config: "
                             f"extra=\"forbid\"); the keys vLLM {target.label} accepts (omni-pd OPD609).")


def _ec(d: dict[str, Any]) -> None:
    """``ECTransferConfig``: the role enum and the port range."""
    p = d["properties"]
    p["ec_role"] = _describe({"enum": [*ec_facts()["ec_roles"], None]}, p["ec_role"],
                             "vLLM vllm/config/ec_transfer.py ECTransferConfig.ec_role (omni-pd OPD614)")
    p["ec_port"] = _describe(port_schema(nullable=True), p["ec_port"], _SRC_PORT)


def _connectors(s: dict[str, Any]) -> None:
    """Top-level ``connectors:`` of a ``base_config`` overlay may leave out ``name``: vllm-omni
    0.30.0 merges each entry into the base file's entry of the same key
    (config/stage_config.py ``resolve_deploy_yaml``, ``_merge_connectors``), as its own
    ``qwen3_tts_high_concurrency_mrv2.yaml`` does; without ``base_config`` it is required."""
    spec = copy.deepcopy(s["$defs"]["ConnectorSpec"])
    spec.pop("required", None)
    spec["description"] += " In a base_config overlay `name` may come from the base file's entry of the same key."
    s["$defs"]["ConnectorOverlay"] = spec
    s["properties"]["connectors"]["additionalProperties"] = {"$ref": "#/$defs/ConnectorOverlay"}
    s["if"] = {"required": ["base_config"]}
    s["else"] = {"properties": {"connectors": {"additionalProperties": {"required": ["name"]}}}}


def tighten(schema: dict[str, Any], target: Target) -> dict[str, Any]:
    """The editor schema: a copy of pydantic's ``schema`` (``DeployConfig.model_json_schema
    (by_alias=True)``, draft 2020-12 with ``$defs``) with the enums, ranges and closed
    levels listed in this module's docstring for vLLM ``target``. Raises KeyError when
    ``schema`` lacks a definition this function constrains (the model changed shape)."""
    s = flatten_nullable(copy.deepcopy(schema))
    defs = s["$defs"]
    for name in ("StageDeploy", "StageOverlay"):
        _stage(defs[name], target)
    _env(defs["Runtime"]["properties"]["env"], target)
    _kv(defs["KVTransferConfig"], target)
    _ec(defs["ECTransferConfig"])
    _object_branch(s["properties"]["platforms"])["propertyNames"] = {
        "enum": list(PLATFORMS),
        "description": "vllm-omni applies the overlay of the platform it runs on only (vllm-omni 0.30.0 "
                       "config/stage_config.py _apply_platform_overrides; omni-pd OPD103)"}
    _connectors(s)
    _catalogued_stage_keys(s, defs, target)
    s["additionalProperties"] = False
    s["patternProperties"] = {"^x-": {"description": "extension keys (case harnesses, tools): omni-pd skips them"}}
    s["description"] += (" vllm-omni 0.30.0 reads only these top-level keys (config/stage_config.py "
                         "load_deploy_config) and drops any other silently; omni-pd reports it (OPD103).")
    return s
