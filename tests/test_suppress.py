"""The suppression logic as pure functions (omni_pd/check/suppress.py; issue 24, conventions):
directives read from YAML comments only, selectors resolved like ruff's, the select/ignore
layering, and :func:`apply`'s exact decisions and OPD009 reports."""

from __future__ import annotations

from omni_pd.check.suppress import Directive, Layer, Selector, apply, enabled, find_directives, resolve
from omni_pd.diagnostics import Diagnostic, Location, Severity

#: a small code table (code -> rule name), as omni_pd/check/settings.py known_codes() gives
KNOWN = {"OPD002": "invalid-yaml", "OPD009": "unused-suppression", "OPD101": "wrong-type",
         "OPD103": "unknown-key", "OPD403": "pd-shared-device", "OPD701": "prefill-sampling",
         "OPD704": "talker-payload-withheld"}


def _d(code: str, line: int | None, sev: Severity = Severity.ERROR, file: str = "f.yaml",
       path: tuple = ()) -> Diagnostic:
    return Diagnostic(code=code, severity=sev, message=f"{code} here",
                      location=Location(file=file, line=line, column=5, path=path))


def test_directives_trailing_and_own_line_with_exact_columns():
    text = ("stages:\n"
            "  - stage_id: 0  # omni-pd: ignore[OPD101, unknown-key] reason: on purpose\n"
            "    # omni-pd: ignore[OPD403]\n"
            "\n"
            "    # an ordinary comment\n"
            "    devices: \"0\"\n")
    assert find_directives(text, "f.yaml") == [
        Directive("f.yaml", 2, 18, 2, (Selector("OPD101", 2, 36), Selector("unknown-key", 2, 44))),
        # alone on its line: it applies to the next line with content (blank and comment lines skipped)
        Directive("f.yaml", 3, 5, 6, (Selector("OPD403", 3, 23),)),
    ]


def test_hash_inside_scalars_and_without_space_is_not_a_directive():
    text = ("a: \"x # omni-pd: ignore[OPD101]\"\n"
            "b: 'y # omni-pd: ignore[OPD101]'\n"
            "c: |\n"
            "  block # omni-pd: ignore[OPD101]\n"
            "  # omni-pd: ignore[OPD101]\n"
            "d: e#omni-pd:ignore[OPD101]\n"
            "f: plain # omni-pd: ignore[OPD103]\n")
    assert find_directives(text, "f.yaml") == [Directive("f.yaml", 7, 10, 7, (Selector("OPD103", 7, 28),))]


def test_malformed_directives_are_kept_as_such():
    text = "a: 1  # omni-pd: ignore\nb: 2  # omni-pd: ignore[]\nc: 3  # omni-pd: ignore[OPD101\n"
    assert [(d.line, d.selectors, d.malformed) for d in find_directives(text, "f.yaml")] == [
        (1, (), True), (2, (), True), (3, (), True)]
    assert find_directives("a: 1  # nothing for omni-pd here\n", "f.yaml") == []


def test_resolve_codes_names_prefixes_all():
    assert resolve("opd704", KNOWN) == {"OPD704"}
    assert resolve("talker-payload-withheld", KNOWN) == {"OPD704"}
    assert resolve("Talker_Payload_Withheld", KNOWN) == {"OPD704"}  # as `omni-pd explain` reads names
    assert resolve("OPD7", KNOWN) == {"OPD701", "OPD704"}
    assert resolve("ALL", KNOWN) == set(KNOWN)
    assert resolve("OPD705", KNOWN) is None  # well formed, but no such code
    assert resolve("OPD8", KNOWN) is None  # a prefix that matches nothing
    assert resolve("OPD7", KNOWN, prefixes=False) is None  # directives take whole codes only


def test_layers_select_replaces_ignore_removes_per_file_last():
    config = Layer("pyproject.toml", select=None, ignore=("OPD403",),
                   per_file_ignores=(("presets/*.yaml", ("OPD701",)), ("legacy.yaml", ("wrong-type",))),
                   root="/p")
    assert not enabled("OPD403", "/p/a.yaml", (config,), KNOWN)
    assert enabled("OPD101", "/p/a.yaml", (config,), KNOWN)
    # --select on the command line replaces the enabled set: the config's ignore is gone with it
    cli = Layer("--select/--ignore", select=("OPD4",), ignore=())
    assert enabled("OPD403", "/p/a.yaml", (config, cli), KNOWN)
    assert not enabled("OPD101", "/p/a.yaml", (config, cli), KNOWN)
    # --ignore on top of the config's select
    assert not enabled("OPD101", "/p/a.yaml", (Layer("c", select=("ALL",)), Layer("cli", ignore=("wrong-type",))), KNOWN)
    # per-file-ignores: a glob with / is relative to the config's directory, a bare name matches any directory
    assert not enabled("OPD701", "/p/presets/x.yaml", (config,), KNOWN)
    assert enabled("OPD701", "/q/presets/x.yaml", (config,), KNOWN)
    assert not enabled("OPD101", "/p/deep/legacy.yaml", (config,), KNOWN)
    assert enabled("OPD101", "/p/deep/other.yaml", (config,), KNOWN)


def test_apply_hides_suppressed_findings_and_reports_each_unused_code():
    text = ("stages:\n"
            "  - stage_id: 0\n"
            "    tensor_parallel_size: two  # omni-pd: ignore[wrong-type, OPD103]\n"
            "    devices: \"0\"  # omni-pd: ignore[OPD999]\n"
            "    x: 1  # omni-pd: ignore[OPD002]\n"
            "    y: 2  # omni-pd: ignore\n")
    wrong = _d("OPD101", 3)
    other = _d("OPD403", 4, Severity.WARNING)
    out = apply([wrong, other], {"f.yaml": find_directives(text, "f.yaml")}, (), KNOWN)
    assert out.suppressed == [wrong]
    assert [(d.code, d.severity, d.message, str(d.location), d.help) for d in out.kept] == [
        ("OPD009", Severity.WARNING, "unused suppression `OPD103`: no OPD103 finding on line 3", "f.yaml:3:62",
         "remove `OPD103` from the comment"),
        ("OPD403", Severity.WARNING, "OPD403 here", "f.yaml:4:5", None),
        ("OPD009", Severity.WARNING, "unused suppression `OPD999`: not a code or rule name omni-pd knows",
         "f.yaml:4:37", "`omni-pd rules` lists the codes and names"),
        ("OPD009", Severity.WARNING,
         "unused suppression `OPD002`: OPD002 means the file cannot be read; it cannot be suppressed",
         "f.yaml:5:29", "fix the input, and remove `OPD002` from the comment"),
        ("OPD009", Severity.WARNING,
         "suppression names no code: `# omni-pd: ignore` suppresses only the codes in its brackets", "f.yaml:6:11",
         "write `# omni-pd: ignore[OPDnnn]` (codes or rule names, comma-separated; `omni-pd rules`)"),
    ]


def test_unsuppressible_findings_survive_every_mechanism():
    parse = _d("OPD002", 1)
    ds = {"f.yaml": [Directive("f.yaml", 1, 10, 1, (Selector("OPD002", 1, 28),))]}
    out = apply([parse], ds, (Layer("--select/--ignore", ignore=("ALL",)),), KNOWN)
    assert out.kept == [parse] and out.suppressed == []  # the OPD009 about it is ignored with ALL


def test_directive_on_the_key_line_covers_a_value_on_a_later_line():
    text = "stages:\n  - stage_id: 0\n    devices:  # omni-pd: ignore[OPD403]\n      \"0\"\n"
    at_value = _d("OPD403", 4, Severity.WARNING, path=("stages", 0, "devices"))
    ds = {"f.yaml": find_directives(text, "f.yaml")}
    # no key lines given: line 4 only, the directive is unused
    assert [d.code for d in apply([at_value], ds, (), KNOWN).kept] == ["OPD009", "OPD403"]
    out = apply([at_value], ds, (), KNOWN, key_lines={"f.yaml": {("stages", 0, "devices"): 3}})
    assert out.kept == [] and out.suppressed == [at_value]


def test_directive_for_a_code_the_selection_disables_is_reported_not_enabled():
    ds = {"f.yaml": [Directive("f.yaml", 3, 10, 3, (Selector("OPD101", 3, 28),))]}
    layer = Layer("--select/--ignore", ignore=("OPD101",))
    out = apply([_d("OPD101", 3)], ds, (layer,), KNOWN)
    assert [d.message for d in out.kept] == [
        "unused suppression `OPD101`: OPD101 is not enabled for this file (--select/--ignore)"]
    assert [d.code for d in out.suppressed] == ["OPD101"]
    # OPD009 obeys the selection too
    quiet = Layer("--select/--ignore", ignore=("OPD101", "unused-suppression"))
    assert apply([_d("OPD101", 3)], ds, (quiet,), KNOWN).kept == []


def test_a_finding_in_another_file_needs_a_directive_in_that_file():
    ds = {"child.yaml": [Directive("child.yaml", 3, 10, 3, (Selector("OPD101", 3, 28),))]}
    in_base = _d("OPD101", 3, file="base.yaml")
    out = apply([in_base], ds, (), KNOWN)
    assert out.kept[0] is in_base and out.kept[1].code == "OPD009"


def test_opd009_is_placed_by_location_without_reordering_the_findings():
    """validate lists a finding caused by another right after its cause (omni_pd/check/causes.py),
    out of line order; the OPD009s go in by location and the findings keep their order."""
    cause, caused, later = _d("OPD103", 5), _d("OPD101", 2), _d("OPD403", 9, Severity.WARNING)
    ds = {"f.yaml": [Directive("f.yaml", 7, 10, 7, (Selector("OPD701", 7, 28),)),
                     Directive("f.yaml", 1, 10, 1, (Selector("OPD701", 1, 28),))]}
    kept = apply([cause, caused, later], ds, (), KNOWN).kept
    assert [(d.code, d.location.line) for d in kept] == [
        ("OPD009", 1), ("OPD103", 5), ("OPD101", 2), ("OPD009", 7), ("OPD403", 9)]


def test_a_directory_that_cannot_be_read_holds_no_settings(tmp_path, monkeypatch):
    """find_config walks past a directory whose entries cannot be inspected (OSError)."""
    from pathlib import Path

    from omni_pd.check import settings

    (tmp_path / "pyproject.toml").write_text("[tool.omni-pd]\nignore = []\n")
    (tmp_path / "locked").mkdir()
    real = Path.is_file

    def is_file(self):
        if self.parent.name == "locked":
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "is_file", is_file)
    assert settings.find_config(tmp_path / "locked") == (tmp_path / "pyproject.toml").resolve()
