"""A malformed ``--inventory`` file is a usage error (OPD006, exit 2) naming the bad key,
never an internal error (OPD000, exit 3).

Found walking the README as a new user: ``hosts: 3``, ``placement: 3`` and a list of
hosts crashed ``Inventory.from_dict`` (``.items()`` on an int/list), and ``router: 3``
crashed rule OPD702 (``.get()`` on an int) after validation had started.
"""

from __future__ import annotations

import pytest

from omni_pd.check.context import Inventory
from tests.test_cli import FIX, run_cli

HELP = "  = help: see `omni-pd explain OPD402` for the inventory format\n"


@pytest.mark.parametrize("text, message", [
    ("hosts: 3\n", "hosts must be a mapping of host name -> {accelerator, count, memory_gib, address}, found a number"),
    ("hosts: [host-a]\n", "hosts must be a mapping of host name -> {accelerator, count, memory_gib, address}, "
                          "found a list"),
    ("placement: 3\n", "placement must be a mapping of stage id (or `all`) -> host name, found a number"),
    ("placement: [host-a]\n", "placement must be a mapping of stage id (or `all`) -> host name, found a list"),
    ("router: 3\n", "router must be a mapping (e.g. {relays_kv_transfer_params: true}), found a number"),
    ("router: [x]\n", "router must be a mapping (e.g. {relays_kv_transfer_params: true}), found a list"),
    ("allow_shared_devices: maybe\n", "allow_shared_devices must be true or false, found 'maybe'"),
    ("hosts: {a: {count: -1}}\n", "hosts.a: count must be a non-negative integer, found -1"),
    ("hosts: {a: {memory_gib: 0}}\n", "hosts.a: memory_gib must be a positive number, found 0.0"),
    # the second-hour walkthrough: a typo'd host key and two hosts with one address passed silently
    ("hosts: {a: {adress: 10.0.0.1}}\n", "hosts.a: unknown key `adress` (did you mean `address`?); a host takes "
                                         "accelerator, count, memory_gib, address, generation, processes"),
    ("hosts: {a: {address: 10.0.0.1}, b: {address: 10.0.0.1}}\n",
     "hosts.a and hosts.b have one address 10.0.0.1: each host needs its own (peers dial a stage by its host's "
     "address; two names for one machine would also share its devices and ports)"),
])
def test_malformed_inventory_is_a_usage_error(tmp_path, capsys, text, message):
    (tmp_path / "hosts.yaml").write_text(text)
    rc, out, err = run_cli(["validate", str(FIX / "llm.yaml"), "--inventory", "hosts.yaml"], capsys, cwd=tmp_path)
    assert (rc, out) == (2, "")
    assert err == f"error[OPD006]: bad inventory: {message}\n{HELP}"


@pytest.mark.parametrize("d", [
    {"hosts": None, "placement": None, "router": None},  # empty keys: as if absent
    {"hosts": {"a": None}, "placement": {"all": "a"}, "allow_shared_devices": True},
    {"hosts": {"a": {"count": 0, "memory_gib": 80}}, "router": {"relays_kv_transfer_params": False}},
])
def test_well_formed_inventories_still_read(d):
    inv = Inventory.from_dict(d)
    assert inv.router == d.get("router")
    assert inv.allow_shared_devices is bool(d.get("allow_shared_devices"))
    assert set(inv.hosts) == set(d.get("hosts") or {})
