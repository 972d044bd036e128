"""Per-project settings: the ``[tool.omni-pd]`` table of ``pyproject.toml`` or a
``.omni-pd.toml`` file, found by walking up from the validated file as ruff finds its
configuration (the closest directory with either wins; in one directory ``.omni-pd.toml``
wins over ``pyproject.toml``, and a ``pyproject.toml`` without the table is passed over).

Keys (all optional, every value a list of selectors, see :mod:`omni_pd.check.suppress`)::

    [tool.omni-pd]                      # in .omni-pd.toml: the same keys at the top level
    ignore = ["OPD704"]
    select = ["OPD3", "pd-kv-role"]
    per-file-ignores = { "presets/*.yaml" = ["OPD403"], "legacy.yaml" = ["OPD102"] }

Reading is the only side effect here; a file omni-pd cannot use (TOML syntax, an unknown
key, a selector that names no code) raises OPD006 (exit 2) located in that file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from omni_pd.check.suppress import Layer, bad_selectors
from omni_pd.diagnostics import Diagnostic, Location, OmniPdError, Severity

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, as a package (pyproject.toml)
    import tomli as tomllib  # type: ignore[no-redef]

OWN_FILE = ".omni-pd.toml"
PYPROJECT = "pyproject.toml"
KEYS = ("ignore", "per-file-ignores", "select")

_AT = re.compile(r"\(at line (\d+), column (\d+)\)")


def known_codes() -> dict[str, str]:
    """code -> rule name of every code ``omni-pd explain`` knows (omni_pd/check/codes.py
    ``explainable``), what selectors and directives are resolved against."""
    from omni_pd.check.codes import explainable

    return {code: entry.name for code, entry in explainable().items()}


def find_config(start: Path) -> Path | None:
    """The settings file for an input in directory ``start`` (or for the file ``start``):
    the first of ``.omni-pd.toml``, then ``pyproject.toml`` with a ``[tool.omni-pd]``
    table, in ``start`` and then each parent up to the root. None when there is none."""
    start = start.resolve()
    dirs = ([start] if start.is_dir() else []) + list(start.parents)
    for d in dirs:
        try:
            own = d / OWN_FILE
            if own.is_file():
                return own
            py = d / PYPROJECT
            if py.is_file() and _has_table(py):
                return py
        except OSError:  # a directory we may not look into holds no settings for us
            continue
    return None


def _has_table(py: Path) -> bool:
    """True when ``py`` mentions a ``tool.omni-pd`` table (a cheap text test first; a
    broken pyproject.toml that has one is then reported by :func:`load_layer`)."""
    try:
        text = py.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return re.search(r"^\s*\[\s*tool\s*\.\s*[\"']?omni-pd[\"']?\s*[\].]", text, re.M) is not None or \
        re.search(r"^\s*tool\s*\.\s*[\"']?omni-pd[\"']?\s*\.", text, re.M) is not None


def _bad(path: Path, text: str, message: str, help: str, needle: str | None = None,
         line: int | None = None, col: int | None = None, quoted: bool = False) -> OmniPdError:
    """OPD006 located at the first line of ``text`` (not a comment) with ``needle`` (as a
    TOML string, ``"needle"`` or ``'needle'``, when ``quoted``), or at ``line``/``col``."""
    forms = [f'"{needle}"', f"'{needle}'", needle] if quoted else [needle]
    for form in forms if needle is not None and line is None else ():
        for i, ln in enumerate(text.splitlines(), 1):
            j = ln.find(form)
            if j != -1 and not ln.lstrip().startswith("#"):
                line, col = i, j + 1
                break
        if line is not None:
            break
    return OmniPdError(Diagnostic(code="OPD006", severity=Severity.ERROR, message=message,
                                  location=Location(file=_shown(path), line=line, column=col), help=help))


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it (as the inputs are
    named), else absolute."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def load_layer(path: Path, known: Mapping[str, str]) -> Layer:
    """The :class:`~omni_pd.check.suppress.Layer` of the settings file ``path``
    (``.omni-pd.toml``: top-level keys; ``pyproject.toml``: ``[tool.omni-pd]``), its
    ``per-file-ignores`` globs relative to ``path``'s directory. ``known``: code -> rule
    name. Raises OPD006 (exit 2) for unreadable TOML, a key other than :data:`KEYS`, a
    value that is not a list of strings, or a selector naming no code."""
    try:
        text = path.read_text(encoding="utf-8")
        data: Any = tomllib.loads(text)
    except OSError as e:
        raise _bad(path, "", f"cannot read the omni-pd settings file: {e.strerror}", "fix or remove it") from None
    except UnicodeDecodeError:
        raise _bad(path, "", "the omni-pd settings file is not UTF-8", "save it as UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        at = _AT.search(str(e))
        raise _bad(path, text, f"not valid TOML: {_AT.sub('', str(e)).strip()}", "fix the TOML syntax",
                   line=int(at.group(1)) if at else None, col=int(at.group(2)) if at else None) from None
    table = data.get("tool", {}).get("omni-pd", {}) if path.name == PYPROJECT else data
    where = f"{path.name} [tool.omni-pd]" if path.name == PYPROJECT else path.name
    if not isinstance(table, dict):
        raise _bad(path, text, f"{where} must be a table", "write `[tool.omni-pd]` with keys " + ", ".join(KEYS),
                   needle="omni-pd")
    for key in table:
        if key not in KEYS:
            raise _bad(path, text, f"{where}: unknown key `{key}`", "omni-pd reads " + ", ".join(KEYS), needle=key)

    def selectors(value: Any, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _bad(path, text, f"{where}: `{key}` must be a list of codes or rule names",
                       f'write e.g. {key.split(".")[-1]} = ["OPD704"]', needle=key.split(".")[-1])
        bad = bad_selectors(value, known)
        if bad:
            raise _bad(path, text, f"{where}: `{key}` names no known code: {', '.join(bad)}",
                       "use codes (OPD704), code prefixes (OPD7), rule names or ALL; `omni-pd rules` lists them",
                       needle=bad[0], quoted=True)
        return tuple(value)

    pfi = table.get("per-file-ignores", {})
    if not isinstance(pfi, dict):
        raise _bad(path, text, f"{where}: `per-file-ignores` must be a table of glob = [codes]",
                   'write per-file-ignores = { "presets/*.yaml" = ["OPD403"] }', needle="per-file-ignores")
    return Layer(source=_shown(path),
                 select=selectors(table["select"], "select") if "select" in table else None,
                 ignore=selectors(table.get("ignore", []), "ignore"),
                 per_file_ignores=tuple((g, selectors(v, f"per-file-ignores.{g}")) for g, v in pfi.items()),
                 root=path.parent.resolve().as_posix())
