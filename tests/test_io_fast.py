"""``validate``'s loading path (omni_pd/io.py ``comments=False``: libyaml's events from
ruamel.yaml.clib, ruamel.yaml's composer and round-trip constructor) against the
round-trip loader ``expand`` uses (``comments=True``).

Both must give the same document: every key, value and scalar type (CommentedMap,
ScalarFloat, ...), every key and item position of the source map, and the same
diagnostic, byte for byte, for input either refuses. Compared on the goldens, the
bundled presets, the case files (``tests/cases``, ``../shared/cases``), the 110 deploy
files of the vllm-omni 0.30.0 wheel, YAML corner cases, and hypothesis' mutated and
generated deploy configs; and end to end, ``omni-pd validate`` prints the same with and
without ruamel.yaml.clib. Each corpus test also asserts that the libyaml path really read
the files it should (else it would compare the round-trip loader with itself).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_strategies import SHARED_CASES, generated_documents, mutated_documents
from omni_pd import io as omni_io
from omni_pd.diagnostics import OmniPdError

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(omni_io._fast_classes() is None, reason="ruamel.yaml.clib is not installed")


def _shape(x: object) -> object:
    """Every key, value and Python type of a loaded tree, comparable with ``==`` (keys by
    ``repr``: a tagged key is a TaggedScalar, which compares by identity)."""
    if isinstance(x, dict):
        return (type(x).__name__, [(type(k).__name__, repr(k), _shape(v)) for k, v in x.items()])
    if isinstance(x, list):
        return (type(x).__name__, [_shape(v) for v in x])
    return (type(x).__name__, repr(x))


def _read(text: str, *, comments: bool) -> tuple:
    """What a reader of the document sees: tree, key and value positions, or the error."""
    try:
        doc = omni_io.parse_bytes(text.encode("utf-8", "surrogatepass"), "f.yaml", comments=comments)
    except OmniPdError as e:
        return ("error", e.exit_code, repr(e.diagnostic))
    except Exception as e:  # noqa: BLE001 - a loader crash must be the same crash on both paths
        return ("crash", type(e).__name__, str(e))
    return ("ok", _shape(doc.tree), _positions(doc.source_map.key_pos), _positions(doc.source_map.value_pos))


def _positions(table: dict) -> list:
    return [(repr(path), pos) for path, pos in table.items()]


def _fast(text: str) -> bool:
    """True when the libyaml path reads ``text`` itself (no round-trip fallback)."""
    try:
        omni_io._load_fast(text, node_limit=True)
    except omni_io._Fallback:
        return False
    return True


def _same(text: str) -> None:
    assert _read(text, comments=False) == _read(text, comments=True)


# --- real files ------------------------------------------------------------------------

GOLDENS = sorted((REPO / "tests" / "golden").rglob("*.yaml"))
PRESETS = sorted((REPO / "presets").rglob("*.yaml"))
CASES = sorted((REPO / "tests" / "cases").glob("*.yaml")) + (
    sorted(SHARED_CASES.glob("*.yaml")) if SHARED_CASES.is_dir() else [])
#: libyaml (YAML 1.1) refuses a ':' inside a plain scalar of a flow collection, which the
#: round-trip loader (YAML 1.2) reads: the presets' target facts map connector names to
#: "module:Class" in flow mappings, and the case files' ``x-source: [https://...]``
NOT_FOR_LIBYAML = {"vllm_ascend.yaml"}


def _multi_document(text: str) -> bool:
    """A stream of several YAML documents (``---`` between them): the Kubernetes manifests
    ``render --target kubernetes`` writes (a Deployment and its Service per file), not a
    deploy config. Both loaders refuse a second document (OPD002, asserted equal by
    :func:`_same`); the libyaml path hands it over, as it does every error."""
    return re.search(r"\S[\s\S]*^---(\s|$)", text, flags=re.M) is not None


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(p.parents[1])) for p in paths]


@pytest.mark.parametrize("path", GOLDENS + PRESETS, ids=_ids(GOLDENS + PRESETS))
def test_goldens_and_presets_read_the_same_and_through_libyaml(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    _same(text)
    multi = _multi_document(text)
    if multi:
        assert _read(text, comments=True)[:2] == ("error", 2), "a multi-document manifest is no deploy config"
    assert _fast(text) is (path.name not in NOT_FOR_LIBYAML and not multi)


def _quote_flow_urls(text: str) -> str:
    """``x-source: [https://a, https://b]`` -> ``x-source: ["https://a", "https://b"]``."""
    return re.sub(r"^x-source: \[.*$", lambda m: re.sub(r"(https?://[^\s,\]]+)", r'"\1"', m.group(0)),
                  text, flags=re.M)


@pytest.mark.parametrize("path", CASES, ids=_ids(CASES))
def test_case_files_read_the_same(path: Path) -> None:
    """As written the case files go to the round-trip loader (their ``x-source`` URL in a
    flow list); with that URL quoted libyaml reads them, and the result must not move."""
    text = path.read_text(encoding="utf-8")
    _same(text)
    quoted = _quote_flow_urls(text)
    assert _fast(quoted), "the libyaml path must read the case once its flow URLs are quoted"
    _same(quoted)


def test_the_vllm_omni_wheel_deploy_files_read_the_same(omni_wheel_deploy_dir: Path) -> None:
    files = sorted(omni_wheel_deploy_dir.glob("*.yaml"))
    assert len(files) >= 100
    slow = []
    for f in files:
        text = f.read_text(encoding="utf-8")
        _same(text)
        if not _fast(text):
            slow.append(f.name)
    # hunyuan_image3_dit.yaml has an empty value (`cache_backend:`): libyaml and the
    # round-trip parser place an empty scalar differently, so it goes to the round-trip loader
    assert slow == ["hunyuan_image3_dit.yaml"]


# --- corner cases ------------------------------------------------------------------------

#: (text, read by libyaml itself?) Either way the result must equal the round-trip loader's.
CORNERS = [
    ("stages:\n  - stage_id: 0\n    devices: \"0,1\"\n    engine_args: {tensor_parallel_size: 2}\n", True),
    ("a: é\nb: 日本語\nc: 😀 x\nd: [1, {e: 2}]\n", True),  # columns count characters
    ("base: &b {x: 1, y: 2}\nderived:\n  <<: *b\n  y: 3\n", True),  # merge key
    ("a: &x 1\nb: *x\nc: [&y q, *y]\n", True),
    ("o: 0o17\np: 017\nq: 0x1F\nr: 1_000\ns: .inf\nt: -.Inf\nu: .nan\nv: 1e3\nw: 1.50\nx: +12\n", True),
    ("y: yes\nn: no\non: on\nt: True\nf: FALSE\nn1: ~\nn2: null\n", True),  # YAML 1.2: yes/no/on are strings
    ("m: this is\n  a multi\n  line plain\n", True),
    ("l: |\n  lit\n   eral\n\nk: 1\nf: >-\n  folded\n  text\n\n  para\nc: |+\n  keep\n\n\nz: 1\n", True),
    ("q: \"esc \\/ \\x41 \\u263A \\N \\_ \\\\ \\\"\"\ns: 'it''s'\ndq: \"fold\n  ed\n\n  x\"\n", True),
    ("'quoted key': 1\n\"dq\": 2\nkey with spaces : v\n", True),
    ("a: [1, 2,]\nb: {c: 1,}\nd: [\n  1,\n  2\n]\n", True),
    ("a:\n- b\n- c\nd:\n  - e: 1\n    f: 2\n  - g\n", True),
    ("a: http://x.y/z\nb: '#no comment'\nc: x#y\nd: 2001-12-14\n", True),
    ("x: <<\n", True),  # a plain `<<` resolves to the merge tag: a TaggedScalar that keeps its style
    ("- a\n- b\n", True),  # not a mapping: OPD004 either way
    ("just a string\n", True),
    ("", True),
    ("# only a comment\n", True),
    ("a: 1\na: 2\n", False),  # duplicate key: OPD003 with both places, from the round-trip loader
    ("? [a, b]\n: c\n", False),  # complex key
    ("t: 2001-02-30\n", False),  # malformed timestamp
    ("a:\nb: 1\n", False),  # empty scalar: libyaml places it after the ':'
    ("a:  # why\nb: 1\n", False),
    ("a: !!str 3\nb: !foo x\n", False),  # explicit tags
    ("a: 1\t\nb: 2\n", False),  # the round-trip scanner refuses this tab, libyaml does not
    ("%YAML 1.1\n---\na: yes\n", False),  # 1.1 booleans
    ("a\n...\n...\n", False),  # libyaml: one document; the round-trip parser: a second one
    ("a: 1\r\nb: 2\r\n", False),
    ("a: x\u2028b: y\n", False),
    ("a: {b:1}\n", False),  # YAML 1.2 reads `b:1` as a plain scalar, libyaml refuses it
    ("a: 'unterminated\n", False),
    ("a: b: c\n", False),
    ("*x: 1\n", False),
    ("a: \x07\n", False),  # a control character: ruamel.yaml's reader error and position
    ("[" * 40 + "]" * 40 + "\n", False),  # deeper than FAST_MAX_DEPTH
    ("[" * 100 + "\n", False),  # deeper than MAX_DEPTH: the round-trip scanner's OPD002
]


@pytest.mark.parametrize("text,fast", CORNERS, ids=[repr(t[:30]) for t, _ in CORNERS])
def test_corner_cases_read_the_same(text: str, fast: bool) -> None:
    assert _fast(text) is fast
    _same(text)


def test_node_limit_is_the_round_trip_loaders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(omni_io, "MAX_NODES", 50)
    text = "a: [" + ", ".join(map(str, range(60))) + "]\n"
    assert not _fast(text)
    _same(text)
    assert _read(text, comments=False)[0] == "error"
    assert omni_io.parse_text(text, comments=False, own_output=True).tree["a"][-1] == 59


_FRAGMENTS = ["a", "b", ": ", ":", "\n", "  ", "- ", "[", "]", "{", "}", ", ", "? ", "&x ", "*x", "'q'", '"d\\n"',
              "|\n", ">-\n", " # c", "---\n", "...\n", "1", "0x1F", "1.5", "yes", "~", "null", "2001-01-01", "é",
              "😀", "<<: ", "!!str ", "\t", "%", "\r\n", "0o7", "-1", ".inf", "'", '"', "#"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS), max_size=40).map("".join))
def test_yaml_token_soup_reads_the_same(text: str) -> None:
    _same(text)


@settings(max_examples=150, deadline=None)
@given(inp=mutated_documents())
def test_mutated_deploy_configs_read_the_same(inp) -> None:
    assert _read_bytes(inp.data, comments=False) == _read_bytes(inp.data, comments=True)


@settings(max_examples=100, deadline=None)
@given(inp=generated_documents())
def test_generated_deploy_configs_read_the_same(inp) -> None:
    assert _read_bytes(inp.data, comments=False) == _read_bytes(inp.data, comments=True)


def _read_bytes(data: bytes, *, comments: bool) -> tuple:
    try:
        doc = omni_io.parse_bytes(data, "f.yaml", comments=comments)
    except OmniPdError as e:
        return ("error", e.exit_code, repr(e.diagnostic))
    except Exception as e:  # noqa: BLE001 - a loader crash must be the same crash on both paths
        return ("crash", type(e).__name__, str(e))
    return ("ok", _shape(doc.tree), _positions(doc.source_map.key_pos), _positions(doc.source_map.value_pos))


# --- end to end ---------------------------------------------------------------------------

def _validate_output(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    from omni_pd.cli import main

    rc = main(["validate", *args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_validate_prints_the_same_without_libyaml(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``omni-pd validate`` over the goldens, the presets' deploy files and the case files,
    once through libyaml and once with ruamel.yaml.clib hidden: identical output and exit."""
    deploy = [p for p in GOLDENS + sorted((REPO / "presets").glob("*.yaml")) + CASES]
    args = ["--all-platforms", *map(str, deploy)]
    calls = []
    real = omni_io._load_fast
    monkeypatch.setattr(omni_io, "_load_fast", lambda *a, **k: calls.append(1) or real(*a, **k))
    with_libyaml = _validate_output(args, capsys)
    assert len(calls) >= len(deploy), "validate must read its files through the libyaml path"
    monkeypatch.setattr(omni_io, "_FAST", ())  # as if ruamel.yaml.clib were not installed
    assert omni_io._fast_classes() is None
    without = _validate_output(args, capsys)
    assert with_libyaml == without
    assert "validate: " in with_libyaml[1]


def test_a_wheel_file_with_an_empty_value_validates_the_same(capsys: pytest.CaptureFixture,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             omni_wheel_deploy_dir: Path) -> None:
    files = [str(p) for p in sorted(omni_wheel_deploy_dir.glob("*.yaml"))]
    with_libyaml = _validate_output(["-q", *files], capsys)
    monkeypatch.setattr(omni_io, "_FAST", ())
    assert with_libyaml == _validate_output(["-q", *files], capsys)



def test_a_comment_the_round_trip_parser_cannot_place_is_a_located_opd002(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    """Found by the token-soup property: ruamel.yaml's round-trip parser raises
    NotImplementedError ("overlap in comment") here, which was an internal error (OPD000,
    exit 3) in expand and validate alike."""
    text = ": #\n  |\n\n  "
    for comments in (True, False):
        with pytest.raises(OmniPdError) as e:
            omni_io.parse_text(text, "f.yaml", comments=comments)
        d = e.value.diagnostic
        assert (d.code, d.location.line, d.location.column, e.value.exit_code) == ("OPD002", 1, 3, 2)
        assert d.message == "ruamel.yaml's round-trip loader cannot place this comment (it is next to an empty value)"
    f = tmp_path / "c.yaml"
    f.write_text(text, encoding="utf-8")
    rc, out, err = _validate_output([str(f)], capsys)
    assert rc == 2 and "error[OPD002]" in err and "OPD000" not in out + err
