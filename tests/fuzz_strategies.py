"""Fuzz inputs and the outcome check shared by ``tests/test_fuzz.py`` and ``bench/fuzz_long.py``.

Three kinds of input, all bytes written to a file and run through the real CLI entry
(:func:`omni_pd.cli.main`, in process):

* :func:`mutated_documents`: a real deploy config (the bundled preset, the golden
  outputs, ``../shared/cases/*.yaml`` when that folder exists) with 1-4 mutations:
  deleted / duplicated / renamed / retyped keys, re-indented lines, truncation,
  inserted YAML punctuation and unicode, huge and negative numbers, tags, anchors,
  random bytes; or a tree-level edit (a value replaced by a generated one) dumped back;
* :func:`generated_documents`: a deploy-shaped mapping whose values hypothesis builds
  from the schema's own key names (``omni_pd.compile.model``) and hostile scalars;
* :func:`hostile_inputs`: fixed adversarial files (alias bomb, 100k-deep nesting, a
  50 MB file, non-UTF-8, control characters, duplicate keys, complex keys ...) with
  the exact diagnostic each must produce.

:func:`check_outcome` states the contract every run must meet: exit status 0, 1 or 2;
no traceback and no internal error (OPD000); a non-zero exit carries at least one
error diagnostic, and every error diagnostic is located (``--> file:line:col``) unless
its code is one whose subject has no place in the file (:data:`UNLOCATED_OK`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
#: ``../shared/cases`` beside the project root; absent in some CI runs (then skipped).
SHARED_CASES = REPO.parent / "shared" / "cases"


# --- seeds ----------------------------------------------------------------------------

def seed_paths() -> list[Path]:
    """The real deploy configs mutations start from: the bundled preset, every golden
    output, and ``../shared/cases/*.yaml`` when that folder exists."""
    paths = [REPO / "presets" / "qwen3_omni_moe.yaml"]
    paths += sorted((REPO / "tests" / "golden").glob("*.yaml"))
    if SHARED_CASES.is_dir():
        paths += sorted(SHARED_CASES.glob("*.yaml"))
    return paths


def _load_seeds() -> list[tuple[str, str]]:
    return [(p.name, p.read_text(encoding="utf-8")) for p in seed_paths()]


SEEDS: list[tuple[str, str]] = _load_seeds()


def _schema_keys() -> list[str]:
    """Every key name the deploy model knows (top level, stage, KV transfer config)."""
    from omni_pd.compile.model import DeployConfig, KVTransferConfig, Runtime, StageDeploy

    keys: set[str] = set()
    for m in (DeployConfig, StageDeploy, KVTransferConfig, Runtime):
        for name, f in m.model_fields.items():
            keys.add(f.alias or name)
    keys |= {"from", "to", "name", "extra", "stage_args", "engine_input_source", "mooncake_bootstrap_port",
             "VLLM_MOONCAKE_BOOTSTRAP_PORT", "CUDA_VISIBLE_DEVICES", "block_size", "kv_cache_dtype",
             "cuda", "npu", "rocm", "xpu", "musa", "from_stage_0", "to_stage_1", "<<", "x-expect"}
    return sorted(keys)


KEYS: list[str] = _schema_keys()

#: Scalars and small YAML fragments that stress types, limits and the YAML loader.
HOSTILE_VALUES: list[str] = [
    "0", "-1", "1", "2", "65535", "65536", "4294967296", "99999999999999999999999999999999",
    "-99999999999999999999", "1e400", "-1e400", ".nan", ".inf", "-.inf", "0.0", "1.5", "1e-400",
    "0x7fffffffffffffff", "0o777", "0b101", "1_000_000", "+12", "007",
    "true", "false", "yes", "no", "on", "null", "~", "''", '""',
    "[]", "{}", "[1, [2, [3]]]", "{a: {b: {c: 1}}}", "[a, b", "{a: 1", "]", "}",
    "2001-02-30", "2001-12-14t21:59:43.10-05:00", "12:30:45", "0000-01-01",
    "!!int 0x", "!!float abc", "!!bool maybe", "!!binary aGVsbG8=", "!!set {a, b}", "!!omap [a: 1, b: 2]",
    "!!str 5", "!!map [1]", "!custom value", "!!python/object:os.system x", "!!timestamp 2001-13-45",
    "&anchor value", "*anchor", "*undefined_alias", "<<: *anchor",
    "'é中文🙂'", '"\\u0000\\x01\\ud800"', '"\\U0001F600 \\u2028 \\x85"', "'''", '"\\"', "|", ">-",
    "cpu", "CPU", '"0,1"', '"0, 1"', '"0,0"', '"-1"', '"1,a"', '"99999999999999999999"', '"0,1,2,3,4,5,6,7"',
    "kv_producer", "kv_consumer", "kv_both", "MooncakeConnector", "NixlConnector", "P2pNcclConnector",
    "MooncakeConnectorV1", "qwen3_omni_moe", "qwen3_omni_moe_pd", "llm", "no_such_pipeline",
    "stage_args", "? [a, b]", "? {a: 1}", "a: b: c", "- - -", "%YAML 1.1", "---", "...",
]

#: Characters and fragments inserted at random positions of a line.
INSERTS: list[str] = [
    ":", "-", " ", "\t", "{", "}", "[", "]", ",", "#", "&a ", "*a", "!!", "!", "%", "@", "`", "'", '"',
    "|", ">", "?", "<<: *a", "\\", "\x00", "\x07", "\x1b", "\x7f", "\x85", "\u2028", "\ufeff", "\ud7ff",
    "é", "中", "🙂", "\u202e", "\r", "\r\n", "\n", "\n  ", "0", "99999999999999999999", ".nan",
]


# --- text mutations -------------------------------------------------------------------

_KV_LINE = re.compile(r"^(\s*(?:-\s+)*)([^\s:#][^:#]*?)(\s*:)(.*)$")

Mutation = Callable[[Any, list[str]], list[str]]


def _pick_line(draw: Any, lines: list[str]) -> int:
    return draw(st.integers(0, max(len(lines) - 1, 0)))


def _delete_line(draw: Any, lines: list[str]) -> list[str]:
    if lines:
        del lines[_pick_line(draw, lines)]
    return lines


def _duplicate_line(draw: Any, lines: list[str]) -> list[str]:
    if lines:
        i = _pick_line(draw, lines)
        lines.insert(draw(st.integers(0, len(lines))), lines[i])
    return lines


def _retype_value(draw: Any, lines: list[str]) -> list[str]:
    if lines:
        i = _pick_line(draw, lines)
        m = _KV_LINE.match(lines[i])
        if m:
            lines[i] = f"{m.group(1)}{m.group(2)}{m.group(3)} {draw(st.sampled_from(HOSTILE_VALUES))}"
    return lines


def _rename_key(draw: Any, lines: list[str]) -> list[str]:
    if lines:
        i = _pick_line(draw, lines)
        m = _KV_LINE.match(lines[i])
        if m:
            lines[i] = f"{m.group(1)}{draw(st.sampled_from(KEYS))}{m.group(3)}{m.group(4)}"
    return lines


def _reindent(draw: Any, lines: list[str]) -> list[str]:
    if lines:
        i = _pick_line(draw, lines)
        line = lines[i]
        d = draw(st.sampled_from([-4, -2, -1, 1, 2, 3, 4, 8]))
        lead = len(line) - len(line.lstrip(" "))
        lines[i] = " " * max(lead + d, 0) + line.lstrip(" ") if draw(st.booleans()) else "\t" + line
    return lines


def _truncate(draw: Any, lines: list[str]) -> list[str]:
    text = "\n".join(lines)
    return text[: draw(st.integers(0, len(text)))].split("\n")


def _insert(draw: Any, lines: list[str]) -> list[str]:
    if lines:
        i = _pick_line(draw, lines)
        line = lines[i]
        pos = draw(st.integers(0, len(line)))
        frag = draw(st.sampled_from(INSERTS) | st.text(min_size=1, max_size=4))
        lines[i] = line[:pos] + frag + line[pos:]
    return lines


def _swap_lines(draw: Any, lines: list[str]) -> list[str]:
    if len(lines) > 1:
        i, j = _pick_line(draw, lines), _pick_line(draw, lines)
        lines[i], lines[j] = lines[j], lines[i]
    return lines


def _tweak_number(draw: Any, lines: list[str]) -> list[str]:
    if lines:
        i = _pick_line(draw, lines)
        m = re.search(r"\d+", lines[i])
        if m:
            new = draw(st.sampled_from(["0", "-1", "65536", "4294967296", "9" * 30, "1e309", "00", "0x1F", "1.5"]))
            lines[i] = lines[i][: m.start()] + new + lines[i][m.end():]
    return lines


def _duplicate_block(draw: Any, lines: list[str]) -> list[str]:
    """Copy a run of lines (a whole stage entry, a mapping) somewhere else."""
    if lines:
        i = _pick_line(draw, lines)
        n = draw(st.integers(1, 12))
        lines[draw(st.integers(0, len(lines))):0] = lines[i: i + n]
    return lines


TEXT_MUTATIONS: list[Mutation] = [
    _delete_line, _duplicate_line, _retype_value, _rename_key, _reindent, _truncate, _insert,
    _swap_lines, _tweak_number, _duplicate_block,
]


# --- tree mutations -------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def plain_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    """Plain YAML data: schema key names and hostile scalars, nested lists/mappings.
    (Cached: building a recursive strategy per draw costs more than drawing from it.)"""
    scalars = st.one_of(
        st.none(), st.booleans(),
        st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
        st.sampled_from([0, 1, 2, -1, 65535, 65536, 10 ** 30]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=12),
        st.sampled_from(["0", "0,1", "cpu", "kv_producer", "kv_consumer", "MooncakeConnector", "NixlConnector",
                         "qwen3_omni_moe", "llm", "from_stage_0", "é中🙂", "\u2028", "a\x85b"]),
    )
    keys = st.sampled_from(KEYS) | st.text(min_size=1, max_size=8)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(keys, inner, max_size=5), max_leaves=max_leaves)


def _tree_paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix] if prefix else []
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += _tree_paths(v, prefix + (k,))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out += _tree_paths(v, prefix + (i,))
    return out


def _tree_mutation(draw: Any, text: str) -> str:
    """Parse ``text`` (round trip), replace / delete / duplicate one node, dump it back."""
    from omni_pd.io import dump, parse_text

    try:
        doc = parse_text(text, "seed.yaml")
    except Exception:  # an earlier text mutation broke it: leave it broken
        return text
    tree = doc.tree
    paths = _tree_paths(tree)
    if not paths:
        return text
    path = draw(st.sampled_from(paths))
    parent = tree
    for p in path[:-1]:
        parent = parent[p]
    last = path[-1]
    action = draw(st.sampled_from(["replace", "delete", "duplicate", "wrap"]))
    if action == "replace":
        parent[last] = draw(plain_values())
    elif action == "delete":
        del parent[last]
    elif action == "duplicate" and isinstance(parent, list):
        parent.insert(last, parent[last])
    elif action == "wrap":
        parent[last] = [parent[last]] if draw(st.booleans()) else {"x": parent[last]}
    try:
        return dump(tree)
    except Exception:  # ruamel cannot write some generated values (e.g. shared refs): keep the seed
        return text


# --- strategies -----------------------------------------------------------------------

@dataclass
class FuzzInput:
    """One input: the bytes of the file, the file name to give it (the name selects a
    pipeline, e.g. ``qwen3_omni_moe.yaml``) and how it was made (for failure reports)."""

    data: bytes
    name: str
    how: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"FuzzInput(name={self.name!r}, how={self.how!r}, data=\n{self.data.decode('utf-8', 'replace')})"


@st.composite
def mutated_documents(draw: Any) -> FuzzInput:
    """A seed deploy config with 1-4 mutations (text, tree and byte level)."""
    name, text = draw(st.sampled_from(SEEDS))
    how: list[str] = [name]
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.integers(0, 9)) == 0:
            text = _tree_mutation(draw, text)
            how.append("tree")
            continue
        op = draw(st.sampled_from(TEXT_MUTATIONS))
        how.append(op.__name__.lstrip("_"))
        text = "\n".join(op(draw, text.split("\n")))
    data = text.encode("utf-8", "surrogatepass")
    kind = draw(st.integers(0, 9))
    if kind == 0:  # random bytes somewhere (often not UTF-8)
        pos = draw(st.integers(0, len(data)))
        data = data[:pos] + draw(st.binary(min_size=1, max_size=8)) + data[pos:]
        how.append("bytes")
    elif kind == 1:  # cut inside a multi-byte character, or anywhere
        data = data[: draw(st.integers(0, len(data)))]
        how.append("byte-truncate")
    return FuzzInput(data, name, how)


@st.composite
def generated_documents(draw: Any) -> FuzzInput:
    """A deploy-shaped mapping (``pipeline``, ``stages`` with ids, extra keys) whose values
    are generated: exercises the model, the topology and every rule past the loader."""
    from omni_pd.io import dump

    n = draw(st.integers(0, 5))
    stages = []
    for i in range(n):
        st_map: dict[str, Any] = {"stage_id": draw(st.sampled_from([i, i, i, 0, -1, 10 ** 20, "1", None]))}
        st_map.update(draw(st.dictionaries(st.sampled_from(KEYS), plain_values(6), max_size=5)))
        if draw(st.booleans()):
            st_map["kv_transfer_config"] = draw(st.fixed_dictionaries({}, optional={
                "kv_connector": st.sampled_from(["MooncakeConnector", "NixlConnector", "P2pNcclConnector", "X"]),
                "kv_role": st.sampled_from(["kv_producer", "kv_consumer", "kv_both", "x"]),
                "kv_port": st.sampled_from([0, 1, 65535, 65536, -5, 10 ** 20, "30000"]),
                "kv_connector_extra_config": plain_values(6),
            }))
        stages.append(st_map)
    doc: dict[str, Any] = {"stages": stages}
    doc.update(draw(st.fixed_dictionaries({}, optional={
        "pipeline": st.sampled_from(["qwen3_omni_moe", "qwen3_omni_moe_pd", "llm", "qwen2_5_omni", "custom"]),
        "async_chunk": plain_values(2),
        "connectors": plain_values(6),
        "edges": plain_values(6),
        "platforms": plain_values(8),
        "base_config": st.sampled_from(["qwen3_omni_moe.yaml", "missing.yaml", "../x.yaml", ""]),
        "data_parallel_size": plain_values(2),
    })))
    extra = draw(st.dictionaries(st.sampled_from(KEYS), plain_values(4), max_size=3))
    for k, v in extra.items():
        doc.setdefault(k, v)
    try:
        text = dump(doc)
    except Exception:  # e.g. a float ruamel cannot write: fall back to the skeleton
        text = dump({"stages": [{"stage_id": 0}]})
    name = draw(st.sampled_from(["qwen3_omni_moe.yaml", "generated.yaml", "qwen2_5_omni.yaml"]))
    return FuzzInput(text.encode("utf-8", "surrogatepass"), name, ["generated"])


def fuzz_inputs() -> st.SearchStrategy[FuzzInput]:
    """Mutated seeds (3 in 4) and generated documents (1 in 4)."""
    return st.one_of(mutated_documents(), mutated_documents(), mutated_documents(), generated_documents())


#: Command lines every input goes through in the long run (the file path is appended).
COMMANDS: list[list[str]] = [
    ["expand", "-q"],
    ["validate"],
    ["validate", "--all-platforms", "--format", "json"],
]

#: Variants the test suite draws one of per example (one expand, one validate).
EXPAND_COMMANDS: list[list[str]] = [
    ["expand", "-q"], ["expand"], ["expand", "-q", "--connector", "NixlConnector", "--vllm-version", "0.13"],
    ["expand", "-q", "--tp", "2", "--vllm-version", "0.32"],
]
VALIDATE_COMMANDS: list[list[str]] = [
    ["validate"], ["validate", "--format", "json"], ["validate", "--all-platforms"],
    ["validate", "--all-platforms", "--format", "json"], ["validate", "--platform", "npu", "--format", "sarif"],
]


def command_pairs() -> st.SearchStrategy[list[list[str]]]:
    """One expand and one validate command line (without the file)."""
    return st.tuples(st.sampled_from(EXPAND_COMMANDS), st.sampled_from(VALIDATE_COMMANDS)).map(list)


# --- running and checking -------------------------------------------------------------

@dataclass
class Outcome:
    """What one CLI run did."""

    args: list[str]
    rc: Any
    out: str
    err: str


def run_cli(args: list[str]) -> Outcome:
    """Run ``omni-pd ARGS`` in process; stdout/stderr captured. An exception escaping
    :func:`omni_pd.cli.main` (which must never happen) is recorded as ``rc``."""
    from omni_pd.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc: Any = main(list(args))
        except BaseException as e:  # noqa: BLE001 - this is what the fuzz looks for
            if isinstance(e, KeyboardInterrupt):
                raise
            rc = f"escaped {type(e).__name__}: {e}"
    return Outcome(list(args), rc, out.getvalue(), err.getvalue())


#: Codes whose subject has no position in the input file: the file as a whole
#: (too large, unreadable) and command-line usage.
UNLOCATED_OK = frozenset({"OPD001", "OPD006"})

_DIAG = re.compile(r"^(error|warning|info)\[(OPD\d{3})\]: (.*)$")
_LOC = re.compile(r"^\s*--> (.+?)(?::(\d+)(?::(\d+))?)?$")


@dataclass(frozen=True)
class Found:
    """One diagnostic read back from rendered output."""

    severity: str
    code: str
    message: str
    file: str | None
    line: int | None
    column: int | None


def read_diagnostics(text: str) -> list[Found]:
    """Diagnostics in rustc-style text (``error[OPDnnn]: ...`` + ``--> file:line:col``), in
    a ``--format json`` array or in a ``--format sarif`` log."""
    s = text.lstrip()
    if s.startswith(("[", "{")):
        import json
        from urllib.parse import unquote, urlparse

        try:
            data = json.loads(s)
        except ValueError:
            data = None
        if isinstance(data, dict) and data.get("version") == "2.1.0":
            level = {"error": "error", "warning": "warning", "note": "info"}
            out = []
            for r in data["runs"][0]["results"]:
                phys = (r.get("locations") or [{}])[0].get("physicalLocation") or {}
                uri = (phys.get("artifactLocation") or {}).get("uri")
                file = (unquote(urlparse(uri).path) if uri and uri.startswith("file:") else
                        str(Path.cwd() / uri) if uri else None)
                region = phys.get("region") or {}
                out.append(Found(level[r["level"]], r["ruleId"], r["message"]["text"].split("\nhelp: ")[0], file,
                                 region.get("startLine"), region.get("startColumn")))
            return out
        if isinstance(data, list):
            out = []
            for d in data:
                loc = d.get("location") or {}
                out.append(Found(d["severity"], d["code"], d["message"], loc.get("file"), loc.get("line"),
                                 loc.get("column")))
            return out
    found: list[Found] = []
    lines = text.split("\n")  # not splitlines(): it also splits at \x0b, \x85, \u2028 ...
    for i, line in enumerate(lines):
        m = _DIAG.match(line)
        if not m:
            continue
        file = ln = col = None
        if i + 1 < len(lines):
            lm = _LOC.match(lines[i + 1])
            if lm:
                file = lm.group(1)
                ln = int(lm.group(2)) if lm.group(2) else None
                col = int(lm.group(3)) if lm.group(3) else None
        found.append(Found(m.group(1), m.group(2), m.group(3), file, ln, col))
    return found


def check_outcome(o: Outcome, path: str) -> list[str]:
    """Every way ``o`` breaks the contract (empty when it keeps it): exit 0/1/2, no
    traceback, no OPD000, errors present on a non-zero exit and none on exit 0, and
    every error located in ``path`` (line and column) unless its code is in
    :data:`UNLOCATED_OK`, and no raw control character in the diagnostics."""
    problems: list[str] = []
    cmd = " ".join(o.args[:-1])
    if o.rc not in (0, 1, 2):
        problems.append(f"{cmd}: exit status {o.rc!r}")
    both = o.out + o.err
    if "Traceback (most recent call last)" in both:
        problems.append(f"{cmd}: traceback in the output")
    # diagnostics are one record per line and never carry raw control characters
    # (terminal escapes, line separators) from the input; expand's stdout is YAML
    shown = o.err + (o.out if o.args[0] == "validate" else "")
    raw = next((c for c in shown if c != "\n" and not c.isprintable()), None)
    if raw is not None:
        problems.append(f"{cmd}: unescaped character {raw!r} in the diagnostics")
    diags = read_diagnostics(o.err) + (read_diagnostics(o.out) if o.args[0] == "validate" else [])
    internal = [d for d in diags if d.code == "OPD000"]
    if internal:
        problems.append(f"{cmd}: internal error OPD000: {internal[0].message}")
    errors = [d for d in diags if d.severity == "error"]
    if o.rc in (1, 2) and not errors:
        problems.append(f"{cmd}: exit {o.rc} without an error diagnostic")
    if o.rc == 0 and errors:
        problems.append(f"{cmd}: exit 0 with error {errors[0].code}")
    for d in errors:
        if d.code in UNLOCATED_OK or d.code == "OPD000":  # OPD000 is reported above
            continue
        if d.file is None or d.line is None or d.column is None:
            problems.append(f"{cmd}: {d.code} not located (file={d.file}, line={d.line}, col={d.column}): {d.message}")
        elif d.file != path and not d.file.startswith(("<", str(REPO / "presets"))) and "omni_pd" not in d.file:
            problems.append(f"{cmd}: {d.code} located in {d.file}, not in the input {path}")
    if o.args[0] == "expand" and o.rc == 0 and not o.out.startswith("# yaml-language-server: $schema="):
        problems.append(f"{cmd}: exit 0 but no YAML on stdout")
    return problems


def problem_signature(problem: str) -> str:
    """A problem without its numbers and quoted values: one line per distinct bug."""
    s = re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "_", problem)
    return re.sub(r"\d+", "N", s)[:160]


def run_input(inp: FuzzInput, folder: Path, commands: list[list[str]] | None = None) -> tuple[list[str], list[Outcome]]:
    """Write ``inp`` to ``inp.name`` in a fresh subfolder of ``folder`` (so that a
    ``base_config:`` never finds another example's file) and run every command on it.
    Returns the contract violations and the outcomes; the subfolder is removed."""
    import shutil
    import tempfile

    sub = Path(tempfile.mkdtemp(dir=folder))
    path = sub / inp.name
    path.write_bytes(inp.data)
    problems: list[str] = []
    outcomes = []
    try:
        for cmd in commands or COMMANDS:
            o = run_cli(cmd + [str(path)])
            outcomes.append(o)
            problems += check_outcome(o, str(path))
    finally:
        shutil.rmtree(sub, ignore_errors=True)
    return problems, outcomes


# --- hostile inputs -------------------------------------------------------------------

@dataclass(frozen=True)
class Hostile:
    """An adversarial input and the exact diagnostic it must give (exit status 2):
    ``code``, a ``message`` fragment, and ``where`` (``line:col``, ``line`` or None)."""

    name: str
    build: Callable[[], bytes]
    code: str
    message: str
    where: str | None
    related: str | None = None  # ``line:col`` of the "first defined here" note
    slow: bool = False  # seconds of CPU: measured by bench/fuzz_long.py, not run by the test suite


def _laughs() -> bytes:
    text = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    prev = "a"
    for n in "bcdefghi":
        text += f"{n}: &{n} [" + ",".join([f"*{prev}"] * 9) + "]\n"
        prev = n
    return (text + "stages: [{stage_id: 0, x: *i}]\n").encode()


def _deep_alias() -> bytes:
    inner = "[" * 40 + "1" + "]" * 40
    outer = "[" * 40 + "*a" + "]" * 40
    return f"stages: []\na: &a {inner}\nb: {outer}\n".encode()


def _deep_block(levels: int = 1400) -> bytes:
    # about levels**2 / 2 bytes: 1400 levels is ~1 MB of indentation, still under the limit
    return ("stages: []\nx:\n" + "".join(" " * (i + 1) + "a:\n" for i in range(levels))).encode()


HOSTILE: list[Hostile] = [
    Hostile("billion_laughs", _laughs, "OPD002", "document expands to more than 100000 nodes (alias bomb?)", "1:20"),
    Hostile("deep_flow_lists_100k", lambda: ("stages: " + "[" * 100_000 + "]" * 100_000 + "\n").encode(),
            "OPD002", "nesting deeper than 64 levels", "1:73"),
    Hostile("deep_flow_maps_100k", lambda: ("stages: " + "{a: " * 100_000 + "1" + "}" * 100_000 + "\n").encode(),
            "OPD002", "nesting deeper than 64 levels", "1:265"),
    Hostile("deep_block_maps_1400", _deep_block, "OPD002", "nesting deeper than 64 levels", "66:66"),
    Hostile("deep_through_aliases", _deep_alias, "OPD002",
            "document nests deeper than 64 levels", "2:31"),
    Hostile("file_50MB", lambda: b"stages:\n  - stage_id: 0\n    x: " + b"a" * (50 * 1024 * 1024) + b"\n",
            "OPD001", "file is larger than 1048576 bytes", None),
    Hostile("nodes_over_limit", lambda: ("stages: []\nx: [" + "1," * 100_001 + "1]\n").encode(),
            "OPD002", "document has more than 100000 YAML nodes", "2:199995", slow=True),
    Hostile("latin1_byte", lambda: "stages: []\n# caf\xe9\nx: 1\n".encode("latin-1"),
            "OPD001", "not UTF-8 text (invalid byte 0xe9)", "2:6"),
    Hostile("utf16_file", lambda: "stages: []\n".encode("utf-16"), "OPD001", "not UTF-8 text (invalid byte 0xff)", "1:1"),
    Hostile("nul_character", lambda: b"stages: []\nx: a\x00b\n", "OPD002", "character U+0000 is not allowed", "2:5"),
    Hostile("duplicate_key_block", lambda: b"stages:\n  - stage_id: 0\n    devices: \"0\"\n    devices: \"1\"\n",
            "OPD003", 'duplicate key "devices" (YAML requires unique mapping keys)', "4:5", "3:5"),
    Hostile("duplicate_key_flow", lambda: b"stages: [{stage_id: 0, stage_id: 1}]\n",
            "OPD003", 'duplicate key "stage_id" (YAML requires unique mapping keys)', "1:24", "1:11"),
    Hostile("duplicate_key_quoted", lambda: b"stages: []\npipeline: llm\n'pipeline': llm\n",
            "OPD003", 'duplicate key "pipeline" (YAML requires unique mapping keys)', "3:1", "2:1"),
    Hostile("duplicate_key_int_spellings", lambda: b"stages: []\nx:\n  0x1: a\n  1: b\n",
            "OPD003", 'duplicate key "1" (YAML requires unique mapping keys)', "4:3", "3:3"),
    Hostile("sequence_as_key", lambda: b"stages: []\n? [a, b]\n: 1\n",
            "OPD002", "a mapping key must be a scalar, found a sequence", "2:3"),
    Hostile("mapping_as_key", lambda: b"stages: []\n? {a: [1]}\n: 1\n",
            "OPD002", "a mapping key must be a scalar, found a mapping", "2:3"),
    Hostile("impossible_date", lambda: b"stages: []\nx: 2001-02-30\n",
            "OPD002", "cannot read `2001-02-30` as !!timestamp (day is out of range for month)", "2:4"),
    Hostile("bad_int_tag", lambda: b"stages: []\nx: !!int 0x\n", "OPD002", "cannot read `0x` as !!int", "2:4"),
    Hostile("bad_bool_tag", lambda: b"stages: []\nx: !!bool maybe\n", "OPD002", "cannot read `maybe` as !!bool", "2:4"),
    Hostile("omap_duplicate", lambda: b"stages: []\nx: !!omap [a: 1, a: 2]\n",
            "OPD002", "cannot read this sequence as !!omap", "2:4"),
    Hostile("two_documents", lambda: b"stages: []\n---\nstages: []\n", "OPD002", "but found another document", "2:1"),
]


def hostile(name: str) -> Hostile:
    """The :data:`HOSTILE` entry called ``name``."""
    return next(h for h in HOSTILE if h.name == name)
