"""``omni-pd validate``'s run over its inputs, and the helpers the other commands share with
it (source lines for diagnostics, suppression layers, the status line). No typer here: the
console entry point (:mod:`omni_pd.cli_entry`) runs a plain ``omni-pd validate FILE...``
through :func:`run_default` without building the typer app, and the typer command
(:func:`omni_pd.cli.commands.validate.validate`) parses every option and calls :func:`run_validate`: one body
for both (bench/coldstart_peers.py, issue 38).
"""

import contextlib
import os
import sys
from pathlib import Path
from typing import Optional

from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity


class _no_pydantic_plugins:
    """Context: pydantic builds the classes imported inside without looking for plugins
    (``PYDANTIC_DISABLE_PLUGINS``, restored on exit). Looking reads every installed
    distribution's entry points (importlib.metadata), about 2 % of a cold
    ``omni-pd validate FILE`` (bench/RESULTS.md figure 5); a plugin observing omni-pd's
    own schema classes has nothing to observe. typer builds its option adapters the same
    way. Not for a block that starts processes: they would inherit the variable."""

    _KEY = "PYDANTIC_DISABLE_PLUGINS"
    #: pydantic's plugin lookup (``create_schema_validator`` imports it for every class it
    #: builds); the module imports importlib.metadata, about 7 % of a cold ``omni-pd
    #: validate FILE`` (bench/RESULTS.md, issue 38), to answer "no plugins" here
    _LOADER = "pydantic.plugin._loader"

    def __enter__(self) -> None:
        self._prev = os.environ.get(self._KEY)
        os.environ[self._KEY] = "__all__"
        # while the variable is set, pydantic's own get_plugins() answers () before it reads
        # anything; a stand-in gives that answer without importing importlib.metadata, and is
        # gone on exit (a lookup after the block imports the real module)
        self._stub = None
        if self._LOADER not in sys.modules:
            import types

            self._stub = types.ModuleType(self._LOADER, "omni-pd's stand-in while plugins are off")
            self._stub.get_plugins = lambda: ()
            sys.modules[self._LOADER] = self._stub

    def __exit__(self, *exc) -> None:
        if self._prev is None:
            os.environ.pop(self._KEY, None)
        else:
            os.environ[self._KEY] = self._prev
        if self._stub is not None and sys.modules.get(self._LOADER) is self._stub:
            del sys.modules[self._LOADER]
            parent = sys.modules.get(self._LOADER.rpartition(".")[0])
            if parent is not None and getattr(parent, "_loader", None) is self._stub:
                delattr(parent, "_loader")


def _line_source(docs: dict):
    """Source line lookup for diagnostics: ``docs`` (name -> the documents the command
    itself loaded, passed explicitly: nothing is kept between commands) first, else the
    file as it is on disk now."""
    from omni_pd.io import MAX_INPUT_BYTES

    cache: dict[str, list[str] | None] = {}

    def get(file: str, line: int):
        d = docs.get(file)
        if d is not None:
            return d.line_text(line)
        if file not in cache:
            try:
                p = Path(file)
                cache[file] = (p.read_text(encoding="utf-8", errors="replace").splitlines()
                               if p.is_file() and p.stat().st_size <= MAX_INPUT_BYTES else None)
            except OSError:
                cache[file] = None
        lines = cache[file]
        return lines[line - 1] if lines and 1 <= line <= len(lines) else None
    return get


def _emit_diags(diags, docs: dict | None = None) -> None:
    """Render ``diags`` on stderr, source lines from ``docs`` (see :func:`_line_source`)."""
    from omni_pd.diagnostics import render_text, sort_key

    if not diags:
        return
    sys.stderr.write(render_text(sorted(diags, key=sort_key), _line_source(docs or {})))
    sys.stderr.flush()


def _hidden(n: int) -> str:
    """``"; 2 suppressed"`` for a verdict line, "" for none."""
    return f"; {n} suppressed" if n else ""


def _cli_layer(select: Optional[list[str]], ignore: Optional[list[str]], known: dict):
    """The :class:`~omni_pd.check.suppress.Layer` of ``--select``/``--ignore`` (validate's
    and launch's). ``known`` (code -> rule name) is filled when a selector needs it. Raises
    OPD006 (exit 2) for a selector that names no code."""
    from omni_pd import cli_options
    from omni_pd.check.suppress import Layer

    if (select or ignore) and not known:
        from omni_pd.check.settings import known_codes

        known.update(known_codes())
    return Layer(source="--select/--ignore", select=cli_options.selectors(select, "--select", known),
                 ignore=cli_options.selectors(ignore, "--ignore", known) or ())


def _selection_layers(name: str, cli_layer, known: dict, configs: dict) -> tuple:
    """The selection layers for input ``name``: its settings file's (omni_pd/check/settings.py
    ``find_config``, from the file's directory; stdin: the working directory), then the
    command line's. ``configs``: settings file -> Layer, read once per run."""
    from omni_pd.check.settings import find_config, known_codes, load_layer

    cfg = find_config(Path.cwd() if name == "-" else Path(name).parent)
    if cfg is None:
        return (cli_layer,)
    if cfg not in configs:
        if not known:
            known.update(known_codes())
        configs[cfg] = load_layer(cfg, known)
    return (configs[cfg], cli_layer)


def _suppress(diags: list, docs: dict, layers: tuple, known: dict) -> tuple:
    """``diags`` of one input without the suppressed ones (omni_pd/check/suppress.py
    ``apply``, directives read from every document the run read), and how many were hidden.
    ``known`` (code -> rule name) is filled on first need, and shared across the run."""
    from omni_pd.check.suppress import apply, find_directives

    directives = {n: find_directives(d.text, n) for n, d in docs.items()}
    directives = {n: ds for n, ds in directives.items() if ds}
    if not directives and all(ly.select is None and not ly.ignore and not ly.per_file_ignores for ly in layers):
        return diags, 0  # nothing to suppress with
    if not known:
        from omni_pd.check.settings import known_codes

        known.update(known_codes())
    key_lines = {n: {x.location.path: docs[n].loc(x.location.path).line for x in diags
                     if x.location and x.location.file == n and x.location.path}
                 for n in directives}
    abs_path = {n: n if n.startswith("<") else Path(n).resolve().as_posix() for n in docs}
    out = apply(diags, directives, layers, known, key_lines=key_lines, abs_path=abs_path)
    return out.kept, len(out.suppressed)


def _display_name(name: str) -> str:
    return "<stdin>" if name == "-" else name


def _validate_one(name: str, opts, against: bool, python: Optional[str], model: Optional[str]):
    """Load and validate one input (``-`` = stdin): its diagnostics and the documents read.
    Raises OmniPdError for an unreadable input (OPD001..OPD005, exit 2)."""
    from omni_pd.check.validate import validate_document
    from omni_pd.io import load_file, load_stream

    # comments=False: validate never writes the tree back, so libyaml may read it (io.parse_text)
    doc = load_stream(sys.stdin.buffer, "<stdin>", comments=False) if name == "-" else load_file(name, comments=False)
    res = validate_document(doc, opts)
    found = list(res.diagnostics)
    if against:
        from omni_pd.upstream.against import against_vllm_omni as run_against

        base = (res.pipeline_name or "qwen3_omni_moe").removesuffix("_pd")
        with _status(f"{_display_name(name)}: asking vllm-omni") as say:
            if name != "-" and Path(name).is_file():  # vllm-omni reads the file itself (base_config resolves beside it)
                found += run_against(Path(name), python=python, model=model, model_type=base,
                                     pipeline=res.pipeline_name, progress=say)
            else:  # a pipe (/dev/stdin, -) is already consumed: hand vllm-omni the text omni-pd read
                import tempfile

                with tempfile.TemporaryDirectory(prefix="omni-pd-against-") as tmp:
                    copy = Path(tmp) / "stdin.yaml"
                    copy.write_text(doc.text, encoding="utf-8")
                    found += run_against(copy, python=python, model=model, model_type=base,
                                         pipeline=res.pipeline_name, progress=say)
    return found, res.docs


@contextlib.contextmanager
def _status(title: str, console=None):
    """A rich status line (spinner) on stderr while a slow step runs, when stderr is a
    terminal (or ``console`` is given): yields ``say(text)``, which shows
    ``title: text``. Elsewhere (pipes, CI logs) yields None and prints nothing."""
    if console is None:
        if not sys.stderr.isatty():
            yield None
            return
        from rich.console import Console

        console = Console(stderr=True)
    from rich.markup import escape

    with console.status(escape(title)) as st:
        yield lambda text: st.update(escape(f"{title}: {text}"))


#: Young-generation threshold of the cyclic garbage collector while a command runs
#: (Python's default is 700 allocations). A run imports typer, pydantic and ruamel.yaml
#: and builds acyclic data; collecting every 700 allocations costs about 5 % of a
#: ``validate`` run's CPU time for nothing (bench/RESULTS.md, figure 5).
GC_THRESHOLD_0 = 50_000


def _fix_file(name: str, diags: list, mode: str) -> tuple[bool, int]:
    """``--fix``/``--diff`` for one input: the edits the findings carry (only those located in
    ``name`` itself, not in a ``base_config`` it reads) applied to its text
    (:func:`omni_pd.check.fix.apply_edits`). ``mode`` ``"diff"`` prints the unified diff and
    writes nothing; ``"fix"`` writes the file back atomically (the one case where omni-pd
    rewrites an input: the user asked for it) and says on stderr how many it applied and which
    it skipped. Returns (changed, edits applied)."""
    from omni_pd.check.fix import apply_edits, edits_of, unified_diff

    edits = edits_of(d for d in diags if d.location is not None and d.location.file == name)
    if not edits or name == "-":
        return False, 0
    before = Path(name).read_text(encoding="utf-8")
    res = apply_edits(before, edits)
    for e, why in res.skipped:
        sys.stderr.write(f"{_display_name(name)}:{e.line}:{e.column}: not fixed ({why})\n")
    if res.text == before:
        return False, 0
    if mode == "diff":
        sys.stdout.write(unified_diff(_display_name(name), before, res.text))
    else:
        from omni_pd.io_write import atomic_write

        atomic_write(name, res.text)
        sys.stderr.write(f"{_display_name(name)}: fixed {len(res.applied)} finding"
                         f"{'s' if len(res.applied) != 1 else ''} ("
                         + ", ".join(e.describe() for e in res.applied) + ")\n")
    sys.stderr.flush()
    return True, len(res.applied)


def run_validate(inputs: Optional[list[str]], opts, *, cli_layer, known: dict, fmt: str = "text", quiet: bool = False,
                 against: bool = False, python: Optional[str] = None, model: Optional[str] = None,
                 fix: Optional[str] = None) -> None:
    """Validate ``inputs`` (files, directories, ``-``; none: the bundled preset) with
    ``opts`` (:class:`~omni_pd.check.validate.ValidateOptions`) and print the findings and
    verdicts as ``omni-pd validate`` does. ``cli_layer``: the --select/--ignore layer
    (:func:`_cli_layer`), ``known``: code -> rule name, filled on first need. Returns
    when every input is clean; raises SystemExit with the worst status otherwise, and
    OmniPdError for an unreadable single input in text format (exit 2).

    ``fix``: ``"fix"`` applies the replacements findings carry to each file (then reports what
    is left, as ruff's ``--fix`` does); ``"diff"`` prints them as a unified diff instead of the
    findings and exits 1 when a file would change, 0 when none would (ruff's ``--diff``)."""
    from omni_pd.check.inputs import collect_inputs
    from omni_pd.diagnostics import render_json, render_text, summary
    from omni_pd.resources import preset_path

    configs: dict = {}
    hidden_total = 0
    if not inputs:
        inputs = [str(preset_path("qwen3_omni_moe"))]
    found = collect_inputs(list(inputs))
    single = len(inputs) == 1 and len(found.paths) == 1 and not Path(inputs[0]).is_dir()
    every: list[Diagnostic] = list(found.problems)
    docs: dict = {}
    worst = 2 if found.problems else 0
    failed = unreadable = 0
    would_change = False
    for name in found.paths:
        layers = _selection_layers(name, cli_layer, known, configs)  # a bad settings file stops the run (exit 2)
        try:
            diags, file_docs = _validate_one(name, opts, against, python, model)
            diags, hidden = _suppress(diags, file_docs, layers, known)
            if fix is not None:
                changed, _n = _fix_file(name, diags, fix)
                would_change |= changed
                if fix == "diff":
                    continue
                if changed:  # what is left after the fixes
                    diags, file_docs = _validate_one(name, opts, against, python, model)
                    diags, hidden = _suppress(diags, file_docs, layers, known)
            hidden_total += hidden
        except OmniPdError as e:
            if single and fmt == "text":
                raise
            if e.diagnostic.code != "OPD001" and e.diagnostic.code[:5] != "OPD00":
                raise  # not about this file (e.g. vllm-omni missing): stop the run
            diags, file_docs, worst, hidden = [e.diagnostic], {}, max(worst, e.exit_code), 0
            unreadable += 1
            verdict = "unreadable"
        else:
            verdict = "ok"
            if any(d.severity is Severity.ERROR for d in diags):
                failed += 1
                worst = max(worst, 1)
                verdict = "FAILED"
        shown = [d for d in diags if not (quiet and d.severity is Severity.INFO)]
        every += shown
        docs.update(file_docs)
        if fmt == "text" and not single:
            text = render_text(shown, _line_source(file_docs))
            out = sys.stderr if unreadable and shown and shown[0].code.startswith("OPD00") and not file_docs else sys.stdout
            if text:
                out.write(text + ("" if text.endswith("\n\n") else "\n"))
            out.flush()
            # one verdict per file, as the single-file run prints (ruff, check-jsonschema)
            sys.stdout.write(f"{_display_name(name)}: {verdict} ({summary(shown)}{_hidden(hidden)})\n")
            sys.stdout.flush()
    if fix == "diff":
        sys.stdout.flush()
        if would_change:
            raise SystemExit(1)
        return
    if fmt == "json":
        sys.stdout.write(render_json(every) + "\n")
    elif fmt in ("concise", "github"):
        from omni_pd.diagnostics import render_concise, render_github

        sys.stdout.write((render_concise if fmt == "concise" else render_github)(every))
    elif fmt == "sarif":
        from omni_pd.check.sarif import render_sarif

        sys.stdout.write(render_sarif(every) + "\n")
    elif single:
        text = render_text(every, _line_source(docs))
        if text:
            sys.stdout.write(text + ("" if text.endswith("\n") else "\n"))
        verdict = "FAILED" if failed else "ok"
        sys.stdout.write(f"{_display_name(found.paths[0])}: {verdict} ({summary(every)}{_hidden(hidden_total)})\n")
    else:
        if found.problems:
            sys.stderr.write(render_text(list(found.problems)) + "\n")
        n = len(found.paths)
        ok = n - failed - unreadable
        parts = [f"{failed} failed", f"{unreadable} unreadable"] if unreadable else [f"{failed} failed"]
        sys.stdout.write(f"validate: {n} file{'s' if n != 1 else ''}, {ok} ok, {', '.join(parts)} "
                         f"({summary(every)}{_hidden(hidden_total)})\n")
    if worst:
        sys.stdout.flush()
        raise SystemExit(worst)  # main() maps SystemExit to its code (typer.Exit is swallowed by click here)


def run_default(inputs: list[str], quiet: bool = False) -> None:
    """``omni-pd validate [-q] INPUT...`` with every other option at its default: what the
    typer command does for those arguments (:func:`omni_pd.cli.commands.validate.validate`), without typer.
    ``inputs`` holds no ``-`` (the typer path reports a repeated one as a usage error)."""
    # no pydantic here: validate parses with the deploy model's projection (compile/model_lite.py)
    from omni_pd.check.context import Inventory, ModelInfo  # noqa: F401  (the typer command's imports)
    from omni_pd.check.validate import ValidateOptions

    from omni_pd import cli_options

    cli_options.vllm_version(None)
    known: dict = {}  # code -> rule name, read when a selector or a file needs it (_suppress)
    cli_layer = _cli_layer(None, None, known)
    opts = ValidateOptions(platform=None, all_platforms=False, inventory=None, model=None,
                           vllm_version=None, env={}, pipeline=None, cli={})
    run_validate(list(inputs), opts, cli_layer=cli_layer, known=known, fmt="text", quiet=quiet)


def exit_status(run, classify=None) -> int:
    """Call ``run()`` and turn how it ended into ``omni-pd``'s exit status: 0 when it
    returns; an :class:`OmniPdError` is printed and gives its own code (1 findings, 2 bad
    input or usage); ``SystemExit`` its code (a string message: 2); an interrupt 130 (EOF:
    a newline on stderr first, as click does); a broken pipe 1, the streams' later flushes
    quietened (click's ``PacifyFlushWrapper``). ``classify(e)``: the typer app's say over any
    other exception (click's usage errors, ``Exit``, ``Abort``), an exit status or None.
    What is left is a bug: OPD000 and 3, or the traceback with ``OMNI_PD_DEBUG`` set.

    The one tail both entries share: the typer app (:func:`omni_pd.cli.main`) and the
    console entry's typer-free fast path (:func:`omni_pd.cli_entry.main`)."""
    try:
        run()
        return 0
    except OmniPdError as e:
        _emit_diags([e.diagnostic])
        return e.exit_code
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    except KeyboardInterrupt:
        return 130
    except EOFError:  # click: a newline on stderr, then Abort (130)
        sys.stderr.write("\n")
        return 130
    except Exception as e:
        import errno

        if isinstance(e, OSError) and e.errno == errno.EPIPE:
            # click: the reader went away; quieten the streams' later flushes, exit 1
            sys.stdout = _PacifyFlush(sys.stdout)
            sys.stderr = _PacifyFlush(sys.stderr)
            return 1
        status = classify(e) if classify is not None else None
        if status is not None:
            return status
        if os.environ.get("OMNI_PD_DEBUG"):
            raise
        _emit_diags([Diagnostic(code="OPD000", severity=Severity.ERROR,
                                message=f"internal error: {type(e).__name__}: {e}",
                                help="this is a bug in omni-pd; rerun with OMNI_PD_DEBUG=1 and report the traceback")])
        return 3


class _PacifyFlush:
    """A stream whose ``flush`` ignores a broken pipe (click's ``PacifyFlushWrapper``)."""

    def __init__(self, wrapped) -> None:
        self.wrapped = wrapped

    def flush(self) -> None:
        """Flush, unless the reader has gone (EPIPE)."""
        import errno

        try:
            self.wrapped.flush()
        except OSError as e:
            if e.errno != errno.EPIPE:
                raise

    def __getattr__(self, attr: str):
        return getattr(self.wrapped, attr)


def with_gc_threshold(run):
    """``run()``'s result, the collector's young-generation threshold raised to
    :data:`GC_THRESHOLD_0` while it runs (never lowered) and restored after."""
    import gc

    thresholds = gc.get_threshold()
    gc.set_threshold(max(GC_THRESHOLD_0, thresholds[0]), *thresholds[1:])
    try:
        return run()
    finally:
        gc.set_threshold(*thresholds)
