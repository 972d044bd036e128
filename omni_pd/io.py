"""YAML documents at the edge: load with source positions, dump, write atomically.

Everything that parses bytes lives here, and writing output lives beside it in
:mod:`omni_pd.io_write` (issue 38), so the compiler passes can stay pure. YAML goes through ruamel.yaml's round-trip mode: comments, key
order and flow style survive a load/dump cycle.

Paths into a document are tuples of keys and list indices, e.g.
``("stages", 0, "kv_transfer_config", "kv_role")``; :class:`SourceMap` turns such a
path into a 1-based ``(line, column)``.
"""

from __future__ import annotations

import copy
import io as _io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni_pd.diagnostics import Location, OmniPdError, located_error

Path_ = tuple[Any, ...]

#: Largest input accepted, in bytes. Deploy configs are a few KiB (the largest vllm-omni
#: 0.30.0 ships is 6.5 KiB; a 1024-stage topology is 320 KiB); ruamel.yaml needs about
#: 9 s of CPU and 150 MiB per MiB of dense YAML, so this bounds time and memory.
MAX_INPUT_BYTES = 1024 * 1024

#: Deepest nesting of mappings/sequences accepted (deploy configs nest about 6 levels).
#: Checked while scanning, so ``[[[[...`` fails fast with a position, never as a
#: RecursionError deep inside the YAML composer or a later tree walk.
MAX_DEPTH = 64

#: Upper bound on YAML nodes, counted while composing (before any Python object is
#: built) and again after construction with aliases expanded (an alias bomb, "billion
#: laughs", is small on disk and expands exponentially). A 1024-stage topology has
#: 31k nodes; ruamel.yaml composes about 15k nodes per CPU second.
MAX_NODES = 100_000


class _LoadLimit(Exception):
    """Raised by the bounded loader: a located problem that is not a syntax error."""

    def __init__(self, code: str, message: str, mark: Any = None, help: str | None = None,
                 related: list[tuple[int, int]] | None = None):
        super().__init__(message)
        self.code, self.message, self.mark, self.help = code, message, mark, help
        self.related = related or []


def _node_kind(node: Any) -> str:
    """``scalar`` / ``sequence`` / ``mapping`` for a ruamel node."""
    from ruamel.yaml.nodes import MappingNode, SequenceNode

    return "mapping" if isinstance(node, MappingNode) else "sequence" if isinstance(node, SequenceNode) else "scalar"


def _loader_classes() -> tuple[type, type, type]:
    """ruamel.yaml's round-trip scanner, composer and constructor, bounded.

    * the scanner refuses nesting deeper than :data:`MAX_DEPTH` (flow brackets and
      block indentation) at the offending token;
    * the composer refuses more than :data:`MAX_NODES` nodes;
    * the constructor refuses non-scalar mapping keys (``? [a, b]``), reports a
      duplicate key with the position of both occurrences, and turns the plain Python
      errors ruamel raises for malformed scalars (``2001-02-30``, ``!!int 0x``,
      ``!!bool maybe``) into a located error instead of letting them escape.
    """
    global _LOADER
    if _LOADER is not None:
        return _LOADER
    from ruamel.yaml.composer import Composer
    from ruamel.yaml.constructor import RoundTripConstructor
    from ruamel.yaml.error import MarkedYAMLError
    from ruamel.yaml.nodes import ScalarNode
    from ruamel.yaml.scanner import RoundTripScanner

    class Scanner(RoundTripScanner):
        def _check_depth(self) -> None:
            if len(self.indents) + len(self.flow_context) > MAX_DEPTH:
                raise _LoadLimit("OPD002", f"nesting deeper than {MAX_DEPTH} levels",
                                 self.reader.get_mark(),
                                 help=f"deploy configs nest a few levels; flatten this value "
                                      f"(at most {MAX_DEPTH} nested mappings/lists)")

        def fetch_flow_collection_start(self, TokenClass: Any, to_push: Any) -> None:
            self._check_depth()
            super().fetch_flow_collection_start(TokenClass, to_push)

        def add_indent(self, column: int) -> bool:
            added = super().add_indent(column)
            if added:
                self._check_depth()
            return added

    class BoundedComposer(Composer):
        _count = 0
        node_limit = True  # False for omni-pd's own output (see parse_text)

        def compose_node(self, parent: Any, index: Any) -> Any:
            self._count += 1
            if self._count > MAX_NODES and self.node_limit:
                mark = self.parser.peek_event().start_mark if self.parser.check_event() else None
                raise _LoadLimit("OPD002", f"document has more than {MAX_NODES} YAML nodes", mark,
                                 help="a deploy config has a few hundred; check that this is the right file")
            return super().compose_node(parent, index)

    class Constructor(RoundTripConstructor):
        def construct_object(self, node: Any, deep: bool = False) -> Any:
            try:
                return super().construct_object(node, deep=deep)
            except (MarkedYAMLError, _LoadLimit, RecursionError):
                raise
            except (ValueError, TypeError, KeyError, IndexError, AssertionError, OverflowError,
                    AttributeError) as e:
                shown = node.value if isinstance(node, ScalarNode) else None
                what = f"`{shown[:40]}`" if isinstance(shown, str) and shown else f"this {_node_kind(node)}"
                tag = str(node.tag) if getattr(node, "tag", None) else ""
                tag = tag.replace("tag:yaml.org,2002:", "!!")
                why = str(e) or type(e).__name__
                raise _LoadLimit("OPD002", f"invalid YAML: cannot read {what}" + (f" as {tag}" if tag else "")
                                 + f" ({why})", node.start_mark,
                                 help="write a plain value here, e.g. quote it to make it a string") from None

        def check_mapping_key(self, node: Any, key_node: Any, mapping: Any, key: Any, value: Any) -> bool:
            if not isinstance(key_node, ScalarNode):
                raise _LoadLimit("OPD002", f"invalid YAML: a mapping key must be a scalar, found a {_node_kind(key_node)}",
                                 key_node.start_mark, help="write a plain key such as `name:`")
            if key in mapping:
                first = next((kn for kn, _ in node.value if kn is not key_node
                              and self.constructed_objects.get(kn, _MISSING) == key), None)
                rel = [(first.start_mark.line + 1, first.start_mark.column + 1)] if first is not None else []
                shown = key_node.value if isinstance(key_node.value, str) else str(key)
                if len(shown) > 60:
                    shown = shown[:57] + "..."
                raise _LoadLimit("OPD003", f'duplicate key "{shown}" (YAML requires unique mapping keys)',
                                 key_node.start_mark, related=rel,
                                 help="remove one of the two entries; a YAML mapping cannot repeat a key")
            return True

        def check_set_key(self, node: Any, key_node: Any, setting: Any, key: Any) -> None:
            if not isinstance(key_node, ScalarNode):
                raise _LoadLimit("OPD002", f"invalid YAML: a set member must be a scalar, found a {_node_kind(key_node)}",
                                 key_node.start_mark)
            super().check_set_key(node, key_node, setting, key)

    _LOADER = (Scanner, BoundedComposer, Constructor)
    return _LOADER


_LOADER: tuple[type, type, type] | None = None


class _Fallback(Exception):
    """The libyaml fast path cannot promise the round-trip loader's result for this
    input; :func:`parse_text` loads it with the round-trip loader instead."""


#: Composition depth past which the fast path hands the text to the round-trip loader,
#: whose scanner enforces :data:`MAX_DEPTH` (and words its error). The scanner's depth
#: (open block indents plus open flow brackets) never exceeds the number of open
#: collections, so every document the round-trip loader rejects for depth is handed
#: over. Deploy configs nest about 6 levels.
FAST_MAX_DEPTH = 32


def _not_fast(text: str) -> bool:
    """True for input the fast path hands to the round-trip loader unread: ``%``
    directives (a ``%YAML 1.1`` line changes how the round-trip loader resolves scalars),
    ``...`` document end markers (libyaml reads ``a\\n...\\n...`` as one document, the
    round-trip parser finds a second),
    tabs (the round-trip scanner refuses some that libyaml reads, e.g. after a value),
    line breaks other than ``\\n`` (``\\r``, NEL, LS, PS: libyaml and ruamel.yaml count
    lines differently), a byte-order mark past the start, and every character
    ruamel.yaml's reader refuses (its ``NON_PRINTABLE``), so the reader's error and
    position are ruamel's. ASCII text (nearly every deploy config) is checked without
    compiling the full Unicode class."""
    import re

    if "\t" in text or "\r" in text or text.startswith(("%", "...")) or "\n%" in text or "\n..." in text:
        return True
    if text.isascii():
        return re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", text) is not None
    return re.search("[\x85\u2028\u2029\ufeff]|[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010FFFF]",
                     text) is not None


def _fast_classes() -> tuple[type, type, type] | None:
    """libyaml's event parser (``_ruamel_yaml.CParser``, from ruamel.yaml.clib), the
    bounded composer and the round-trip constructor of :func:`_loader_classes`; None
    when ruamel.yaml.clib is not installed.

    The nodes carry libyaml's marks, which equal ruamel.yaml's for every node except an
    empty scalar (``key:`` with no value): libyaml puts it right after the ``:``, the
    round-trip parser at the next token or, when a comment follows the ``:``, after it.
    The composer therefore hands any document with an empty scalar, or nesting deeper
    than :data:`FAST_MAX_DEPTH`, to the round-trip loader (:class:`_Fallback`).
    """
    global _FAST
    if _FAST is not None:
        return _FAST or None
    try:
        from _ruamel_yaml import CParser
    except ImportError:
        _FAST = ()
        return None
    _, BoundedComposer, Constructor = _loader_classes()

    class FastComposer(BoundedComposer):
        _depth = 0
        # plain attributes set by _EventLoader, in place of the base class's properties
        # that look them up on the loader at every event
        parser: Any = None
        resolver: Any = None

        def compose_node(self, parent: Any, index: Any) -> Any:
            self._depth += 1
            if self._depth > FAST_MAX_DEPTH:
                raise _Fallback("deep nesting")
            if getattr(self.parser.peek_event(), "tag", None) is not None:
                # an explicit tag (``!!str 3``, ``!foo x``): the round-trip parser keeps
                # the tag's handle and builds a TaggedScalar where libyaml's resolved
                # tag string gives a plain value
                raise _Fallback("explicit tag")
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def compose_scalar_node(self, anchor: Any) -> Any:
            event = self.parser.peek_event()
            if not event.style:
                if event.value == "":
                    raise _Fallback("empty scalar")
                # plain: libyaml says '', ruamel.yaml None, and a TaggedScalar keeps it
                # (``x: <<`` resolves to the merge tag)
                event.style = None
            return super().compose_scalar_node(anchor)

    class FastConstructor(Constructor):
        composer: Any = None
        resolver: Any = None

    _FAST = (CParser, FastComposer, FastConstructor)
    return _FAST


_FAST: tuple[type, type, type] | tuple[()] | None = None


class _NoDirective:
    """Stands in for the round-trip scanner where ruamel.yaml's resolver asks it which
    ``%YAML`` version the document declared."""

    yaml_version = None


class _EventLoader:
    """The object ruamel.yaml's composer and constructor ask for their parser, resolver
    and settings (in place of a ``YAML`` instance or a ``Loader`` class)."""

    def __init__(self, text: str, classes: tuple[type, type, type], node_limit: bool):
        from ruamel.yaml.resolver import VersionedResolver

        parser, composer, constructor = classes
        self.comment_handling = None
        self.max_depth = None  # ruamel.yaml 0.19's own composer depth check: ours is FAST_MAX_DEPTH
        # what the resolver reads for the YAML version: none declared (a %YAML directive
        # never reaches this path), as the round-trip scanner says without one
        self._scanner = _NoDirective()
        self._parser = parser(text)
        self._resolver = VersionedResolver(loader=self)
        self._composer = composer(loader=self)
        self._composer.parser, self._composer.resolver = self._parser, self._resolver
        self._composer.node_limit = node_limit
        self._constructor = constructor(preserve_quotes=True, loader=self)
        self._constructor.composer, self._constructor.resolver = self._composer, self._resolver
        self._constructor.allow_duplicate_keys = False

    def load(self) -> Any:
        try:
            return self._constructor.get_single_data()
        finally:
            dispose = getattr(self._parser, "dispose", None)
            if dispose is not None:
                dispose()


def _load_fast(text: str, node_limit: bool) -> Any:
    """The round-trip tree of ``text`` (without comments) built from libyaml's events,
    or raise :class:`_Fallback` when the round-trip loader must read it: ruamel.yaml.clib
    missing, input :func:`_not_fast` refuses, or any problem at all (a syntax error,
    a limit, a duplicate key: the round-trip loader then reports it as always)."""
    classes = _fast_classes()
    if classes is None or _not_fast(text):
        raise _Fallback("not for the fast path")
    try:
        return _EventLoader(text, classes, node_limit).load()
    except _Fallback:
        raise
    except Exception as e:  # anything else: the round-trip loader reads it and reports it
        raise _Fallback(type(e).__name__) from None


def _yaml():
    from ruamel.yaml import YAML

    y = YAML(typ="rt")
    y.Scanner, y.Composer, y.Constructor = _loader_classes()
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


def copy_tree(node: Any, memo: dict[int, Any] | None = None) -> Any:
    """``copy.deepcopy`` of a round-trip tree, in time linear in its size.

    ruamel.yaml's own ``CommentedSeq.__deepcopy__`` (0.18, 0.19) copies the sequence's
    comment and line/column attributes once per item instead of once, and
    ``copy_attributes`` drops the memo, so copying a ``stages:`` list of n mappings
    costs O(n^2) (bench/RESULTS.md, figure 3). Same result as ``copy.deepcopy``: items
    are copied with one shared memo (aliases stay shared), then each ruamel attribute
    (comments, flow style, positions, anchor, tag, merge) once with its own memo, as
    ruamel does (merge keys therefore come out as ruamel's deepcopy makes them).
    """
    from ruamel.yaml.comments import Anchor, Comment, CommentedMap, CommentedSeq, Format, LineCol, Tag, merge_attrib

    if memo is None:
        memo = {}
    if id(node) in memo:
        return memo[id(node)]
    if isinstance(node, CommentedMap):
        res: Any = node.__class__()
        memo[id(node)] = res
        for k in node:
            res[k] = copy_tree(node[k], memo)
    elif isinstance(node, CommentedSeq):
        res = node.__class__()
        memo[id(node)] = res
        list.extend(res, [copy_tree(v, memo) for v in node])
    else:
        return copy.deepcopy(node, memo)
    # the attributes ruamel's CommentedBase.copy_attributes copies
    for attr in (Comment.attrib, Format.attrib, LineCol.attrib, Anchor.attrib, Tag.attrib, merge_attrib):
        if hasattr(node, attr):
            setattr(res, attr, copy.deepcopy(getattr(node, attr)))
    return res


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


def parse_text(text: str, name: str = "<string>", *, own_output: bool = False,
               comments: bool = True) -> Document:
    """Parse YAML text into a :class:`Document`.

    Raises :class:`OmniPdError` (exit 2) with a located diagnostic for syntax errors,
    malformed scalars, non-scalar keys, nesting deeper than :data:`MAX_DEPTH`, more than
    :data:`MAX_NODES` nodes and alias bombs (OPD002), duplicate keys (OPD003, both
    locations), and an empty or non-mapping document (OPD004).

    ``own_output=True`` is for text omni-pd wrote itself from an input that passed
    these checks (``expand`` re-reads its result): no node limit there, since a split
    adds nodes and an input just under the limit must not fail on its own output.

    ``comments=False`` is for readers that never write the tree back (``validate``):
    the tree is the round-trip loader's (same keys, values, scalar types and positions)
    without comments, built from libyaml's events when ruamel.yaml.clib is installed,
    about 5x faster (bench/RESULTS.md, figure 5). Anything that path cannot promise to
    read exactly as the round-trip loader does (:func:`_load_fast`), including every
    error, is read by the round-trip loader, so diagnostics are the same either way.
    """
    from ruamel.yaml.error import MarkedYAMLError, YAMLError
    from ruamel.yaml.reader import ReaderError

    tree: Any = _MISSING
    if not comments:
        try:
            tree = _load_fast(text, node_limit=not own_output)
        except _Fallback:
            pass
    try:
        if tree is _MISSING:
            y = _yaml()
            y.composer.node_limit = not own_output
            tree = y.load(text)
    except _LoadLimit as e:
        mark = e.mark
        rel = [Location(file=name, line=ln, column=col, label="first defined here") for ln, col in e.related]
        raise located_error(e.code, name, e.message, mark.line + 1 if mark else None,
                          mark.column + 1 if mark else None, help=e.help, related=rel) from None
    except ReaderError as e:  # a character YAML does not allow (control characters, ...)
        pos = e.position if isinstance(e.position, int) and 0 <= e.position <= len(text) else None
        line = text.count("\n", 0, pos) + 1 if pos is not None else None
        col = pos - (text.rfind("\n", 0, pos) + 1) + 1 if pos is not None else None
        ch = e.character if isinstance(e.character, int) else None
        raise located_error("OPD002", name, "invalid YAML: character "
                          + (f"U+{ch:04X} " if ch is not None else "") + "is not allowed in YAML",
                          line, col, help="remove the character, or write it as an escape in a double-quoted string") from None
    except MarkedYAMLError as e:  # in the user's terms, at the `{` left open (omni_pd/io_errors.py)
        from omni_pd.io_errors import syntax_diagnostic

        raise OmniPdError(syntax_diagnostic(e, text, name), exit_code=2) from None
    except YAMLError as e:
        raise located_error("OPD002", name, f"invalid YAML: {e}") from None
    except RecursionError:  # not reached below MAX_DEPTH; kept as a last guard
        raise located_error("OPD002", name, "invalid YAML: nesting too deep") from None
    except NotImplementedError as e:
        # the round-trip parser cannot attach some comments next to an empty value
        # (ruamel.yaml tokens.py move_old_comment: "overlap in comment"), e.g. `: #` over a
        # `|` block; it was an internal error (exit 3) before
        line, col = _comment_position(e)
        raise located_error("OPD002", name, "ruamel.yaml's round-trip loader cannot place this comment "
                          "(it is next to an empty value)", line, col,
                          help="move the comment to a line of its own, or give the value") from None
    from ruamel.yaml.comments import CommentedMap

    if tree is None:
        raise located_error("OPD004", name, "empty document: expected a deploy config mapping",
                          1, 1, help="a deploy config starts with top-level keys such as `stages:`")
    if not isinstance(tree, CommentedMap):
        raise located_error("OPD004", name,
                          f"expected a mapping at the top level, found {_value_kind(tree)}",
                          1, 1, help="a deploy config starts with top-level keys such as `stages:`")
    _check_alias_expansion(tree, name, node_limit=not own_output)
    return Document(name=name, text=text, tree=tree, source_map=build_source_map(tree))


def _comment_position(e: BaseException) -> tuple[int | None, int | None]:
    """1-based (line, column) of the comment ruamel.yaml's ``move_old_comment`` failed to
    move (its ``c`` in the raising frame), else of the token carrying it, else (1, 1)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    local = tb.tb_frame.f_locals if tb is not None else {}
    comment = local.get("c")
    for cand in ([c for c in comment if c is not None] if isinstance(comment, list) else []) + [local.get("self")]:
        mark = getattr(cand, "start_mark", None)
        if mark is not None and isinstance(getattr(mark, "line", None), int):
            return mark.line + 1, mark.column + 1
    return 1, 1


def _check_alias_expansion(tree: Any, name: str, *, node_limit: bool = True) -> None:
    """Reject documents whose alias-expanded tree has more than :data:`MAX_NODES` nodes
    or nests deeper than :data:`MAX_DEPTH` (OPD002, at the node where the limit is
    crossed). Iterative: the check itself cannot exhaust the stack."""
    count = 0
    stack: list[tuple[Any, int, tuple[int, int] | None]] = [(tree, 0, None)]
    while stack:
        node, depth, pos = stack.pop()
        count += 1
        over = node_limit and count > MAX_NODES
        if over or depth > MAX_DEPTH:
            msg = (f"document expands to more than {MAX_NODES} nodes (alias bomb?)" if over
                   else f"document nests deeper than {MAX_DEPTH} levels")
            raise located_error("OPD002", name, msg, *(pos or (None, None)),
                              help="deploy configs are small and shallow; check anchors/aliases that nest or repeat")
        if isinstance(node, (dict, list)):
            lc = getattr(getattr(node, "lc", None), "data", None) or {}
            items = node.items() if isinstance(node, dict) else enumerate(node)
            for k, v in items:
                try:
                    p = lc.get(k)
                    child = (p[0] + 1, p[1] + 1) if p else pos
                except (TypeError, IndexError):
                    child = pos
                stack.append((v, depth + 1, child))


def _value_kind(value: Any) -> str:
    """A YAML value's kind in words (``a list``, ``a string``), for messages."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "null" if value is None else type(value).__name__


def load_file(path: str | os.PathLike[str], *, comments: bool = True) -> Document:
    """Read and parse a YAML file. Raises :class:`OmniPdError` (exit 2) when the file is
    missing (OPD001), too large, not UTF-8, or not valid YAML. ``comments``: as in
    :func:`parse_text`."""
    p = Path(path)
    name = str(path)
    too_big = located_error("OPD001", name, f"file is larger than {MAX_INPUT_BYTES} bytes; larger inputs are refused",
                          help="a deploy config is a few KiB; check that this is the right file")
    try:
        if p.stat().st_size > MAX_INPUT_BYTES:
            raise too_big
        # read at most one byte past the limit: a pipe, /dev/stdin or /dev/zero reports
        # size 0 and could otherwise fill memory
        with open(p, "rb") as f:
            data = f.read(MAX_INPUT_BYTES + 1)
        if len(data) > MAX_INPUT_BYTES:
            raise too_big
    except FileNotFoundError:
        raise located_error("OPD001", name, "file not found",
                          help="check the path") from None
    except IsADirectoryError:
        raise located_error("OPD001", name, "is a directory, expected a YAML file") from None
    except PermissionError:
        raise located_error("OPD001", name, "permission denied") from None
    except OSError as e:
        raise located_error("OPD001", name, f"cannot read file: {e.strerror or e}") from None
    return parse_bytes(data, name, comments=comments)


def load_stream(stream: Any, name: str = "<stdin>", *, comments: bool = True) -> Document:
    """Read and parse YAML from a binary stream (``sys.stdin.buffer``), at most
    :data:`MAX_INPUT_BYTES` bytes. Raises :class:`OmniPdError` (exit 2) like :func:`load_file`."""
    data = stream.read(MAX_INPUT_BYTES + 1)
    if isinstance(data, str):
        data = data.encode("utf-8")
    if len(data) > MAX_INPUT_BYTES:
        raise located_error("OPD001", name, f"input is larger than {MAX_INPUT_BYTES} bytes; larger inputs are refused",
                          help="a deploy config is a few KiB; check that this is the right input")
    return parse_bytes(data, name, comments=comments)


def parse_bytes(data: bytes, name: str, *, comments: bool = True) -> Document:
    """Decode ``data`` as UTF-8 (a leading BOM dropped) and parse it (``comments``: as in
    :func:`parse_text`). Raises :class:`OmniPdError` OPD001 (located at the bad byte) for
    text that is not UTF-8."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        line_start = data.rfind(b"\n", 0, e.start) + 1
        col = len(data[line_start: e.start].decode("utf-8", "replace")) + 1
        raise located_error("OPD001", name, f"not UTF-8 text (invalid byte 0x{data[e.start]:02x})",
                          line, col, help="save the file as UTF-8") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return parse_text(text, name, comments=comments)


def dump(tree: Any) -> str:
    """Serialise a round-trip tree to YAML text (comments and key order kept)."""
    buf = _io.StringIO()
    _yaml().dump(tree, buf)
    return buf.getvalue()
