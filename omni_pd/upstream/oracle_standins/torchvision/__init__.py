"""Oracle stand-in for ``torchvision`` (see ``_standin.py``)."""

import _standin

_standin.install(globals())
