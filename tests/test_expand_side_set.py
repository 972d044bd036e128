"""Per-side engine settings (issue 36 item 10): vllm-omni's own PD recipe gives prefill and
decode different ``max_num_seqs`` (16 and 64); ``expand --prefill-set KEY=VALUE`` /
``--decode-set KEY=VALUE`` write any stage key on one side, validated like the file, and
the header says which were set."""

from __future__ import annotations

from omni_pd.cli import main
from omni_pd.io import parse_text


def run(args: list[str], capsys) -> tuple[int, str, str]:
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


def stages(text: str) -> dict[int, dict]:
    return {s["stage_id"]: s for s in parse_text(text, "x").tree["stages"]}


def test_prefill_and_decode_get_their_own_max_num_seqs(capsys):
    rc, base, err = run(["expand", "-q"], capsys)
    assert rc == 0, err
    rc, out, err = run(["expand", "-q", "--prefill-set", "max_num_seqs=16", "--decode-set", "max_num_seqs=64",
                        "--decode-set", "enable_prefix_caching=true"], capsys)
    assert rc == 0, err
    got, was = stages(out), stages(base)
    assert got[0]["max_num_seqs"] == 16 and got[1]["max_num_seqs"] == 64
    assert got[1]["enable_prefix_caching"] is True and was[1]["enable_prefix_caching"] is False
    assert got[2] == was[2] and got[3] == was[3]  # Talker and Code2Wav untouched
    assert ("# Per-side settings: prefill max_num_seqs=16 (--prefill-set); decode max_num_seqs=64, "
            "enable_prefix_caching=true (--decode-set).\n") in out


def test_a_value_validate_refuses_is_an_error_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "pd.yaml"
    rc, _, err = run(["expand", "-q", "--decode-set", "max_num_seqs=many", "-o", str(out)], capsys)
    assert rc == 1
    assert "error[OPD101]: `max_num_seqs` must be an integer, found 'many'\n" in err
    assert err.splitlines()[-1] == ("expand: nothing written: the output with --prefill-set/--decode-set does not "
                                    "validate (1 error)")
    assert not out.exists()


def test_keys_expand_owns_name_their_option(capsys):
    rc, _, err = run(["expand", "-q", "--decode-set", "devices=5"], capsys)
    assert rc == 2
    assert err == ("error[OPD006]: --decode-set devices=5: expand writes `devices` for the split\n"
                   "  = help: use --decode-devices\n")
    rc, _, err = run(["expand", "-q", "--prefill-set", "max_num_seqs"], capsys)
    assert rc == 2
    assert err == ("error[OPD006]: --prefill-set max_num_seqs: expected KEY=VALUE\n"
                   "  = help: e.g. --prefill-set max_num_seqs=16 (VALUE is read as YAML: 16, true, \"text\")\n")
