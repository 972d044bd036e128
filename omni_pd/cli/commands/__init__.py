"""One module per ``omni-pd`` command (:data:`omni_pd.cli.COMMANDS` names them), each
imported only when its command runs. A command module imports no other command module
(tests/test_layout.py): what two commands share lives in :mod:`omni_pd.cli.options`,
:mod:`omni_pd.cli.output`, :mod:`omni_pd.cli.shared` or :mod:`omni_pd.cli.expand_run`."""
