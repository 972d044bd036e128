"""expand with an inventory whose router cannot relay the connector expand chose is the user's
choice, not an omni-pd bug (the walkthrough of issue 36: OPD705 came out as OPD000, exit 3)."""

from __future__ import annotations

from omni_pd.cli import main

HOSTS = """\
hosts:
  host-a: {accelerator: cuda, count: 8, memory_gib: 80, address: 10.0.0.1}
  host-b: {accelerator: cuda, count: 8, memory_gib: 80, address: 10.0.0.2}
placement: {0: host-a, 1: host-b}
router: {relays_kv_transfer_params: true}
"""


def test_a_router_that_cannot_relay_mooncake_is_a_user_error_naming_the_way_out(tmp_path, capsys):
    inv = tmp_path / "hosts.yaml"
    inv.write_text(HOSTS)
    out = tmp_path / "pd.yaml"
    rc = main(["expand", "-q", "--inventory", str(inv), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert "error[OPD705]" in err and "OPD000" not in err
    assert "error[OPD805]: the inventory's router cannot serve the PD pair expand wrote (OPD705, above)" in err
    assert "e.g. --connector NixlConnector" in err
    # the way out the help names works
    assert main(["expand", "-q", "--inventory", str(inv), "--connector", "NixlConnector", "-o", str(out)]) == 0
    assert out.exists()


def test_a_device_clash_and_a_router_that_cannot_relay_at_once_are_one_user_error(tmp_path, capsys):
    """Both user choices at once (the Talker and Code2Wav put on decode's GPU by --downstream-devices,
    and a relay router for Mooncake) were called an expand bug (OPD000, exit 3): each alone was
    OPD805. Now one OPD805 names both, with both ways out."""
    inv = tmp_path / "hosts.yaml"
    inv.write_text(HOSTS)
    out = tmp_path / "pd.yaml"
    rc = main(["expand", "-q", "--inventory", str(inv), "--downstream-devices", "1", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert "error[OPD404]: host-b: physical GPU 0: 0.9 (stage 1) + 0.6 (stage 2) + 0.1 (stage 3) = 1.60 > 1.0" in err
    assert "OPD000" not in err
    assert ("error[OPD805]: cannot place the stages where --downstream-devices 1 put them: the file would fail "
            "validate (OPD404); and the inventory's router cannot serve the PD pair expand wrote (OPD705, above)\n"
            ) in err
    assert ("= help: give other devices (the findings above say which stages clash), or leave the option out for "
            "expand's own layout; pick a KV connector that router speaks (e.g. --connector NixlConnector), or change "
            "the inventory's `router:` block; nothing was written\n") in err
