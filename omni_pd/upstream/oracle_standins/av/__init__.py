"""Oracle stand-in for ``av`` (see ``_standin.py``)."""

import _standin

_standin.install(globals())
