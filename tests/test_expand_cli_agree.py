"""Two expand outputs from the command line, pinned (issue 24, "also left"; both fixed before,
tests/test_polish.py sections 5 and 6 check them through the library):

* ``expand --platform npu`` writes only the npu overlay, and ``validate --all-platforms`` on
  the output has nothing to say;
* ``expand --encoder-split 1e1p1d`` keeps the prefill entry's keys, comments included, in
  the order ``expand`` without the encoder split writes them, with the one key the encoder
  split adds (``ec_transfer_config``) right after ``kv_transfer_config``.

Comments (fixed here): the lines written above a key stayed behind when the split inserted
keys before it (ruamel.yaml keeps them on the previous key: ``# eager for CPU`` ended up
above ``env``, away from ``enforce_eager``), in both splits; the encoder entry E lost every
comment of the LLM entry it is built from.
"""

from __future__ import annotations

from rule_found import cli_in  # tests/rule_found.py

from pathlib import Path

from ruamel.yaml import YAML


ROOT = Path(__file__).resolve().parents[1]
PRESET = ROOT / "presets" / "qwen3_omni_moe.yaml"
#: an LLM entry with comments and devices in the middle of its keys
MID = ('pipeline: llm\nstages:\n  - stage_id: 0\n    max_model_len: 1024  # ctx\n    devices: "0"\n'
       "    # eager for CPU\n    enforce_eager: true\n    default_sampling_params: {temperature: 0.0}\n"
       "    dtype: float32\n")


def _cli(tmp_path: Path, capsys, *args: str) -> tuple[int, str]:
    rc, out, _ = cli_in(tmp_path, capsys, *args)
    return rc, out


def test_expand_platform_npu_writes_what_validate_all_platforms_accepts(tmp_path, capsys) -> None:
    rc, _ = _cli(tmp_path, capsys, "expand", str(PRESET), "--platform", "npu", "-o", "npu.yaml")
    assert rc == 0
    text = (tmp_path / "npu.yaml").read_text()
    assert list(YAML().load(text)["platforms"]) == ["npu"]
    assert ("# Not kept from the input: platforms.cuda, platforms.musa, platforms.rocm, platforms.xpu "
            "(MooncakeConnectorV1 exists only on npu,\n") in text
    rc, out = _cli(tmp_path, capsys, "validate", "--all-platforms", "npu.yaml")
    assert (rc, out) == (0, "npu.yaml: ok (0 errors, 0 warnings, 0 info)\n")


def _stages(path: Path) -> list:
    return YAML().load(path.read_text())["stages"]


def test_encoder_split_prefill_keeps_the_pd_split_key_order_and_comments(tmp_path, capsys) -> None:
    (tmp_path / "mid.yaml").write_text(MID)
    assert _cli(tmp_path, capsys, "expand", "mid.yaml", "-o", "pd.yaml")[0] == 0
    assert _cli(tmp_path, capsys, "expand", "mid.yaml", "--encoder-split", "1e1p1d", "-o", "enc.yaml")[0] == 0
    pd, enc = _stages(tmp_path / "pd.yaml"), _stages(tmp_path / "enc.yaml")
    assert [list(s) for s in pd] == [
        ["stage_id", "max_model_len", "async_scheduling", "devices", "env", "kv_transfer_config", "enforce_eager",
         "default_sampling_params", "dtype"],
        ["stage_id", "max_model_len", "devices", "kv_transfer_config", "enforce_eager", "default_sampling_params",
         "dtype"]]
    assert [list(s) for s in enc] == [
        ["stage_id", "max_model_len", "devices", "ec_transfer_config", "enforce_eager", "dtype"],
        ["stage_id", "max_model_len", "async_scheduling", "devices", "env", "kv_transfer_config",
         "ec_transfer_config", "enforce_eager", "default_sampling_params", "dtype"],
        ["stage_id", "max_model_len", "devices", "kv_transfer_config", "enforce_eager", "default_sampling_params",
         "dtype"]]
    prefill = list(pd[0])
    prefill.insert(prefill.index("kv_transfer_config") + 1, "ec_transfer_config")
    assert list(enc[1]) == prefill and list(enc[2]) == list(pd[1])
    # comments: an end-of-line one stays on its key; the line above enforce_eager stays above
    # it, on E too, however many keys the split writes after devices
    pd_text, enc_text = (tmp_path / "pd.yaml").read_text(), (tmp_path / "enc.yaml").read_text()
    for text, n in ((pd_text, 2), (enc_text, 3)):
        assert text.count("    max_model_len: 1024  # ctx\n") == n
        assert text.count("    # eager for CPU\n    enforce_eager: true\n") == n
        assert text.count("# eager for CPU") == n


def test_comment_lines_above_a_key_stay_above_it_when_the_split_writes_keys_before_it(tmp_path, capsys) -> None:
    (tmp_path / "in.yaml").write_text(MID.replace('devices: "0"\n    # eager for CPU\n',
                                                  'devices: "0"  # the GPU\n    # eager for CPU\n\n    #   (no graphs)\n'))
    assert _cli(tmp_path, capsys, "expand", "in.yaml", "-o", "pd.yaml")[0] == 0
    text = (tmp_path / "pd.yaml").read_text()
    prefill = text[text.index("  - stage_id: 0"):text.index("  - stage_id: 1")]
    assert prefill.splitlines()[3:] == [
        '    devices: "0"  # the GPU',
        "    env:",
        '      VLLM_MOONCAKE_BOOTSTRAP_PORT: "25201"',
        "    kv_transfer_config:",
        "      kv_connector: MooncakeConnector",
        "      kv_role: kv_producer",
        "      engine_id: llm-prefill",
        '      kv_ip: "127.0.0.1"',
        "    # eager for CPU",
        "",
        "    #   (no graphs)",
        "    enforce_eager: true",
        "    default_sampling_params: {temperature: 0.0}",
        "    dtype: float32"]
