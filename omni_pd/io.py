"""YAML documents at the edge: load with source positions, dump, write atomically.

Everything that touches the file system or parses bytes lives here, so the compiler
passes can stay pure. YAML goes through ruamel.yaml's round-trip mode: comments, key
order and flow style survive a load/dump cycle.

Paths into a document are tuples of keys and list indices, e.g.
``("stages", 0, "kv_transfer_config", "kv_role")``; :class:`SourceMap` turns such a
path into a 1-based ``(line, column)``.
"""

from __future__ import annotations

import io as _io
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .diagnostics import Diagnostic, Location, OmniPdError, Severity

Path_ = tuple[Any, ...]

#: Largest input accepted, in bytes. Deploy configs are a few KiB; this bounds memory.
MAX_INPUT_BYTES = 8 * 1024 * 1024


def _yaml():
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.preserve_quotes = True
    y.width = 4096  # never re-wrap long values or comments
    y.indent(mapping=2, sequence=4, offset=2)
    y.allow_duplicate_keys = False
    # write null as `null` (ruamel's round trip would leave the value empty)
    y.representer.add_representer(
        type(None), lambda rep, _d: rep.represent_scalar("tag:yaml.org,2002:null", "null"))
    return y


_MISSING = object()


def get_path(tree: Any, path: Path_, default: Any = None) -> Any:
    """The value at ``path`` (mapping keys and list indices) in a plain or round-trip
    tree, or ``default`` when any step is missing."""
    node = tree
    for p in path:
        if isinstance(node, dict) and p in node:
            node = node[p]
        elif isinstance(node, list) and isinstance(p, int) and not isinstance(p, bool) and 0 <= p < len(node):
            node = node[p]
        else:
            return default
    return node


def has_path(tree: Any, path: Path_) -> bool:
    """True when every step of ``path`` exists in ``tree``."""
    return get_path(tree, path, _MISSING) is not _MISSING


@dataclass
class SourceMap:
    """1-based (line, column) of every key and sequence item in a document.

    ``key_pos[path]`` is where the key (or list item) at ``path`` starts;
    ``value_pos[path]`` where its value starts (same as the key for list items).
    """

    key_pos: dict[Path_, tuple[int, int]] = field(default_factory=dict)
    value_pos: dict[Path_, tuple[int, int]] = field(default_factory=dict)

    def locate(self, path: Path_, *, value: bool = False) -> tuple[int, int] | None:
        """Position of ``path`` or of its nearest ancestor that has one."""
        table = self.value_pos if value else self.key_pos
        p = tuple(path)
        while p:
            if p in table:
                return table[p]
            p = p[:-1]
        return None


def build_source_map(tree: Any) -> SourceMap:
    """Walk a ruamel round-trip tree and record every key/item position (1-based)."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    sm = SourceMap()
    stack: list[tuple[Path_, Any]] = [((), tree)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, CommentedMap):
            for k, v in node.items():
                p = path + (k,)
                try:
                    kl, kc, vl, vc = node.lc.data[k]
                    sm.key_pos[p] = (kl + 1, kc + 1)
                    sm.value_pos[p] = (vl + 1, vc + 1)
                except (KeyError, TypeError, ValueError):
                    pass
                stack.append((p, v))
        elif isinstance(node, CommentedSeq):
            for i, v in enumerate(node):
                p = path + (i,)
                try:
                    il, ic = node.lc.data[i]
                    sm.key_pos[p] = sm.value_pos[p] = (il + 1, ic + 1)
                except (KeyError, TypeError, ValueError, IndexError):
                    pass
                stack.append((p, v))
    return sm


@dataclass
class Document:
    """A loaded YAML document: its name, raw text, round-trip tree and positions."""

    name: str
    text: str
    tree: Any
    source_map: SourceMap

    def loc(self, path: Path_, *, value: bool = False) -> Location:
        """A :class:`Location` for ``path`` in this document (line/col may be None)."""
        pos = self.source_map.locate(path, value=value)
        if pos is None and not tuple(path):
            pos = (1, 1)  # the document as a whole
        line, col = pos if pos else (None, None)
        return Location(file=self.name, line=line, column=col, path=tuple(path))

    def exists(self, path: Path_) -> bool:
        """True when ``path`` names a key or item of this document."""
        return has_path(self.tree, path)

    def line_text(self, line: int) -> str | None:
        lines = self.text.splitlines()
        return lines[line - 1] if 1 <= line <= len(lines) else None


def _load_error(code: str, name: str, message: str, line: int | None = None,
                col: int | None = None, help: str | None = None,
                related: list | None = None) -> OmniPdError:
    return OmniPdError(
        Diagnostic(code=code, severity=Severity.ERROR, message=message,
                   location=Location(file=name, line=line, column=col),
                   help=help, related=related or []),
        exit_code=2,
    )


def parse_text(text: str, name: str = "<string>") -> Document:
    """Parse YAML text into a :class:`Document`.

    Raises :class:`OmniPdError` (exit 2) with a located diagnostic for syntax errors
    (OPD002), duplicate keys (OPD003, both locations), alias bombs and an empty or
    non-mapping document (OPD004).
    """
    from ruamel.yaml.constructor import DuplicateKeyError
    from ruamel.yaml.error import MarkedYAMLError, YAMLError

    try:
        tree = _yaml().load(text)
    except DuplicateKeyError as e:
        first = e.context_mark
        second = e.problem_mark
        key = ""
        if e.problem and "duplicate key" in e.problem:
            key = e.problem.split("duplicate key", 1)[1].split("\n")[0].split(" with value")[0].strip()
        rel = []
        first_pos = _first_key_pos(text, key.strip("\"'"), second) if second is not None else None
        if first_pos is None and first is not None:
            first_pos = (first.line + 1, first.column + 1)
        if first_pos is not None:
            rel.append(Location(file=name, line=first_pos[0], column=first_pos[1],
                                label="first defined here"))
        raise _load_error(
            "OPD003", name, f"duplicate key {key} (YAML requires unique mapping keys)",
            second.line + 1 if second else None, second.column + 1 if second else None,
            help="remove one of the two entries; a YAML mapping cannot repeat a key",
            related=rel) from None
    except MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        msg = (e.problem or e.context or "invalid YAML").strip()
        raise _load_error("OPD002", name, f"invalid YAML: {msg}",
                          mark.line + 1 if mark else None,
                          mark.column + 1 if mark else None,
                          help="fix the YAML syntax at this position") from None
    except YAMLError as e:
        raise _load_error("OPD002", name, f"invalid YAML: {e}") from None
    except RecursionError:
        raise _load_error("OPD002", name, "invalid YAML: nesting too deep") from None
    from ruamel.yaml.comments import CommentedMap

    if tree is None:
        raise _load_error("OPD004", name, "empty document: expected a deploy config mapping",
                          1, 1, help="a deploy config starts with top-level keys such as `stages:`")
    if not isinstance(tree, CommentedMap):
        raise _load_error("OPD004", name,
                          f"expected a mapping at the top level, found {type(tree).__name__}",
                          1, 1, help="a deploy config starts with top-level keys such as `stages:`")
    _check_alias_expansion(tree, name)
    return Document(name=name, text=text, tree=tree, source_map=build_source_map(tree))


def _first_key_pos(text: str, key: str, mark: Any) -> tuple[int, int] | None:
    """1-based position of the nearest earlier ``key:`` at the duplicate's column."""
    lines = text.splitlines()
    col = mark.column
    for i in range(min(mark.line, len(lines)) - 1, -1, -1):
        ln = lines[i]
        if ln[col:].startswith((f"{key}:", f'"{key}":', f"'{key}':")) and not ln[:col].strip(" -"):
            return (i + 1, col + 1)
    return None


#: Upper bound on nodes reachable through aliases (an alias bomb expands exponentially).
MAX_NODES = 200_000


def _check_alias_expansion(tree: Any, name: str) -> None:
    """Reject documents whose alias-expanded size exceeds :data:`MAX_NODES` (OPD002)."""
    count = 0
    stack = [tree]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise _load_error("OPD002", name,
                              f"document expands to more than {MAX_NODES} nodes (alias bomb?)",
                              help="deploy configs are small; remove recursive anchors/aliases")
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def load_file(path: str | os.PathLike[str]) -> Document:
    """Read and parse a YAML file. Raises :class:`OmniPdError` (exit 2) when the file is
    missing (OPD001), too large, not UTF-8, or not valid YAML."""
    p = Path(path)
    name = str(path)
    try:
        size = p.stat().st_size
        if size > MAX_INPUT_BYTES:
            raise _load_error("OPD001", name,
                              f"file is {size} bytes; inputs over {MAX_INPUT_BYTES} bytes are refused",
                              help="a deploy config is a few KiB; check that this is the right file")
        data = p.read_bytes()
    except FileNotFoundError:
        raise _load_error("OPD001", name, "file not found",
                          help="check the path; `omni-pd expand` with no argument uses the bundled Qwen3-Omni preset") from None
    except IsADirectoryError:
        raise _load_error("OPD001", name, "is a directory, expected a YAML file") from None
    except PermissionError:
        raise _load_error("OPD001", name, "permission denied") from None
    except OSError as e:
        raise _load_error("OPD001", name, f"cannot read file: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise _load_error("OPD001", name, f"not UTF-8 text (invalid byte 0x{data[e.start]:02x})",
                          line, None, help="save the file as UTF-8") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return parse_text(text, name)


def dump(tree: Any) -> str:
    """Serialise a round-trip tree to YAML text (comments and key order kept)."""
    buf = _io.StringIO()
    _yaml().dump(tree, buf)
    return buf.getvalue()


def atomic_write(path: str | os.PathLike[str], text: str, *, protect: list[str] | None = None) -> None:
    """Write ``text`` to ``path`` atomically (temp file in the same folder + rename).

    A failed write leaves no partial output. Raises :class:`OmniPdError` (exit 2) when
    ``path`` is one of the ``protect`` paths (the inputs: never overwritten) or cannot
    be written.
    """
    target = Path(path)
    for other in protect or []:
        try:
            if Path(other).exists() and target.exists() and os.path.samefile(other, target):
                raise _load_error("OPD005", str(path),
                                  "refusing to overwrite the input file",
                                  help="write the result to another path with -o OUT.yaml")
        except OSError:
            pass
    parent = target.parent if str(target.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise _load_error("OPD005", str(path), f"cannot write output: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        mode = 0o644
        if target.exists():
            mode = target.stat().st_mode & 0o777
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise _load_error("OPD005", str(path), f"cannot write output: {e.strerror or e}") from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
