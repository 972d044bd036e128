"""Two simulated hosts for the two-host CPU runs: Linux network namespaces joined by a veth pair.

Used by tests/test_e2e_two_hosts.py (a thinker-only NIXL pair) and
tests/test_e2e_two_hosts_omni.py (the vllm-omni pipeline). The pair's two addresses form a
/30 that exists only between the namespaces: no route to anything else, no loopback shared,
so every byte the engines exchange crosses the veth pair.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

import pytest


def netns_works() -> bool:
    """True when this process may create network namespaces (root and ``ip netns``)."""
    if shutil.which("ip") is None or os.geteuid() != 0:
        return False
    return subprocess.run(["ip", "netns", "list"], capture_output=True).returncode == 0


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def veth(ns: str) -> str:
    """The name of namespace ``ns``'s end of the veth pair (for ``UCX_NET_DEVICES``)."""
    return f"{ns[:-1]}v{ns[-1]}"


@contextmanager
def two_hosts(tag: str, addr: dict[str, str]) -> Iterator[dict[str, str]]:
    """``{"A": netns name, "B": netns name}``: namespaces ``<tag>a`` and ``<tag>b`` joined by a
    veth pair (``<tag>va``/``<tag>vb``, at most 15 characters), each with loopback up and its
    address ``addr[host]``/30; both removed afterwards whatever happened (a namespace takes
    its end of the pair with it). Skips the test where namespaces cannot be created (e.g. a
    container without CAP_SYS_ADMIN); raises CalledProcessError when ``ip`` refuses a step."""
    ns = {"A": f"{tag}a", "B": f"{tag}b"}
    probe = _ip("netns", "add", ns["A"], check=False)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a network namespace here: {probe.stderr.strip()}")
    try:
        _ip("netns", "add", ns["B"])
        _ip("link", "add", veth(ns["A"]), "type", "veth", "peer", "name", veth(ns["B"]))
        for h in ("A", "B"):
            dev = veth(ns[h])
            _ip("link", "set", dev, "netns", ns[h])
            _ip("-n", ns[h], "addr", "add", f"{addr[h]}/30", "dev", dev)
            _ip("-n", ns[h], "link", "set", "lo", "up")
            _ip("-n", ns[h], "link", "set", dev, "up")
        yield ns
    finally:
        for n in ns.values():
            _ip("netns", "del", n, check=False)


def run_in(ns: str, code: str, *args: str, timeout: float = 600) -> str:
    """Run Python ``code`` inside namespace ``ns`` (stdlib only); its stdout. AssertionError
    with the end of its stderr when it fails."""
    r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code, *args], capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


#: a client run with :func:`run_in` on one simulated host: ``BASE METRICS_URL PROMPTS_JSON``;
#: greedy completions of 24 tokens (model ``tiny``) through BASE, and the metrics page before
#: and after, as one JSON line ``{"texts", "before", "after"}``
COMPLETIONS_CLIENT = r'''
import json, sys, urllib.request as u
op = u.build_opener(u.ProxyHandler({}))
base, metrics, prompts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
def get(url):
    with op.open(url, timeout=30) as r: return r.read().decode()
before = get(metrics)
texts = []
for p in prompts:
    body = {"model": "tiny", "prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
    req = u.Request(base + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with op.open(req, timeout=300) as r: texts.append(json.loads(r.read())["choices"][0]["text"])
print(json.dumps({"texts": texts, "before": before, "after": get(metrics)}))
'''
