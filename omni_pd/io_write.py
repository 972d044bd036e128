"""Writing omni-pd's output safely: :func:`atomic_write` (temp file + rename for a file,
through the open stream for a device, FIFO or this process's own stdout/stderr; never
over an input) and its OPD005 diagnostics. Split out of omni_pd/io.py in issue 38; the
YAML loading and dumping stay there.
"""

from __future__ import annotations

import os
from pathlib import Path

from omni_pd.diagnostics import OmniPdError, located_error


def _write_error(path: str | os.PathLike[str], parent: Path, e: OSError) -> OmniPdError:
    """OPD005 for a write of ``path`` that failed with ``e``: the message names the path,
    the help says what to change (the folder is missing, not writable, or the path is a
    directory)."""
    import errno

    why = e.strerror or str(e)
    if e.errno == errno.ENOENT and not parent.is_dir():
        help_ = f"the folder {parent} does not exist: create it first, or write somewhere else with -o"
    elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        help_ = f"{parent} is not writable for this user: choose another -o path"
    elif e.errno == errno.EISDIR or Path(path).is_dir():
        help_ = f"{path} is a directory: give a file name inside it"
    else:
        help_ = "choose another -o path"
    return located_error("OPD005", str(path), f"cannot write output: {path}: {why}", help=help_)


#: Paths that name this process's own streams (``/dev/stdout``, ``/proc/self/fd/1``):
#: written through the open stream, never opened anew (that would truncate a redirect)
#: and never replaced.
_STREAM_FDS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}


def _stream_fd(path: str) -> int | None:
    """The file descriptor ``path`` names when it is one of this process's own
    (``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``), else None."""
    import re

    p = os.path.normpath(os.path.abspath(path))
    if p in _STREAM_FDS:
        return _STREAM_FDS[p]
    m = re.fullmatch(rf"/dev/fd/(\d+)|/proc/(?:self|thread-self|{os.getpid()})/fd/(\d+)", p)
    return int(m.group(1) or m.group(2)) if m else None


def _follow_links(path: str) -> tuple[str, int | None]:
    """``path`` with every symbolic link in its last component followed, and the stream
    fd it reaches (:func:`_stream_fd`) if any: ``/proc/self/fd/1`` is a "magic" link
    whose target is no path to write. Raises OSError ELOOP for a loop."""
    import errno

    p = path
    for _ in range(40):
        fd = _stream_fd(p)
        if fd is not None:
            return p, fd
        if not os.path.islink(p):
            return p, None
        p = os.path.join(os.path.dirname(p), os.readlink(p))
    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)


def _write_through(path: str, text: str, fd: int | None) -> None:
    """Write ``text`` into an existing character device, FIFO or stream without
    replacing it: the process's own stream ``fd`` (sys.stdout/sys.stderr for 1 and 2,
    so a redirect or a capture receives it), else ``path`` opened for writing."""
    import sys

    if fd in (1, 2):
        stream = sys.stdout if fd == 1 else sys.stderr
        stream.write(text)
        stream.flush()
        return
    if fd is not None:
        data = text.encode("utf-8")
        while data:
            data = data[os.write(fd, data):]
        return
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


def atomic_write(path: str | os.PathLike[str], text: str, *, protect: list[str] | None = None) -> None:
    """Write ``text`` to ``path``: atomically for a regular file or a new path (temp file
    in the same folder + rename), through the open file for anything else.

    * a regular file or a new path: temp file + rename; a failed write leaves no partial
      output, a reader never sees half a file, the old file's mode is kept;
    * a symbolic link: followed to the file it names, which is written as above (the link
      stays); a note on stderr says so. A link to nothing (dangling) is refused: omni-pd
      does not create files where a link happens to point;
    * a character device or a FIFO (``/dev/null``, ``mkfifo``): opened and written, never
      replaced; ``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N`` and ``/proc/self/fd/N``
      write to this process's own stream;
    * a block device is refused.

    Raises :class:`OmniPdError` (exit 2, OPD005) when ``path`` is one of the ``protect``
    paths (the inputs: never overwritten), is refused as above, or cannot be written.
    """
    import stat as _stat
    import sys

    shown = str(path)
    try:
        final, fd = _follow_links(os.fspath(path))
        st = os.stat(final) if fd is None else None
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise _write_error(path, Path(shown).parent, e) from None
    if fd is not None:
        try:
            _write_through(final, text, fd)
        except OSError as e:
            raise _write_error(path, Path(shown).parent, e) from None
        return
    if st is None and final != os.fspath(path):
        raise located_error("OPD005", shown, f"cannot write output: {shown} is a symbolic link to {final}, "
                          "which does not exist",
                          help="create the file it points to first, or remove the link: omni-pd writes "
                               "through a link only to an existing file")
    if st is not None and _stat.S_ISBLK(st.st_mode):
        raise located_error("OPD005", shown, f"cannot write output: {shown} is a block device",
                          help="omni-pd does not write onto a disk: choose another -o path")
    if st is not None and (_stat.S_ISCHR(st.st_mode) or _stat.S_ISFIFO(st.st_mode)):
        try:
            _write_through(final, text, None)
        except OSError as e:
            raise _write_error(path, Path(final).parent, e) from None
        return
    target = Path(final)
    for other in protect or []:
        try:
            if Path(other).exists() and target.exists() and os.path.samefile(other, target):
                raise located_error("OPD005", shown,
                                  "refusing to overwrite the input file",
                                  help="write the result to another path with -o OUT.yaml")
        except OSError:
            pass
    import tempfile  # only for writing: not on the validate path (bench figure 2)

    parent = target.parent if str(target.parent) else Path(".")
    try:
        tmp_fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise _write_error(path, parent, e) from None
    try:
        with os.fdopen(tmp_fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        mode = 0o644
        if st is not None:
            mode = st.st_mode & 0o777
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise _write_error(path, parent, e) from None
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if final != os.fspath(path):
        sys.stderr.write(f"{shown} is a symbolic link: wrote the file it points to, "
                         f"{os.path.normpath(final)} (the link is kept)\n")
