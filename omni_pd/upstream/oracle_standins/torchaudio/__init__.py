"""Oracle stand-in for ``torchaudio`` (see ``_standin.py``)."""

import _standin

_standin.install(globals())
