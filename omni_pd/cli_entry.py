"""The ``omni-pd`` console entry point: a plain ``omni-pd validate [-q] FILE...`` (what a
pre-commit hook or an editor runs on every save) is run without importing typer or
building the app; everything else goes to the typer app (:func:`omni_pd.cli.main`).

Both paths run the same body (:func:`omni_pd.cli_validate.run_validate`), and the fast
path answers only where the typer path's parse is trivial: the first argument is
``validate`` and every other one is ``-q``, ``--quiet`` or a name that does not start with
``-`` (no other option, no ``-`` for stdin, no ``--``), with no shell completion or
``OMNI_PD_DEBUG`` in the environment. Output and exit status are the typer path's
(tests/test_cli_entry.py compares them byte for byte on the validate goldens). Typer plus
the app cost about a third of a cold ``validate`` (bench/coldstart_peers.py, issue 38).
"""

import os
import sys
from typing import Optional

#: the flags the fast path reads; any other argument starting with ``-`` goes to typer
_QUIET = ("-q", "--quiet")


def fast_validate_args(args: list[str]) -> Optional[tuple[list[str], bool]]:
    """``(inputs, quiet)`` when ``args`` (the command line after the program name) is a
    plain ``validate [-q] INPUT...`` the fast path runs as typer would; else None."""
    if not args or args[0] != "validate":
        return None
    if "_OMNI_PD_COMPLETE" in os.environ or os.environ.get("OMNI_PD_DEBUG"):
        return None
    inputs: list[str] = []
    quiet = False
    for a in args[1:]:
        if a in _QUIET:
            quiet = True
        elif a.startswith("-"):
            return None
        else:
            inputs.append(a)
    return inputs, quiet


def main(argv: Optional[list[str]] = None) -> int:
    """Entry point: the fast path for a plain ``validate`` (see the module docstring),
    else :func:`omni_pd.cli.main`. Returns the exit status."""
    fast = fast_validate_args(list(sys.argv[1:] if argv is None else argv))
    if fast is None:
        from omni_pd.cli import main as typer_main

        return typer_main(argv)
    import gc

    from omni_pd.cli_validate import GC_THRESHOLD_0

    thresholds = gc.get_threshold()
    gc.set_threshold(max(GC_THRESHOLD_0, thresholds[0]), *thresholds[1:])
    try:
        return _run_fast(*fast)
    finally:
        gc.set_threshold(*thresholds)


def _run_fast(inputs: list[str], quiet: bool) -> int:
    """Run validate's body; exceptions become exit statuses as :func:`omni_pd.cli._run`
    (and the click main under it) turn them."""
    from omni_pd.cli_validate import _emit_diags, run_default
    from omni_pd.diagnostics import Diagnostic, OmniPdError, Severity

    try:
        run_default(inputs, quiet)
        return 0
    except OmniPdError as e:
        _emit_diags([e.diagnostic])
        return e.exit_code
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 2
    except KeyboardInterrupt:
        return 130
    except EOFError:  # click: a newline on stderr, then Abort (130 in cli._run)
        sys.stderr.write("\n")
        return 130
    except OSError as e:
        import errno

        if e.errno != errno.EPIPE:
            return _internal(e, Diagnostic, Severity)
        # click: the reader went away; quieten the streams' later flushes, exit 1
        sys.stdout = _PacifyFlush(sys.stdout)
        sys.stderr = _PacifyFlush(sys.stderr)
        return 1
    except Exception as e:
        return _internal(e, Diagnostic, Severity)


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


def _internal(e: Exception, Diagnostic, Severity) -> int:
    """An unforeseen exception: OPD000 and exit 3, as :func:`omni_pd.cli._run`."""
    from omni_pd.cli_validate import _emit_diags

    _emit_diags([Diagnostic(code="OPD000", severity=Severity.ERROR,
                            message=f"internal error: {type(e).__name__}: {e}",
                            help="this is a bug in omni-pd; rerun with OMNI_PD_DEBUG=1 and report the traceback")])
    return 3


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
