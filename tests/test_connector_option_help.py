"""``expand --help`` names every KV connector ``--connector`` can emit off npu (the ones
``omni-pd connectors`` lists for cuda/rocm/xpu), not only two of them.

Found walking the README as a new user: the help said "MooncakeConnector (default) or
NixlConnector" while ``--connector NixlPushConnector`` is emitted too.
"""

from __future__ import annotations

import typer.main

from omni_pd.cli import app
from omni_pd.compile import ascend
from omni_pd.compile import connectors as reg


def test_connector_help_names_every_non_npu_connector():
    expand = typer.main.get_command(app).commands["expand"]  # type: ignore[attr-defined]
    [opt] = [p for p in expand.params if "--connector" in p.opts]
    names = [n for n in reg.names() if not ascend.is_ascend(n)]
    assert names and "MooncakeConnector" in names and "NixlPushConnector" in names
    assert all(n in opt.help for n in names), (opt.help, names)
    assert "MooncakeConnector (default)" in opt.help
