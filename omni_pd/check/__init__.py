"""Check: rules over a resolved topology, before any GPU is touched.

``validate`` parses and resolves a document (through ``omni_pd.compile``), builds the
rule ``Context`` (inventory, model facts, target) from ``context`` and runs every rule
module in ``rules``; ``sarif`` renders the findings for code scanning.
"""
