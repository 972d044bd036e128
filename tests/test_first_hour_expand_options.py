"""Expand's options are the user's: a combination that cannot work is a usage error (issue 24, item 2).

The property: over the space of expand's options (TP and DP per side, device lists, replicas,
connector, KV buffer device, platform, vLLM version, port base, pipeline) on the bundled
preset and the single-LLM fixtures, ``omni-pd expand`` either writes a file that
``omni-pd validate --all-platforms`` passes (exit 0), or refuses with exit 2 and an error
diagnostic; never exit 3 (OPD000, "a bug in omni-pd"), never a traceback. The fixed
cases pin the messages of the refusals the property found.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import example_budget
from omni_pd.cli import main

ROOT = Path(__file__).resolve().parents[1]
INPUTS = {
    "preset": ROOT / "presets" / "qwen3_omni_moe.yaml",
    "llm": ROOT / "tests" / "fixtures" / "llm.yaml",
    "thinker_only_cpu": ROOT / "tests" / "fixtures" / "qwen3_omni_moe_thinker_only_cpu.yaml",
}


def _run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


def _devices() -> st.SearchStrategy[str]:
    return st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True).map(lambda d: ",".join(map(str, d)))


def _opt(flag: str, values: st.SearchStrategy) -> st.SearchStrategy[list[str]]:
    return st.one_of(st.just([]), values.map(lambda v: [flag, str(v)]))


@st.composite
def expand_args(draw) -> tuple[str, list[str]]:
    """(input name, expand options) over the options' space."""
    src = draw(st.sampled_from(sorted(INPUTS)))
    args: list[str] = []
    for flag, values in (
            ("--tp", st.integers(1, 4)),
            ("--prefill-tp", st.integers(1, 4)),
            ("--decode-tp", st.integers(1, 4)),
            ("--dp", st.integers(1, 3)),
            ("--prefill-dp", st.integers(1, 3)),
            ("--decode-dp", st.integers(1, 4)),
            ("--prefill-devices", _devices()),
            ("--decode-devices", _devices()),
            ("--downstream-devices", _devices()),
            ("--prefill-replicas", st.integers(1, 3)),
            ("--decode-replicas", st.integers(1, 3)),
            ("--connector", st.sampled_from(["MooncakeConnector", "NixlConnector", "NixlPushConnector", "nixl",
                                             "MooncakeConnectorV1"])),
            ("--kv-buffer-device", st.sampled_from(["cuda", "cpu", "xpu"])),
            ("--platform", st.just("npu")),
            ("--npu-connector", st.sampled_from(["MooncakeConnectorV1", "MooncakeLayerwiseConnector"])),
            ("--npu-decode-tp", st.integers(1, 4)),
            ("--vllm-version", st.sampled_from(["0.11", "0.13", "0.18", "0.30", "0.33"])),
            ("--port-base", st.sampled_from([20000, 65530])),
    ):
        args += draw(_opt(flag, values))
    if src == "preset":
        args += draw(_opt("--pipeline", st.just("qwen3_omni_moe_thinker_only")))
    return src, args


def check_expand(src: str, args: list[str]) -> None:
    """The contract of one expand run (see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="omni-pd-opts-") as tmp:
        out = Path(tmp) / "out.yaml"
        rc, _, err = _run(["expand", str(INPUTS[src]), *args, "-q", "-o", str(out)])
        assert "Traceback" not in err and "OPD000" not in err, (args, err)
        assert rc in (0, 2), (args, rc, err)
        if rc == 2:
            assert "error[" in err or "Error" in err, (args, err)
            assert not out.exists()
            return
        version = args[args.index("--vllm-version") + 1] if "--vllm-version" in args else None
        vrc, vout, verr = _run(["validate", str(out), "--all-platforms", "-q",
                                *(["--vllm-version", version] if version else [])])
        assert vrc == 0, (args, vout, verr, out.read_text())


@settings(max_examples=example_budget(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expand_args())
def test_expand_options_either_validate_or_are_refused_as_usage(case):
    check_expand(*case)


# the combinations the property found, each with the refusal the user gets
@pytest.mark.parametrize("src, args, message", [
    # issue 24's reproduction: --tp 2 needs two devices per engine
    ("preset", ["--tp", "2", "--prefill-devices", "0"],
     "error[OPD805]: --prefill-devices lists 1 device(s); prefill needs 2 (TP 2 from --tp x PP 1 x DP 1)"),
    ("preset", ["--tp", "2", "--decode-devices", "5"],
     "error[OPD805]: --decode-devices lists 1 device(s); decode needs 2 (TP 2 from --tp x PP 1 x DP 1)"),
    ("llm", ["--prefill-devices", "0,1"],
     "error[OPD805]: --prefill-devices lists 2 device(s); prefill needs 1 (TP 1 from the Thinker x PP 1 x DP 1)"),
    # DP per side (issue 26): --dp sets both, a side's own option may repeat it, not contradict it
    ("preset", ["--dp", "2", "--decode-dp", "4"],
     "error[OPD006]: --decode-dp 4 contradicts --dp 2 (--dp sets both prefill and decode)"),
    ("llm", ["--decode-dp", "2", "--decode-devices", "4"],
     "error[OPD805]: --decode-devices lists 1 device(s); decode needs 2 (TP 1 from the Thinker x PP 1 x DP 2 "
     "from --decode-dp)"),
    ("preset", ["--tp", "2", "--dp", "2", "--prefill-devices", "0,1"],
     "error[OPD805]: --prefill-devices lists 2 device(s); prefill needs 4 (TP 2 from --tp x PP 1 x DP 2 from --dp)"),
    ("llm", ["--prefill-replicas", "2", "--prefill-dp", "2", "--prefill-devices", "0,1,2"],
     "error[OPD805]: --prefill-devices lists 3 device(s); 4 are needed (2 instance(s) x 2 device(s) each)"),
    # Talker and Code2Wav moved onto prefill's device: their memory shares sum above 1.0 (OPD404 shown above it)
    ("preset", ["--downstream-devices", "0"],
     "error[OPD805]: cannot place the stages where --downstream-devices 0 put them: the file would fail validate "
     "(OPD404)"),
    # the preset's platforms.xpu overlay runs the same kv_transfer_config on xpu, where NIXL takes cpu or xpu
    ("preset", ["--connector", "NixlConnector", "--kv-buffer-device", "cuda"],
     "error[OPD006]: --kv-buffer-device cuda: the file's platforms.xpu overlay runs NixlConnector on xpu, "
     "where vLLM 0.30 accepts cpu or xpu"),
])
def test_option_combinations_that_cannot_work_are_usage_errors(src, args, message):
    rc, out, err = _run(["expand", str(INPUTS[src]), *args])
    assert (rc, out) == (2, "")
    assert [ln for ln in err.splitlines() if ln.startswith(("error[OPD805]", "error[OPD006]"))] == [message]
    assert "OPD000" not in err


def test_kv_buffer_device_accepted_on_every_overlay_is_written():
    """``cpu`` (host staging) is accepted on cuda and xpu alike: the preset's split validates."""
    check_expand("preset", ["--connector", "NixlConnector", "--kv-buffer-device", "cpu"])


def test_the_text_route_takes_a_file_that_names_its_full_pipeline(tmp_path):
    """OPD704's help: `omni-pd expand <three-stage file> --pipeline qwen3_omni_moe_thinker_only`.
    On a file whose `pipeline:` key says `qwen3_omni_moe` that was OPD006 ('the file names
    pipeline qwen3_omni_moe'), so the user had to edit the file (new-user walkthrough). The
    Thinker of the file's own pipeline is what it asks for; another pipeline is still refused."""
    import subprocess
    import sys

    src = ROOT / "tests" / "fixtures" / "qwen3_omni_moe_cpu.yaml"
    out = tmp_path / "text.yaml"
    r = subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", str(src), "--pipeline",
                        "qwen3_omni_moe_thinker_only", "-q", "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "\npipeline: qwen3_omni_moe_thinker_only_pd\n" in out.read_text()
    other = subprocess.run([sys.executable, "-m", "omni_pd.cli", "expand", str(src), "--pipeline", "qwen2_5_omni"],
                           capture_output=True, text=True)
    assert other.returncode == 2
    assert other.stderr.splitlines()[0] == "error[OPD006]: --pipeline qwen2_5_omni: the file names pipeline `qwen3_omni_moe`"
