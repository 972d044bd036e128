"""Every shared/cases/BR-*.yaml through `omni-pd validate` with its x- context.

The harness strips the ``x-`` keys, turns ``x-host``/``x-placement`` (and ``x-proxy``)
into an inventory, ``x-model`` into model facts, ``x-env`` into the launcher
environment, ``x-cli`` into global CLI flags and ``x-runtime.vllm`` into
``--vllm-version``, then asserts each ``x-expect`` entry's rule and severity through
one table (CASE_RULES). ``x-variant``/``x-fix`` blocks with ``stages`` are merged into
the case by stage_id and checked too. ``rewrite`` verdicts run ``expand``.
Skipped as a whole when the shared folder is absent (a clean clone).
"""

from __future__ import annotations

import copy
import io
from pathlib import Path
from typing import Any

import pytest

from omni_pd.check.context import Inventory, ModelInfo
from omni_pd.diagnostics import OmniPdError, Severity
from omni_pd.check.validate import ValidateOptions, validate_text

CASES_DIR = Path(__file__).resolve().parents[2] / "shared" / "cases"
#: omni-pd's own cases from public reports (same format, ids TC-NN), always present
OWN_CASES_DIR = Path(__file__).resolve().parent / "cases"
needs_shared = pytest.mark.skipif(not CASES_DIR.is_dir(),
                                  reason="../shared/cases (the case catalogue beside the checkout) is absent")

#: Case-catalogue rule name -> omni-pd code(s) (None: not expressible yet; see XFAIL).
#: A tuple when one label is implemented by more than one code: an expectation is met
#: by any of them.
CASE_RULES: dict[str, str | tuple[str, ...] | None] = {
    "SCH-INPUT-SRC": "OPD201",
    "SCH-LEGACY": "OPD102",
    "SCH-ENV-NAME": "OPD105",
    "SCH-CLI-SCOPE": ("OPD106", "OPD107"),
    "SCH-UNKNOWN-KEY": ("OPD103", "OPD615"),
    "SCH-REQ-KVCFG": "OPD301",
    "SCH-KVROLE": "OPD302",
    "SCH-EXTRA-REQUIRED": "OPD608",
    "SCH-TYPES": "OPD104",
    "XS-STAGESET": "OPD206",
    "XS-PEER-TOPO": ("OPD311", "OPD312"),
    "XS-BLOCK": "OPD607",
    "XS-DTYPE": "OPD605",
    "XS-CONNECTOR-SYM": "OPD304",
    "XS-SHARED-FIELDS": None,
    "DEV-EXISTS": "OPD402",
    "DEV-WORLD": "OPD401",
    "DEV-MAP": "OPD402",
    "DEV-MEM-SUM": "OPD404",
    "DEV-SHARED": "OPD403",
    "DEV-OVERLAY": "OPD402",
    "PORT-UNIQUE": "OPD501",
    "PORT-RANGE": ("OPD501", "OPD506"),
    "PORT-HOST": "OPD503",
    "PORT-BOOTSTRAP-AGREE": "OPD502",
    "CAP-REGISTRY": "OPD601",
    "CAP-MULTI": "OPD602",
    "CAP-HETERO-TP": "OPD603",
    "CAP-MLA": "OPD604",
    "CAP-DTYPE": "OPD606",
    "RT-PREFILL-SAMPLING": "OPD701",
    "RT-PROXY-PARAMS": ("OPD702", "OPD705"),
    "RT-VERIFY-TRANSFER": "OPD703",
    "ID-ENGINE-UNIQUE": "OPD309",
    "CAP-PP": "OPD612",
    "CAP-LMCACHE-PD": "OPD613",
    "RT-TALKER-PD": "OPD704",
    "CAP-EC-REGISTRY": "OPD614",
    "SCH-PARALLEL-CONFLICT": "OPD112",
    # issue 22 (BR-45..BR-54): labels with no omni-pd rule yet; XFAIL says what each waits for
    "XS-MODEL-IDENTITY": "OPD313",
    "CAP-HYBRID-SSM": "OPD621",
    "CAP-MULTI-DP-LB": "OPD622",
    # issue 35 (BR-55..BR-65); CAP-PREFIX-CACHE-HYBRID has no rule yet (no case uses it)
    "XS-SPEC-SYM": "OPD315",
    "XS-MAXLEN": "OPD316",
    "RT-ROUTER-TARGET": "OPD706",
    "RT-ROUTER-POLICY": "OPD707",
    "DEV-INIT-OVERLAP": "OPD405",
    "CAP-SPEC-DRAFT-KV": "OPD624",
    "CAP-PREFIX-CACHE-HYBRID": None,
    "CAP-DCP": "OPD625",
}

def codes_of(label: str) -> tuple[str, ...]:
    """The omni-pd codes that implement case label ``label`` (empty: none yet)."""
    c = CASE_RULES[label]
    return () if c is None else (c,) if isinstance(c, str) else tuple(c)


VERDICT_SEVERITY = {"error": Severity.ERROR, "warn": Severity.WARNING, "info": Severity.INFO}

#: Cases (or variants) omni-pd cannot express yet, with the reason.
XFAIL = {
    ("BR-31", "main"): "x-connector-files (per-host Mooncake V0 config files) are not part of omni-pd's model; "
                       "XS-SHARED-FIELDS needs a connector-file input (e.g. --connector-file HOST=PATH)",
    ("BR-31", "variant"): "4 instances sharing one Mooncake file: instance counts and connector files are not modelled",
    ("BR-32", "main"): "rewrite verdict: the input is already a PD config, which `omni-pd expand` refuses (OPD803); "
                       "the prefill-leg sampling rewrite is the orchestrator's, validate warns instead (OPD701, "
                       "see test_br32_prefill_sampling_is_flagged)",
}

#: Cases whose report names its release but whose file has no ``x-runtime``: the release the
#: harness targets for them, with where the case says so. A legacy ``stage_args`` file is an
#: OPD102 warning before vllm-omni 0.28 (``--stage-configs-path`` still loads it) and an error
#: from 0.28 on (the deploy loader refuses it), so the report's release decides the verdict.
REPORT_RELEASE = {
    "BR-01": "0.26",  # x-source dynamo#12709: vllm-omni v0.26.0rc1; x-format: "still accepted via --stage-configs-path"
    # vllm#45330 (decode TP 16 > 8 KV heads fails NIXL's handshake) was fixed by vllm#45879 (merged
    # 2026-06-17, first release assumed 0.25: presets/targets/hetero_tp.yaml); the report ran a release
    # before the fix, 0.23 assumed (the newest omni-pd pins as lacking it). On 0.30 the pair is valid (BR-61's variant).
    "BR-23": "0.23",
}

#: model ids in the cases -> the model_type their config.json declares
MODEL_TYPES = {"Qwen/Qwen3-Omni-30B-A3B-Thinking": "qwen3_omni_moe", "Qwen/Qwen2.5-Omni-3B": "qwen2_5_omni"}


def _yaml():
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.width = 4096
    return y


def _load(path: Path) -> Any:
    return _yaml().load(path.read_text(encoding="utf-8"))


def _plain(node: Any) -> Any:
    from omni_pd.compile.parse import to_plain

    return to_plain(node)


def _strip_x(node: Any) -> Any:
    """Remove every ``x-`` key, in place (round-trip tree)."""
    if isinstance(node, dict):
        for k in [k for k in node if isinstance(k, str) and k.startswith("x-")]:
            del node[k]
        for v in node.values():
            _strip_x(v)
    elif isinstance(node, list):
        for v in node:
            _strip_x(v)
    return node


def context_of(tree: dict) -> ValidateOptions:
    """ValidateOptions from a case's x- keys (before stripping)."""
    hosts: dict[str, dict] = {}
    placement: dict[Any, str] = {}
    top_host = tree.get("x-host")
    pl = tree.get("x-placement") or {}
    default = pl.get("all") if isinstance(pl, dict) else None
    if isinstance(top_host, dict):
        name = default or "host-a"
        hosts[name] = {"accelerator": top_host.get("accel"), "count": top_host.get("count"),
                       "memory_gib": top_host.get("hbm_gib")}
    for st in tree.get("stages") or []:
        if isinstance(st, dict) and isinstance(st.get("x-host"), str):
            placement[int(st["stage_id"])] = st["x-host"]
            hosts.setdefault(st["x-host"], {})
    if default:
        placement["all"] = default
        hosts.setdefault(default, {})
    router = None
    proxy = tree.get("x-proxy")
    if isinstance(proxy, dict) and "relays_kv_transfer_params" in proxy:
        router = {"relays_kv_transfer_params": bool(proxy["relays_kv_transfer_params"])}
    inv = None
    if isinstance(tree.get("x-inventory"), dict):  # a whole inventory (host addresses included)
        d = dict(tree["x-inventory"])
        if router and "router" not in d:
            d["router"] = router
        inv = Inventory.from_dict(d)
    elif hosts or router:
        d: dict[str, Any] = {"hosts": hosts, "placement": placement}
        if router:
            d["router"] = router
        inv = Inventory.from_dict(d)
    model = None
    xm = tree.get("x-model")
    if isinstance(xm, dict) and isinstance(xm.get("config_json"), dict):  # a whole config.json (--model-info)
        model = ModelInfo.from_config_json(xm["config_json"])
    elif isinstance(xm, dict):
        model = ModelInfo(model_type=MODEL_TYPES.get(str(xm.get("id"))), num_kv_heads=xm.get("num_key_value_heads"),
                          attention=xm.get("attention"),
                          subconfigs=frozenset(xm["hf_subconfigs"]) if xm.get("hf_subconfigs") else None)
    rt = tree.get("x-runtime") or {}
    version = REPORT_RELEASE.get(str(tree.get("x-id")))
    if isinstance(rt, dict) and rt.get("vllm"):
        version = ".".join(str(rt["vllm"]).split(".")[:2])
    platform = top_host.get("accel") if isinstance(top_host, dict) else None
    return ValidateOptions(platform=platform, inventory=inv, model=model, vllm_version=version,
                           env={k: str(v) for k, v in (tree.get("x-env") or {}).items()},
                           cli=dict(tree.get("x-cli") or {}))


def _dump(tree: Any) -> str:
    buf = io.StringIO()
    _yaml().dump(tree, buf)
    return buf.getvalue()


def _merge_variant(tree: Any, variant: dict) -> Any:
    """The case with a variant's stages merged by stage_id (and its x- context)."""
    out = copy.deepcopy(tree)
    for k, v in variant.items():
        if k == "stages":
            by_id = {s.get("stage_id"): s for s in out.get("stages") or []}
            for vs in v:
                tgt = by_id.get(vs.get("stage_id"))
                if tgt is None:
                    out.setdefault("stages", []).append(copy.deepcopy(vs))
                else:
                    for kk, vv in vs.items():
                        tgt[kk] = copy.deepcopy(vv)
        elif k != "x-expect":
            out[k] = copy.deepcopy(v)
    out["x-expect"] = variant.get("x-expect", [])
    return out


def _runs():
    """(case id, which, tree) for every case and every expressible variant."""
    out = []
    paths = sorted(CASES_DIR.glob("BR-*.yaml")) if CASES_DIR.is_dir() else []
    for path in paths + sorted(OWN_CASES_DIR.glob("TC-*.yaml")):
        tree = _load(path)
        cid = str(tree.get("x-id", path.stem))
        out.append(pytest.param(cid, "main", path, None, id=f"{cid}"))
        for key in ("x-variant", "x-fix"):
            v = tree.get(key)
            if isinstance(v, dict):
                out.append(pytest.param(cid, "variant" if key == "x-variant" else "fix", path, key, id=f"{cid}-{key[2:]}"))
            elif isinstance(v, list):
                for i, item in enumerate(v):
                    out.append(pytest.param(cid, f"variant{i}", path, (key, i), id=f"{cid}-{key[2:]}{i}"))
    return out


def _expectations(tree: Any) -> list[dict]:
    return [dict(e) for e in (tree.get("x-expect") or [])]


def _run_case(tree: Any, name: str):
    opts = context_of(_plain(tree))
    stripped = _strip_x(copy.deepcopy(tree))
    text = _dump(stripped)
    return validate_text(text, name, opts), text


@pytest.mark.parametrize(("cid", "which", "path", "variant"), _runs())
def test_case(cid: str, which: str, path: Path, variant: Any) -> None:
    reason = XFAIL.get((cid, which))
    if reason:
        pytest.xfail(reason)
    tree = _load(path)
    if isinstance(variant, tuple):  # list-style variant: swap the connector name (BR-12)
        key, i = variant
        item = tree[key][i]
        tree = copy.deepcopy(tree)
        for st in tree.get("stages") or []:
            st["kv_transfer_config"]["kv_connector"] = item["kv_connector"]
        if item.get("platform"):
            tree["x-host"] = {"accel": item["platform"]}
        import re

        expect = str(item["expect"])
        verdict = re.match(r"\w+", expect).group(0)  # "error: ...", "error + suggestion X"
        sugg = re.search(r"suggestion (\w+)", expect)
        tree["x-expect"] = [{"verdict": verdict, "rule": tree["x-expect"][0]["rule"],
                             "contains": sugg.group(1) if sugg else None}]
    elif variant:
        tree = _merge_variant(tree, tree[variant])
    expects = _expectations(tree)
    assert expects, "case has no x-expect"
    res, text = _run_case(tree, f"{path.stem}.yaml")
    lines = text.splitlines()
    for e in expects:
        # an own case may name omni-pd's code directly (a rule with no catalogue label)
        codes = (e["code"],) if e.get("code") else codes_of(e["rule"])
        assert codes, f"{e['rule']} has no omni-pd code"
        code = "/".join(codes)
        verdict = e["verdict"]
        if verdict == "rewrite":
            from omni_pd.compile.expand import expand_document
            from omni_pd.io import parse_text

            expand_document(parse_text(text, "case.yaml"))
            continue
        found = [d for d in res.diagnostics if d.code in codes]
        if verdict == "pass":
            bad = [d for d in found if d.severity in (Severity.ERROR, Severity.WARNING)]
            assert not bad, f"{cid}: expected {e['rule']} ({code}) to pass, got {[d.message for d in bad]}"
            continue
        want = VERDICT_SEVERITY[verdict]
        hits = [d for d in found if d.severity is want]
        assert hits, (f"{cid}/{which}: expected {verdict} {e['rule']} ({code}); got "
                      f"{[(d.code, d.severity.value, d.message) for d in res.diagnostics]}")
        if e.get("contains"):
            assert any(e["contains"] in d.message for d in hits), [d.message for d in hits]
        for d in hits:  # located at a key of the (stripped) case, or at the command line / environment
            loc = d.location
            assert loc is not None
            if loc.file.startswith("<"):
                continue
            src = lines if loc.file == f"{path.stem}.yaml" else Path(loc.file).read_text().splitlines()  # base_config
            assert loc.line is not None and 1 <= loc.line <= len(src), (cid, d.message)


@needs_shared
def test_br32_prefill_sampling_is_flagged() -> None:
    """BR-32's prefill stop_token_ids: validate warns at the key (expand refuses PD input)."""
    tree = _load(CASES_DIR / "BR-32.yaml")
    res, text = _run_case(tree, "BR-32.yaml")
    hits = [d for d in res.diagnostics if d.code == "OPD701"]
    assert [d.severity for d in hits] == [Severity.WARNING]
    line = text.splitlines()[hits[0].location.line - 1]
    assert line[hits[0].location.column - 1:].startswith('["<eos-id>"]') or "stop_token_ids" in line
    with pytest.raises(OmniPdError) as ei:
        from omni_pd.compile.expand import expand_document
        from omni_pd.io import parse_text

        expand_document(parse_text(text, "BR-32.yaml"))
    assert ei.value.diagnostic.code == "OPD803"


def test_every_case_rule_maps_to_a_registered_code() -> None:
    from omni_pd.check.rules import registry

    reg = registry()
    for name in CASE_RULES:
        for code in codes_of(name):
            assert code in reg, name
    # and every label a rule declares is in the table with that rule's code
    for code, r in reg.items():
        for label in r.labels:
            assert label in CASE_RULES and code in codes_of(label), (label, code)
