"""SLO-driven sizing (``omni-pd size``): a thin adapter over NVIDIA AIConfigurator.

AIConfigurator sizes the Thinker's prefill/decode split (:mod:`.aic`, the only module that
imports it); omni-pd adds what it does not model: omni prompt tokens (:mod:`.traffic`), the
Thinker -> AIConfigurator model mapping (:mod:`.model_map`), the downstream stages' devices and
the reading of its result (:mod:`.plan`), and the table/JSON (:mod:`.report`).
"""
