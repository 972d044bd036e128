"""What the user tells ``omni-pd validate`` about the world: inventory and model facts.

Inventory file (``--inventory FILE``, YAML)::

    hosts:
      host-a: {accelerator: cuda, count: 8, memory_gib: 80, address: 10.0.0.1}
      host-b: {accelerator: cuda, count: 8, memory_gib: 80, address: 10.0.0.2}
    placement:          # stage id -> host; `all` = every stage not listed
      all: host-a
      1: host-b         # a list ([host-b, host-c]): one instance spanning these hosts
    router:             # optional: the PD router/proxy in front of the pair
      kind: vllm-router # omni-pd | vllm-router | llm-d | dynamo | relay | none (OPD705)
      protocols: [pull, bootstrap]   # optional: what it is run to speak (default: its kind's)
      relays_kv_transfer_params: false
    allow_shared_devices: false   # true: prefill and decode may share a device

``accelerator``: cuda | rocm | npu | xpu | musa; ``generation``: e.g. A2/A3 (npu),
H100/H200/B200 (cuda), one of presets/targets/accelerator_generations.yaml (OPD314;
an unknown one is a usage error); ``count``: accelerators visible on
the host; ``memory_gib``: memory per accelerator in GiB. Without an inventory every
stage is on one host whose device count is unknown.

Model facts (``--model-info config.json``): a Hugging Face ``config.json``; omni-pd
reads ``model_type``, ``num_key_value_heads`` (also inside ``text_config`` /
``thinker_config``), MLA (``kv_lora_rank``), hybrid attention (``layer_types`` with
more than one kind) and which ``*_config`` sub-configs the checkpoint has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ACCELERATORS = ("cuda", "rocm", "npu", "xpu", "musa")

#: ``router.kind`` values (presets/targets/routers.yaml ``kinds``; rule OPD705): omni-pd's
#: router, vllm-project/router, the llm-d routing sidecar, Dynamo, a proxy that only relays
#: prefill's kv_transfer_params, or no router
ROUTER_KINDS = ("omni-pd", "vllm-router", "llm-d", "dynamo", "relay", "none")


@dataclass(frozen=True)
class Host:
    """One machine: ``count`` accelerators of ``accelerator`` kind, ``memory_gib`` each."""

    name: str
    accelerator: str | None = None
    count: int | None = None
    memory_gib: float | None = None
    address: str | None = None
    #: accelerator generation (``A2``/``A3``, ``H100``/``H200``/``B200``, ...): one of
    #: presets/targets/accelerator_generations.yaml ``generations`` for ``accelerator``
    generation: str | None = None


#: the keys of one ``hosts:`` entry (:class:`Host`'s fields but its name, and ``processes``: the
#: processes ``render``'s placement.yaml lists per host, so that file reads back as an inventory)
HOST_KEYS = ("accelerator", "count", "memory_gib", "address", "generation", "processes")


@dataclass(frozen=True)
class Inventory:
    """Hosts, stage placement (stage id -> host name) and the router, if any."""

    hosts: dict[str, Host] = field(default_factory=dict)
    placement: dict[int, str] = field(default_factory=dict)
    default_host: str | None = None
    router: dict[str, Any] | None = None
    allow_shared_devices: bool = False
    #: stage id -> the hosts one instance of it spans, node rank order (``placement: {0: [A, B]}``;
    #: vLLM's multi-node launch, ``--nnodes``/``--node-rank``); ``placement`` holds the first
    #: (node rank 0: the API server, the scheduler and every listener a peer dials)
    spans: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def host_of(self, stage_id: int) -> str:
        if stage_id in self.placement:
            return self.placement[stage_id]
        if self.default_host:
            return self.default_host
        if len(self.hosts) == 1:
            return next(iter(self.hosts))
        return "localhost"

    def host(self, name: str) -> Host | None:
        if name in self.hosts:
            return self.hosts[name]
        if name == "localhost" and len(self.hosts) == 1:
            return next(iter(self.hosts.values()))
        return None

    @classmethod
    def from_dict(cls, d: Any) -> "Inventory":
        """Build from the YAML mapping above. Raises ValueError with the bad key."""
        if not isinstance(d, dict):
            raise ValueError("inventory must be a mapping with `hosts:` and `placement:`")
        unknown = set(d) - {"hosts", "placement", "router", "allow_shared_devices"}
        if unknown:
            raise ValueError(f"unknown inventory key(s): {', '.join(sorted(map(str, unknown)))}")
        raw_hosts = _mapping(d, "hosts", "a mapping of host name -> {accelerator, count, memory_gib, address}")
        raw_placement = _mapping(d, "placement", "a mapping of stage id (or `all`) -> host name")
        router = _mapping(d, "router", "a mapping (e.g. {relays_kv_transfer_params: true})")
        kind = router.get("kind")
        if kind is not None and str(kind) not in ROUTER_KINDS:
            raise ValueError(f"router.kind must be one of {', '.join(ROUTER_KINDS)}, found {kind!r}")
        _check_router_keys(router)
        shared = d.get("allow_shared_devices", False)
        if not isinstance(shared, bool) and shared is not None:
            raise ValueError(f"allow_shared_devices must be true or false, found {shared!r}")
        hosts: dict[str, Host] = {}
        for name, h in raw_hosts.items():
            h = h or {}
            if not isinstance(h, dict):
                raise ValueError(f"hosts.{name} must be a mapping")
            stray = sorted(set(map(str, h)) - set(HOST_KEYS))
            if stray:
                from difflib import get_close_matches

                near = get_close_matches(stray[0], HOST_KEYS, n=1, cutoff=0.6)
                raise ValueError(f"hosts.{name}: unknown key `{stray[0]}`"
                                 + (f" (did you mean `{near[0]}`?)" if near else "")
                                 + f"; a host takes {', '.join(HOST_KEYS)}")
            acc = h.get("accelerator")
            if acc is not None and acc not in ACCELERATORS:
                raise ValueError(f"hosts.{name}.accelerator must be one of {', '.join(ACCELERATORS)}")
            try:
                count = int(h["count"]) if h.get("count") is not None else None
                mem = float(h["memory_gib"]) if h.get("memory_gib") is not None else None
            except (TypeError, ValueError):
                raise ValueError(f"hosts.{name}: count must be an integer, memory_gib a number") from None
            if count is not None and count < 0:
                raise ValueError(f"hosts.{name}: count must be a non-negative integer, found {count}")
            if mem is not None and not mem > 0:
                raise ValueError(f"hosts.{name}: memory_gib must be a positive number, found {mem}")
            gen = h.get("generation")
            if gen is not None:
                known = generations()
                allowed = known.get(acc, []) if acc else sorted({g for v in known.values() for g in v})
                if str(gen) not in allowed:
                    raise ValueError(f"hosts.{name}.generation {gen!r} is not a known "
                                     f"{acc + ' ' if acc else ''}generation (known: {', '.join(allowed)})")
                gen = str(gen)
            hosts[str(name)] = Host(str(name), acc, count, mem, h.get("address"), gen)
        by_address: dict[str, str] = {}
        for hname, host in hosts.items():
            if host.address is None:
                continue
            if str(host.address) in by_address:
                raise ValueError(f"hosts.{by_address[str(host.address)]} and hosts.{hname} have one address "
                                 f"{host.address}: each host needs its own (peers dial a stage by its host's "
                                 "address; two names for one machine would also share its devices and ports)")
            by_address[str(host.address)] = hname
        placement: dict[int, str] = {}
        spans: dict[int, tuple[str, ...]] = {}
        default = None
        for k, v in raw_placement.items():
            if str(k) == "all":
                if isinstance(v, list):
                    raise ValueError("placement.all must be one host name (a list spans one stage's instance over "
                                     "hosts: write it under that stage's id)")
                default = str(v)
                continue
            try:
                sid = int(k)
            except (TypeError, ValueError):
                raise ValueError(f"placement key {k!r} must be a stage id or `all`") from None
            if isinstance(v, list):
                names = tuple(str(h) for h in v)
                if not names or len(set(names)) != len(names):
                    raise ValueError(f"placement.{sid} must list distinct host names (one per node of the "
                                     f"instance), found {v!r}")
                placement[sid] = names[0]
                if len(names) > 1:
                    spans[sid] = names
            else:
                placement[sid] = str(v)
        named = list(placement.values()) + [h for hs in spans.values() for h in hs] + ([default] if default else [])
        for h in named:
            if hosts and h not in hosts:
                raise ValueError(f"placement names host {h!r}, which is not under hosts:")
        return cls(hosts=hosts, placement=placement, default_host=default,
                   router=d.get("router"), allow_shared_devices=bool(shared), spans=spans)


def generations() -> dict[str, list[str]]:
    """Accelerator kind -> known generation names (presets/targets/accelerator_generations.yaml)."""
    from omni_pd.resources import data_dir, load_data

    return {str(k): [str(g) for g in v] for k, v in
            load_data(data_dir("presets") / "targets" / "accelerator_generations.yaml")["generations"].items()}


def _mapping(d: dict[str, Any], key: str, what: str) -> dict[Any, Any]:
    """``d[key]`` as a mapping (absent or null: ``{}``). Raises ValueError naming ``key``,
    ``what`` it must be and the YAML type found, so a malformed inventory is a usage
    error (OPD006) instead of a crash in a rule that reads it."""
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        from omni_pd.io import _value_kind  # the kind words of io's own top-level message

        raise ValueError(f"{key} must be {what}, found {_value_kind(v)}")
    return v


def router_keys(kind: str | None) -> dict[str, str]:
    """Key -> what it means, for an inventory ``router:`` of ``kind`` (None: no kind said:
    the keys of every kind), from ``presets/targets/routers.yaml`` (``common_keys`` and
    ``keys``)."""
    from omni_pd.resources import data_dir, load_data

    t = load_data(data_dir("presets") / "targets" / "routers.yaml")
    out = dict(t["common_keys"])
    for k, keys in t["keys"].items():
        if kind is None or k == kind:
            out.update(keys or {})
    return out


def _check_router_keys(router: dict[str, Any]) -> None:
    """Raise ValueError naming an inventory ``router:`` key its kind does not have, with
    the nearest known key (``difflib``) or the kinds that have it. A silently ignored
    router key is a router that runs with its default (BR-59's prefill target port)."""
    import difflib

    if not router:
        return
    kind = str(router["kind"]) if router.get("kind") is not None else None
    known = router_keys(kind)
    every = router_keys(None)
    for key in router:
        if str(key) in known:
            continue
        where = f"router (kind {kind})" if kind else "router"
        near = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
        if str(key) in every:  # another kind's key: the kind is what is wrong, or the key
            from omni_pd.resources import data_dir, load_data

            kinds = [k for k, ks in load_data(data_dir("presets") / "targets" / "routers.yaml")["keys"].items()
                     if str(key) in (ks or {})]
            hint = f"; it is a key of router kind {', '.join(kinds)}"
        elif near:
            hint = f"; did you mean `{near[0]}`?"
        else:
            hint = ""
        raise ValueError(f"unknown key `{key}` under {where}{hint} (known: {', '.join(sorted(known))})")


@dataclass(frozen=True)
class ModelInfo:
    """Facts about the served checkpoint that PD checks need."""

    model_type: str | None = None
    num_kv_heads: int | None = None
    attention: str | None = None  # "MLA" | "hybrid" | "GQA" | None (unknown)
    subconfigs: frozenset[str] | None = None  # e.g. {"thinker_config"}; None = unknown
    #: has a vision or audio encoder (``vision_config``/``audio_config``, also under
    #: ``thinker_config``); None = unknown (encoder-split rule OPD619)
    multimodal: bool | None = None
    #: the checkpoint's weight dtype (``torch_dtype``, or ``dtype`` in newer config.json
    #: files), e.g. "bfloat16"; None = unknown (OPD313 resolves ``dtype: auto`` with it)
    torch_dtype: str | None = None
    #: ``quantization_config.quant_method`` (e.g. "fp8", "compressed-tensors"); "" = the
    #: config.json has no quantization_config; None = unknown (OPD313)
    quant_method: str | None = None
    #: per-layer kinds the config lists (``layer_types``, ``layers_block_type``,
    #: ``hybrid_override_pattern`` M/* as mamba2/attention), top level and nested text
    #: configs; None = no per-layer list (OPD621 reads state layers from it)
    layer_kinds: frozenset[str] | None = None
    #: every ``model_type`` of the config and its text sub-configs (``qwen3_5_moe``,
    #: ``qwen3_5_moe_text``); None = unknown
    model_types: frozenset[str] | None = None
    #: ``max_position_embeddings`` (top level or text config), the context length vLLM
    #: takes as ``max_model_len`` when a stage sets none; None = unknown, or a
    #: ``rope_scaling`` factor changes it (vLLM ``get_max_model_len`` scales it: OPD316
    #: does not guess)
    max_position_embeddings: int | None = None
    #: the sparse-attention kind (``sparse_attention_config.type``, e.g. ``msa``), or the
    #: model type that implies it (``minimax_m3`` -> ``msa``); None = dense / unknown (OPD603)
    sparse_attention: str | None = None

    @property
    def is_mla(self) -> bool:
        return (self.attention or "").upper() == "MLA"

    @property
    def is_hybrid(self) -> bool:
        return (self.attention or "").lower() == "hybrid"

    @classmethod
    def from_model_dir(cls, model: str) -> "ModelInfo | None":
        """The facts of ``model`` when it is a local checkpoint directory with a readable
        ``config.json`` (what ``vllm serve DIR`` loads), else None (a hub id, a file, a
        config that is not JSON or not a mapping: nothing is known). Reads the file."""
        import json
        from pathlib import Path

        path = Path(model) / "config.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
            return cls.from_config_json(data) if isinstance(data, dict) else None
        except (OSError, ValueError, TypeError):
            return None

    @classmethod
    def from_config_json(cls, d: dict[str, Any]) -> "ModelInfo":
        """Read a Hugging Face config.json mapping (multimodal sub-configs included)."""
        subs = frozenset(k for k, v in d.items() if k.endswith("_config") and isinstance(v, dict)
                         and k not in ("quantization_config", "rope_scaling", "text_config",
                                       "vision_config", "audio_config"))
        cands = [d, d.get("text_config") or {}]
        th = d.get("thinker_config") or {}
        cands += [th, th.get("text_config") or {}]
        heads = None
        attention = None
        for c in cands:
            if not isinstance(c, dict):
                continue
            if heads is None and c.get("num_key_value_heads") is not None:
                heads = int(c["num_key_value_heads"])
            if c.get("kv_lora_rank"):
                attention = "MLA"
            lt = c.get("layer_types")
            if attention is None and isinstance(lt, list) and len(set(lt)) > 1:
                attention = "hybrid"
        if attention is None and heads is not None:
            attention = "GQA"
        mm = any(isinstance(c, dict) and (isinstance(c.get("vision_config"), dict) or isinstance(c.get("audio_config"), dict))
                 for c in (d, th))
        # a fragment without model_type may just omit the encoders: unknown, not "text-only"
        multimodal = True if mm else (False if d.get("model_type") else None)
        kinds: set[str] = set()
        for c in cands:
            if not isinstance(c, dict):
                continue
            for key in ("layer_types", "layers_block_type"):
                if isinstance(c.get(key), list):
                    kinds |= {str(x) for x in c[key]}
            pat = c.get("hybrid_override_pattern")
            if isinstance(pat, str):
                kinds |= {{"M": "mamba2", "*": "attention"}[ch] for ch in pat if ch in "M*"}
        mtypes = frozenset(str(c["model_type"]) for c in cands if isinstance(c, dict) and c.get("model_type"))
        tdt = next((str(c.get("torch_dtype") or c.get("dtype")) for c in cands
                    if isinstance(c, dict) and isinstance(c.get("torch_dtype") or c.get("dtype"), str)), None)
        qc = next((c["quantization_config"] for c in cands if isinstance(c, dict)
                   and isinstance(c.get("quantization_config"), dict)), None)
        quant = str(qc.get("quant_method") or "") or None if qc is not None else ("" if d.get("model_type") else None)
        mpe = None
        for c in cands:
            if isinstance(c, dict) and isinstance(c.get("max_position_embeddings"), int):
                rs = c.get("rope_scaling")
                scaled = isinstance(rs, dict) and rs.get("factor") not in (None, 1, 1.0)
                mpe = None if scaled else int(c["max_position_embeddings"])
                break
        sparse = None
        for c in cands:
            sc = c.get("sparse_attention_config") if isinstance(c, dict) else None
            if isinstance(sc, dict) and sc.get("type"):
                sparse = str(sc["type"]).lower()
                break
        if sparse is None and "minimax_m3" in mtypes:
            sparse = "msa"  # MiniMax-M3's block-sparse attention (vllm#46204)
        return cls(model_type=d.get("model_type"), num_kv_heads=heads, attention=attention,
                   subconfigs=subs or None, multimodal=multimodal, torch_dtype=tdt, quant_method=quant,
                   layer_kinds=frozenset(kinds) or None, model_types=mtypes or None,
                   max_position_embeddings=mpe, sparse_attention=sparse)
