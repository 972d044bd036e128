"""``python -m omni_pd.launch.router``: see :mod:`omni_pd.launch.router`."""

import sys

from omni_pd.launch.router.cli import main

sys.exit(main())
