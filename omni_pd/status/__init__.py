"""``omni-pd status``: is a running deployment doing PD, from the engines' own metrics.

Layer beside :mod:`omni_pd.launch` (docs/layout.md): :mod:`.page` parses a Prometheus text
page (prometheus_client's parser), :mod:`.verdict` is the pure verdict over two scrapes,
:mod:`.sources` says where to look (a launch run directory, a deploy config + inventory,
explicit URLs), :mod:`.scrape` is the only module doing I/O (HTTP with timeouts, log
reads), :mod:`.view` renders the table / JSON and :mod:`.rules` the Prometheus rules and
the Grafana dashboard for the same verdicts.
"""
