"""One source for connector facts (issue 16): the connector modules of
omni_pd/compile/connectors own the names (and their short forms), the Python module the
engine imports and its pip package; expand, the router, the launch plan and preflight read
them there."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from omni_pd.compile import connectors

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("typed,name", [
    ("NixlConnector", "NixlConnector"), ("nixl", "NixlConnector"), ("NIXLconnector", "NixlConnector"),
    (" Mooncake ", "MooncakeConnector"), ("mooncakeconnectorv1", "MooncakeConnectorV1"),
    ("MooncakeLayerwise", "MooncakeLayerwiseConnector"), ("nixlpush", "NixlPushConnector"),
    ("bogus", None), ("connector", None), ("", None),
])
def test_canonical_connector_names(typed, name):
    assert connectors.canonical(typed) == name


def test_expand_accepts_the_short_form_the_router_accepts(tmp_path, capsys):
    from omni_pd.cli import main
    from omni_pd.launch.router.protocol import connector_class

    out = tmp_path / "pd.yaml"
    rc = main(["expand", str(ROOT / "tests" / "fixtures" / "llm.yaml"), "--pipeline", "llm", "--connector", "nixl",
               "--kv-buffer-device", "cpu", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert out.read_text().count("kv_connector: NixlConnector") == 2
    assert connector_class("nixl").name == "NixlConnector"


def test_the_router_knows_a_name_exactly_when_the_registry_does():
    from omni_pd.launch.router.protocol import CONNECTORS, connector_class

    assert set(CONNECTORS) <= set(connectors.names())  # the router serves registered connectors only
    for name in CONNECTORS:
        for typed in (name, name.lower(), name.removesuffix("Connector")):
            assert connector_class(typed).name == name
    with pytest.raises(ValueError, match="unknown connector 'MooncakeLayerwise'; the router knows "):
        connector_class("MooncakeLayerwise")  # a registered connector the PD router does not serve


@pytest.mark.parametrize("connector", ["NixlConnector", "MooncakeConnector"])
def test_the_plan_checks_the_module_the_contract_names(tmp_path, connector):
    from omni_pd.compile.expand import expand_document
    from omni_pd.compile.passes.pd_split import ExpandOptions
    from omni_pd.io import load_file, parse_text
    from omni_pd.launch.plan import LaunchOptions, plan_document

    src = ROOT / "tests" / "fixtures" / "llm.yaml"
    res = expand_document(parse_text(src.read_text(), src.name),
                          ExpandOptions(connector=connector, kv_buffer_device="cpu"), pipeline="llm")
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(res.text)
    plan = plan_document(load_file(cfg), str(cfg), LaunchOptions(model="m", platform="cpu")).plan
    want = connectors.get(connector).import_name
    assert want in ("nixl", "mooncake.engine")
    assert plan.process("prefill-0").modules == ("vllm", want)


@pytest.mark.parametrize("module,package", [
    ("nixl", "nixl"), ("mooncake.engine", "mooncake-transfer-engine"), ("mooncake", "mooncake-transfer-engine"),
    ("vllm_omni", "vllm-omni"),
    ("omni_pd", "omni-pd"), ("vllm", "vllm"), ("aiohttp", "aiohttp"),
])
def test_preflight_pip_package_of_a_missing_module(module, package):
    from omni_pd.launch.preflight import pip_package

    assert pip_package(module) == package


def test_every_connector_module_preflight_can_check_names_its_package():
    from omni_pd.launch.preflight import pip_package

    for c in connectors.registry().values():
        if c.import_name is not None:
            assert c.pip_package and pip_package(c.import_name) == c.pip_package, c.name


def test_the_router_gets_a_prefill_port_when_the_contract_asks_for_it(tmp_path, monkeypatch):
    """The plan reads ``router_bootstrap`` from the connector module, not the connector's
    name: switched on for NixlConnector, prefill's URL carries its first connector port."""
    from omni_pd.compile.connectors.nixl import NixlConnector
    from omni_pd.compile.expand import expand_document
    from omni_pd.compile.passes.pd_split import ExpandOptions
    from omni_pd.io import load_file, parse_text
    from omni_pd.launch.plan import LaunchOptions, plan_document

    src = ROOT / "tests" / "fixtures" / "llm.yaml"
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(expand_document(parse_text(src.read_text(), src.name),
                                   ExpandOptions(connector="NixlConnector", kv_buffer_device="cpu"), pipeline="llm").text)

    def router_argv():
        return plan_document(load_file(cfg), str(cfg), LaunchOptions(model="m", platform="cpu")).plan.process("router").argv

    assert connectors.get("MooncakeConnector").router_bootstrap and not NixlConnector.router_bootstrap
    assert router_argv()[-4:] == ("--prefill", "http://127.0.0.1:8100", "--decode", "http://127.0.0.1:8200")
    monkeypatch.setattr(NixlConnector, "router_bootstrap", True)
    assert router_argv()[-4:] == ("--prefill", "http://127.0.0.1:8100,5600", "--decode", "http://127.0.0.1:8200")
