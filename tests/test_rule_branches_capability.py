"""Every branch of the connector capability rules (OPD601-OPD615,
omni_pd/check/rules/capability.py) with exact messages, locations and help lines (issue 16:
the rule examples' golden, tests/test_rule_branches.py, reaches one or two branches of each;
these pin the others, named by the mutation run of bench/mutation.py).

Each test names the branch it pins.
"""

from __future__ import annotations

from omni_pd.check.rules.encoder import _epd
from omni_pd.check.validate import ValidateOptions, validate_text
from rule_found import found  # tests/rule_found.py

V30 = ValidateOptions(vllm_version="0.30")
ROCM_NOTE = "found with the `platforms.rocm` overlay applied"


def _col(text: str, needle: str, nth: int = 0) -> tuple[int, int]:
    """1-based (line, column) of the ``nth`` ``needle`` in ``text`` (an oracle independent of the locator)."""
    at = -1
    for _ in range(nth + 1):
        at = text.index(needle, at + 1)
    before = text[:at]
    return before.count("\n") + 1, len(before) - before.rfind("\n")


def _overlay(ec: str) -> str:
    """A 1E1P1D file whose base EC wiring is right and whose ``platforms.rocm`` overlay gives
    prefill (stage 1) the ``ec_transfer_config`` ``ec``."""
    return _epd() + f"platforms:\n  rocm:\n    stages:\n      - stage_id: 1\n        ec_transfer_config: {ec}\n"


# --- --all-platforms: the base plus each overlay (OPD614, OPD615) -----------------------------------

def test_opd614_all_platforms_checks_an_overlays_ec_transfer_config_too() -> None:
    # `--platform rocm` reports the overlay's misspelt connector, its unknown role and the producer
    # it leaves without a consumer; `--all-platforms` ("base + every overlay") must report them too,
    # each noted with the overlay (the rule ran on the base platform only: none)
    text = _overlay("{ec_connector: ECExampleConnectr, ec_role: ec_reader}")
    want = [("warning", "stage 0 is an ec_producer but no ec_consumer is downstream of it: its encoder outputs go nowhere",
             _col(text, "ec_producer")),
            ("error", "stage 1: unknown ec_connector `ECExampleConnectr`; did you mean ECExampleConnector?",
             _col(text, "ECExampleConnectr,")),
            ("error", "stage 1: unsupported ec_role `ec_reader`", _col(text, "ec_reader"))]
    rocm = ValidateOptions(platform="rocm", vllm_version="0.30")
    assert [h[:3] for h in found(text, "OPD614", opts=rocm)] == want
    assert found(text, "OPD614", opts=V30) == []
    every = ValidateOptions(all_platforms=True, vllm_version="0.30")
    got = [(d.severity.value, d.message, (d.location.line, d.location.column), list(d.notes))
           for d in validate_text(text, "t.yaml", every).diagnostics if d.code == "OPD614"]
    assert got == [(*w, [ROCM_NOTE]) for w in want]


def test_opd615_all_platforms_checks_an_overlays_ec_transfer_config_too() -> None:
    text = _overlay("{ec_connector: ECExampleConnector, ec_role: ec_consumer, ec_bufer_size: 1.0e9}")
    want = ("error", "stage 1: `ec_bufer_size` is not an ECTransferConfig field", _col(text, "ec_bufer_size"))
    assert [h[:3] for h in found(text, "OPD615", opts=ValidateOptions(platform="rocm", vllm_version="0.30"))] == [want]
    every = ValidateOptions(all_platforms=True, vllm_version="0.30")
    got = [(d.severity.value, d.message, (d.location.line, d.location.column), list(d.notes))
           for d in validate_text(text, "t.yaml", every).diagnostics if d.code == "OPD615"]
    assert got == [(*want, [ROCM_NOTE])]


def test_opd614_and_opd615_are_said_once_under_all_platforms_when_the_base_has_them() -> None:
    # a base finding is true on every platform: the overlay's copy is merged into it (no note)
    text = _epd(p=", ec_transfer_config: {ec_connector: ECExampleConnectr, ec_role: ec_consumer, ec_bufer_size: 1}") + \
        "platforms:\n  rocm:\n    stages:\n      - {stage_id: 0, devices: \"3\"}\n"
    every = ValidateOptions(all_platforms=True, vllm_version="0.30")
    got = [(d.code, d.message, list(d.notes)) for d in validate_text(text, "t.yaml", every).diagnostics
           if d.code in ("OPD614", "OPD615")]
    assert got == [("OPD614", "stage 1: unknown ec_connector `ECExampleConnectr`; did you mean ECExampleConnector?", []),
                   ("OPD615", "stage 1: `ec_bufer_size` is not an ECTransferConfig field", [])]
