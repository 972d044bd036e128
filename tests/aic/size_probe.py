"""Runs inside the AIConfigurator venv (.ci/aic_venv.sh): ``python tests/aic/size_probe.py CASE.json``.

In ONE process (AIConfigurator's perf database and model configs load once; a sweep takes
minutes on a CPU), for the case's inputs:

1. AIConfigurator itself, through its documented Python API ``aiconfigurator.cli.cli_default``
   (aiconfigurator 0.12.0, "the programmatic equivalent of ``aiconfigurator cli default``"),
   called here directly with the case's ``aic`` keyword arguments; its top disaggregated row is
   ``best_configs["disagg"].iloc[0]``;
2. ``omni-pd size`` live (no ``--from-result``) with the case's ``size`` arguments (its
   ``--write OUT`` among them) plus ``--format json``.

Prints one line ``AIC-PROBE <json>``: ``{"aic_top": row, "aic_seconds", "size_rc", "size":
omni-pd's JSON summary, "size_stderr", "size_seconds"}``; tests/test_sizing_aic.py compares them.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time


def main() -> int:
    case = json.loads(open(sys.argv[1], encoding="utf-8").read())
    from aiconfigurator.cli import cli_default

    t = time.monotonic()
    res = cli_default(**case["aic"])
    aic_seconds = time.monotonic() - t
    top = json.loads(res.best_configs["disagg"].head(1).to_json(orient="records"))[0]

    from pathlib import Path

    import aiconfigurator_core
    from omni_pd.cli import _run

    # "{aic_model_configs}" in an argument: the model configs AIConfigurator ships (a --model-info)
    configs = str(Path(aiconfigurator_core.__file__).parent / "model_configs")
    case["size"] = [a.replace("{aic_model_configs}", configs) for a in case["size"]]

    out, err = io.StringIO(), io.StringIO()
    t = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = _run(case["size"] + ["--format", "json"])
    size_seconds = time.monotonic() - t
    summary = json.loads(out.getvalue()) if rc == 0 else None
    print("AIC-PROBE " + json.dumps({"aic_top": top, "aic_seconds": round(aic_seconds, 1), "size_rc": rc,
                                     "size": summary, "size_stderr": err.getvalue()[-3000:],
                                     "size_seconds": round(size_seconds, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
