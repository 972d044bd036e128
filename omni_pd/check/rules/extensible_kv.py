"""OPD629 extensible-kv-cache: ``enable_extensible_kv_cache: true`` where vLLM 0.34 refuses it.

vLLM 0.34 adds the extensible KV cache (``--enable-extensible-kv-cache``; default auto). Asked
for explicitly, it raises at engine start beside ``kv_cache_memory_bytes`` or
``num_gpu_blocks_override``, on a ROCm host with a connector that registers KV memory (NIXL,
Mooncake, MoRIIO, UMBP), and with Mooncake under ``WITH_NVIDIA_PEERMEM=1``. Facts:
``presets/targets/kv_semantics.yaml`` ``extensible_kv_cache``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

from omni_pd.check.rules import Context, Example, Rule, rule
from omni_pd.check.rules._kv_release import EXTRA, facts, platform, since
from omni_pd.compile.connectors.identity import identify
from omni_pd.diagnostics import Diagnostic, Severity

if TYPE_CHECKING:
    from omni_pd.compile.topology import StageNode


def _y(p: str = "", d: str = "", c: str = "MooncakeConnector") -> str:  # pragma: no mutate block
    return ("pipeline: llm_pd\nasync_chunk: false\nstages:\n"
            f"  - {{stage_id: 0, devices: \"0\"{p}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_producer, "
            "engine_id: p0}}\n"
            f"  - {{stage_id: 1, devices: \"1\"{d}, kv_transfer_config: {{kv_connector: {c}, kv_role: kv_consumer, "
            "engine_id: d0}}\n")


_ON = ", enable_extensible_kv_cache: true"


def _setting(ctx: Context, n: "StageNode", key: str) -> Any:
    v = n.settings.get(key)
    return ctx.cli.get(key) if v is None else v


def _true(v: Any) -> bool:
    return v is True or (isinstance(v, str) and v.strip().lower() == "true")


def _loaded(kv: dict[str, Any], plat: str) -> list[str]:
    """vLLM connector names the stage loads (MultiConnector: its children), by identity."""
    ident = identify(kv, plat)
    if ident is None or not ident.is_vllm:
        return []
    if ident.name != "MultiConnector":
        return [ident.name]
    kids = (kv.get(EXTRA) or {}).get("connectors") if isinstance(kv.get(EXTRA), dict) else None
    out = []
    for c in kids if isinstance(kids, list) else []:
        ci = identify(c, plat)
        if ci is not None and ci.is_vllm:
            out.append(ci.name)
    return out


@rule("OPD629", "extensible-kv-cache", Severity.ERROR,
      "enable_extensible_kv_cache: true beside a setting or connector vLLM 0.34 refuses it with",
      fail=_y(_ON + ", kv_cache_memory_bytes: 8000000000"), passing=_y(_ON),
      example_context={"vllm_version": "0.34"},
      examples=(
          Example("ROCm with a connector that registers KV memory", _y(_ON), True,
                  {"vllm_version": "0.34", "platform": "rocm"}, contains="ROCm"),
          Example("Mooncake under WITH_NVIDIA_PEERMEM=1", _y(_ON + ", env: {WITH_NVIDIA_PEERMEM: \"1\"}"), True,
                  {"vllm_version": "0.34"}, contains="WITH_NVIDIA_PEERMEM"),
          Example("0.33 has no extensible KV cache: not judged here",
                  _y(_ON + ", kv_cache_memory_bytes: 8000000000"), False, {"vllm_version": "0.33"}),
          Example("auto (unset) with kv_cache_memory_bytes: vLLM turns it off itself",
                  _y(", kv_cache_memory_bytes: 8000000000"), False, {"vllm_version": "0.34"}),
      ))
def extensible_kv_cache(ctx: Context, r: Rule) -> Iterable[Diagnostic]:
    """vLLM 0.34 (``config/cache.py:395`` ``CacheConfig.enable_extensible_kv_cache``, default
    auto; ``config/vllm.py:3180-3268``) turns the extensible KV cache on for CUDA/ROCm unless
    ``kv_cache_memory_bytes`` or ``num_gpu_blocks_override`` is set. Requested explicitly
    (``enable_extensible_kv_cache: true``, on the stage or as a global flag) it raises
    ``ValueError`` at engine start beside ``kv_cache_memory_bytes`` or
    ``num_gpu_blocks_override``, and on a ROCm host with a connector that registers KV memory
    (NixlConnector and its Pull/Push names, MooncakeConnector, MoRIIOConnector,
    UMBPStoreConnector; MultiConnector children count); vLLM's MooncakeConnector under
    ``WITH_NVIDIA_PEERMEM=1`` raises ``RuntimeError`` (``v1/mooncake/mooncake_connector.py``).
    All errors. Releases before 0.34 have no such argument (not judged here). Connectors are
    identified with :func:`omni_pd.compile.connectors.identity.identify` (another package's
    class loaded by ``kv_connector_module_path`` is not vLLM's). A connector's
    ``custom_mem_pool`` and LMCacheMPConnector's legacy IPC, also refused by 0.34, are not
    checked. Sources: vLLM 0.34.0 wheel (``config/cache.py``,
    ``config/vllm.py``, ``v1/mooncake/mooncake_connector.py``); facts: ``presets/targets/kv_semantics.yaml``."""
    f = facts()["extensible_kv_cache"]
    if ctx.target.version < since("extensible_kv_cache") or ctx.topology is None:
        return
    key = f["key"]
    for n in ctx.topology.stages:
        if not _true(_setting(ctx, n, key)):
            continue
        loc = ctx.sloc(n, key, value=True)
        where = f"stage {n.stage_id}"
        for arg in f["conflicting_args"]:
            if _setting(ctx, n, arg) is not None:
                yield r.diag(f"{where}: enable_extensible_kv_cache: true with {arg} set: {ctx.release_words()} refuses "
                             "the pair at engine start (ValueError)", loc,
                             related=[ctx.sloc(n, arg, value=True, label=f"{arg} set here")],
                             help=f"remove enable_extensible_kv_cache (auto turns it off beside {arg}) or {arg}")
        plat = platform(ctx, n)
        loaded = _loaded(n.kv or {}, plat) if n.kv else []
        regs = [c for c in loaded if c in f["registering_connectors"]]
        if plat in f["rocm_platforms"] and regs:
            yield r.diag(f"{where}: enable_extensible_kv_cache: true on ROCm with {regs[0]}, which registers KV memory: "
                         f"{ctx.release_words()} refuses it at engine start (ValueError)", loc,
                         help="remove enable_extensible_kv_cache on ROCm (auto leaves it off there)")
        pm = f["peermem"]
        env = {**ctx.env, **{str(k): str(v) for k, v in (n.env or {}).items()}}
        hit = [c for c in loaded if c in pm["connectors"]]
        if env.get(pm["env"]) == pm["value"] and hit:
            yield r.diag(f"{where}: enable_extensible_kv_cache: true with {hit[0]} and {pm['env']}={pm['value']}: "
                         f"{ctx.release_words()}'s MooncakeConnector raises RuntimeError at engine start", loc,
                         help=f"remove enable_extensible_kv_cache or unset {pm['env']}")
