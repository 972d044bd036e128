"""Small honesty items (issue 36 item 9): what omni-pd says matches what the runtime does."""

from __future__ import annotations

from pathlib import Path

from omni_pd.cli import main

ROOT = Path(__file__).resolve().parents[1]


def run(args: list[str], capsys) -> tuple[int, str]:
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out + err


def test_connectors_lists_cpu_where_the_cpu_rehearsal_runs_it(capsys):
    rc, out = run(["connectors"], capsys)
    assert rc == 0
    rows = {ln.split()[0]: ln for ln in out.splitlines()[1:]}
    # the CPU end-to-end runs: MooncakeConnector (vllm-omni pipeline), NixlConnector (single LLM)
    assert "cuda, rocm, xpu, cpu (vLLM)" in rows["MooncakeConnector"]
    assert "cuda, rocm, xpu, cpu (vLLM)" in rows["NixlConnector"]
    assert "cuda, rocm, xpu (vLLM)" in rows["NixlPushConnector"] and "cpu" not in rows["NixlPushConnector"].split("(")[0]


def test_a_vllm_connector_omni_pd_cannot_emit_is_not_a_typo(capsys):
    rc, out = run(["expand", "-q", "--connector", "LMCacheConnectorV1"], capsys)
    assert rc == 2
    assert out == ("error[OPD804]: no connector contract for `LMCacheConnectorV1`\n"
                   "  = help: LMCacheConnectorV1 is a vLLM connector omni-pd does not emit (validate checks a file "
                   "that names it); omni-pd can emit: MooncakeConnector, MooncakeConnectorV1, "
                   "MooncakeLayerwiseConnector, NixlConnector, NixlPushConnector\n")


def test_a_connector_typo_still_gets_did_you_mean(capsys):
    rc, out = run(["expand", "-q", "--connector", "NixlConector"], capsys)
    assert rc == 2
    assert "  = help: did you mean NixlConnector? omni-pd can emit: " in out


def test_explain_opd303_says_what_mooncake_does_with_kv_both(capsys):
    """vLLM 0.30 mooncake_connector.py: is_kv_producer / is_kv_consumer are both False for
    kv_both, so its per-request asserts never fire: the stage serves both directions."""
    rc, out = run(["explain", "OPD303"], capsys)
    assert rc == 0
    assert "asserts when a request is routed the wrong way" not in out.replace("\n", " ") and "misroutes" not in out
    assert "kv_both on a PD stage: deprecated (NIXL), and a stage that also serves the other direction" in out
    assert ("MooncakeConnector's per-request asserts (`assert not self.is_kv_producer` /\n"
            "`is_kv_consumer`) hold for kv_both, whose stage is neither") in out


def test_readme_does_not_blame_vllm_omnis_recipe_for_the_fixtures_memory(capsys):
    text = (ROOT / "README.md").read_text()
    assert "(this recipe: Talker + Code2Wav at 0.9 each on GPU 2)" not in text
    assert "# validate finds (exit 1: this fixture's Talker + Code2Wav keep 0.9 each on GPU 2)" in text


def test_the_plan_says_the_mooncake_bootstrap_binds_every_interface(tmp_path, capsys):
    """vLLM 0.30 mooncake_connector.py starts MooncakeBootstrapServer("0.0.0.0", port)."""
    pd = tmp_path / "pd.yaml"
    assert main(["expand", "-q", "-o", str(pd)]) == 0
    rc, out = run(["launch", str(pd), "--model", "M", "--dry-run"], capsys)
    assert rc == 0
    lines = out.splitlines()
    assert lines[3].split()[:8] == ["#", "omni", "omni", "-", "8000", "http,", "25201", "Mooncake"]
    assert "25201 Mooncake bootstrap on 0.0.0.0  http://127.0.0.1:8000/health" in lines[3]
    assert ("# note: port 25201 binds 0.0.0.0, every interface, whatever the config's addresses say (vLLM's "
            "Mooncake bootstrap server): reachable from the network, so firewall it") in lines


def test_size_write_on_a_gpu_system_does_not_warn_about_the_npu_overlay(tmp_path, capsys):
    fix = ROOT / "tests" / "fixtures" / "sizing"
    out = tmp_path / "sized.yaml"
    rc, said = run(["size", "--model-info", str(fix / "qwen3_omni_config.json"), "--system", "h200_sxm",
                    "--total-devices", "9", "--text-tokens", "3306", "--audio-seconds", "30", "--image", "640x480",
                    "--output-tokens", "500", "--ttft", "1000", "--tpot", "30",
                    "--from-result", str(fix / "aic_qwen3_30b_a3b_h200_vllm.json"), "--write", str(out)], capsys)
    assert rc == 0, said
    assert "warning[OPD904]" not in said
    assert ("note: the input's platforms.npu overlay is kept as expand writes it (one replica per side on npu, "
            "OPD904); this sizing is for h200_sxm\n") in said
    assert said.endswith(f"wrote {out} (through expand, validated)\n")
    rc, said = run(["expand", "-q", "--prefill-replicas", "2", "-o", str(tmp_path / "x.yaml")], capsys)
    assert rc == 0 and "warning[OPD904]" in said  # expand itself still says it


def test_readme_says_what_a_new_user_needs_before_the_first_command():
    """Issue 36 item 7: the serving environment needs omni-pd; the vllm-omni runtime has run
    on CPU only; the rehearsal's memory/disk and paths under the clone; the sizing example's
    config.json is synthesized."""
    text = " ".join((ROOT / "README.md").read_text().split())
    assert ("Install it in the serving environment too (every host and engine image): its vllm-omni plugin "
            "patches vllm-omni 0.30, and PD never switches on without it.") in text
    assert "The vllm-omni runtime under PD has run on CPU only, not yet on a GPU (" in text
    assert "9-12 GiB of memory, 3.5 GB of disk in `rehearsal/`" in text
    assert "/tmp/pd.yaml" not in text and "/tmp/q3o-full" not in text
    assert "--mooncake-protocol tcp -o rehearsal/pd.yaml" in text
    assert "a synthesized config.json" in text
    assert "rehearsal/" in (ROOT / ".gitignore").read_text().split()
