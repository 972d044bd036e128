"""Compile: a deploy file becomes a typed model, a resolved topology and a PD split.

``model`` (pydantic schema) -> ``parse`` (located diagnostics) -> ``topology``
(deploy + pipeline catalogue + one platform overlay) -> ``passes.pd_split`` (pure plan,
using ``connectors``, ``targets`` and ``alloc``) -> ``emit`` (round-trip YAML).
``expand`` chains them. Nothing here prints, touches files or the network.
"""
