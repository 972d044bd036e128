"""Help that writes the right thing (issue 36 item 8): each hand-edited mistake from the
issue, in the PD file ``expand --tp 2`` writes, gets a help line that repairs it when
followed, and one cause gets one error."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni_pd.cli import main


@pytest.fixture(scope="module")
def pd2(tmp_path_factory) -> str:
    """The text of ``omni-pd expand --tp 2`` (prefill "0,1", decode "2,3", downstream "4")."""
    out = tmp_path_factory.mktemp("pd2") / "pd.yaml"
    assert main(["expand", "-q", "--tp", "2", "-o", str(out)]) == 0
    return out.read_text()


def validate(text: str, tmp_path: Path, capsys) -> tuple[int, str]:
    f = tmp_path / "f.yaml"
    f.write_text(text)
    capsys.readouterr()
    rc = main(["validate", str(f)])
    out, err = capsys.readouterr()
    return rc, out + err


def line_of(text: str, needle: str, start: int = 0) -> int:
    """1-based line of the first line containing ``needle`` at or after line ``start``."""
    for i, line in enumerate(text.splitlines()[start:], start=start + 1):
        if needle in line:
            return i
    raise AssertionError(needle)


def test_opd401_on_decode_suggests_decodes_own_devices_not_prefills(pd2, tmp_path, capsys):
    text = pd2.replace('    devices: "2,3"\n', '    devices: "2"\n', 1)
    rc, out = validate(text, tmp_path, capsys)
    assert rc == 1
    assert "error[OPD401]: stage 1: tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 1 = " \
           "2 devices, but devices has 1 entry\n" in out
    assert '   = help: list 2 devices here, e.g. devices: "2,3"\n' in out


def test_opd401_suggestion_skips_devices_other_stages_use(pd2, tmp_path, capsys):
    # prefill TP 2 on "0" alone: 1 is free, so "0,1"; decode TP 2 on "3": the free device nearest
    # to it is 2 (4 is the Talker's), so "2,3"
    text = pd2.replace('    devices: "0,1"\n', '    devices: "0"\n', 1)
    text = text.replace('    devices: "2,3"\n', '    devices: "3"\n', 1)
    rc, out = validate(text, tmp_path, capsys)
    assert rc == 1
    helps = [ln for ln in out.splitlines() if "e.g. devices:" in ln]
    assert helps == ['   = help: list 2 devices here, e.g. devices: "0,1"',
                     '   = help: list 2 devices here, e.g. devices: "2,3"'], helps


def test_a_kv_role_dedented_out_of_kv_transfer_config_is_put_back(pd2, tmp_path, capsys):
    n = line_of(pd2, "kv_role: kv_consumer")
    kv = line_of(pd2, "kv_transfer_config:", n - 5)
    lines = pd2.splitlines(keepends=True)
    lines[n - 1] = "    kv_role: kv_consumer\n"
    rc, out = validate("".join(lines), tmp_path, capsys)
    assert rc == 2
    f = tmp_path / "f.yaml"
    assert out == (
        f"error[OPD002]: invalid YAML: bad indentation: `kv_role` (line {n}, column 5) is less indented than the keys "
        f"around it (column 7), so YAML ends the mapping of `kv_transfer_config` (line {kv}) before it\n"
        f"  --> {f}:{n}:5\n"
        f"   |\n"
        f"{n} |     kv_role: kv_consumer\n"
        f"   |     ^^^^^^^ dedented\n"
        f"   = note: `engine_id` is read as more of its value: {f}:{n + 1}:7\n"
        f"   = help: indent `kv_role` to column 7, back under `kv_transfer_config` (line {kv}) like the keys around it\n")


def test_a_kv_transfer_key_at_stage_level_is_moved_not_removed(pd2, tmp_path, capsys):
    """The old OPD002 help ("line `engine_id` up with `kv_role`") dedented the whole block;
    OPD111 then said "remove it" for kv_role, engine_id and kv_ip."""
    n = line_of(pd2, "kv_role: kv_consumer")
    kv = line_of(pd2, "kv_transfer_config:", n - 5)
    lines = pd2.splitlines(keepends=True)
    for i in (n - 1, n, n + 1):  # kv_role, engine_id, kv_ip at the stage's column
        lines[i] = lines[i][2:]
    rc, out = validate("".join(lines), tmp_path, capsys)
    assert rc == 1
    helps = [ln for ln in out.splitlines() if ln.startswith("   = help:")]
    assert helps == [
        f"   = help: move the stage's `kv_role: kv_consumer` (line {n}) under `kv_transfer_config` (line {kv})",
        f"   = help: `kv_role` is a kv_transfer_config key: move it under the stage's `kv_transfer_config` (line {kv})",
        f"   = help: `engine_id` is a kv_transfer_config key: move it under the stage's `kv_transfer_config` (line {kv})",
        f"   = help: `kv_ip` is a kv_transfer_config key: move it under the stage's `kv_transfer_config` (line {kv})",
    ], out
    assert "remove it" not in out


def test_a_duplicate_stage_id_is_one_error_not_a_missing_kv_transfer_config(pd2, tmp_path, capsys):
    n = line_of(pd2, "  - stage_id: 1")
    lines = pd2.splitlines(keepends=True)
    lines[n - 1] = lines[n - 1].replace("stage_id: 1", "stage_id: 0")
    rc, out = validate("".join(lines), tmp_path, capsys)
    assert rc == 1
    assert [ln.split("]")[0] for ln in out.splitlines() if ln.startswith("error[")] == ["error[OPD202"], out
    assert "has no kv_transfer_config" not in out


def test_a_json_string_for_a_mapping_is_one_error_with_the_fix(pd2, tmp_path, capsys):
    n = line_of(pd2, "    kv_transfer_config:")
    lines = pd2.splitlines(keepends=True)
    block = lines[n - 1:n + 6]
    assert block[1].strip() == "kv_connector: MooncakeConnector" and block[6].strip() == "bootstrap_port: 25201"
    lines[n - 1:n + 6] = ['    kv_transfer_config: \'{"kv_connector": "MooncakeConnector", "kv_role": "kv_producer", '
                          '"engine_id": "omni-thinker-prefill", "kv_ip": "127.0.0.1", '
                          '"kv_connector_extra_config": {"bootstrap_port": 25201}}\'\n']
    rc, out = validate("".join(lines), tmp_path, capsys)
    assert rc == 1
    assert [ln.split("]")[0] for ln in out.splitlines() if ln.startswith("error[")] == ["error[OPD101"], out
    assert ("   = help: this is JSON text in a quoted string: remove the quotes around it, and "
            "`kv_transfer_config: {...}` is a YAML mapping\n") in out
