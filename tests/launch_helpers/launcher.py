"""Runs ``omni_pd.launch.supervisor.run`` on a plan given as JSON, as its own process,
so that tests can send it signals:

    python launcher.py PLAN.json RUN_DIR [GRACE_S]

PLAN.json: ``{"processes": [{"name", "argv", "env", "health_url", "health_timeout_s",
"ports", "depends_on"}]}``. Exits with run()'s result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from omni_pd.launch.spec import HealthCheck, LaunchPlan, PortUse, ProcessSpec  # noqa: E402
from omni_pd.launch.supervisor import run  # noqa: E402


def main() -> int:
    data = json.loads(Path(sys.argv[1]).read_text())
    grace = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
    procs = tuple(
        ProcessSpec(
            name=p["name"],
            argv=tuple(p["argv"]),
            env=p.get("env", {}),
            ports=tuple(PortUse(port, "http") for port in p.get("ports", ())),
            health=HealthCheck(p["health_url"], timeout_s=p.get("health_timeout_s", 10.0), interval_s=0.05,
                               max_interval_s=0.2) if p.get("health_url") else None,
            depends_on=tuple(p.get("depends_on", ())),
            role=p.get("role", "engine"),
        )
        for p in data["processes"]
    )
    plan = LaunchPlan(runtime="vllm", model="test", connector="none", entrypoint="", config="", processes=procs)
    return run(plan, sys.argv[2], grace_s=grace, live=False)


if __name__ == "__main__":
    sys.exit(main())
