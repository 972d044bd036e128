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
    else :func:`omni_pd.cli.main`. Returns the exit status; exceptions become statuses in
    :func:`omni_pd.cli_validate.exit_status`, the tail both paths share."""
    fast = fast_validate_args(list(sys.argv[1:] if argv is None else argv))
    if fast is None:
        from omni_pd.cli import main as typer_main

        return typer_main(argv)
    from omni_pd.cli_validate import exit_status, run_default, with_gc_threshold

    return with_gc_threshold(lambda: exit_status(lambda: run_default(*fast)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
