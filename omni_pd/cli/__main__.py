"""``python -m omni_pd.cli``: the typer app, as the console script runs every command but
a plain ``validate``."""

import sys

from omni_pd.cli import main

sys.exit(main())
