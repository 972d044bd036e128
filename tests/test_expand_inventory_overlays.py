"""expand --inventory places the platform overlays' devices per host as it places the base's.

The inventory docs/validate.md prints (``placement: {all: host-a, 1: host-b}``: prefill on A
with the Talker and Code2Wav, decode on B) made ``expand -q --inventory hosts.yaml`` exit 3
(OPD000 "a bug in omni-pd", with OPD404 under ``platforms.npu`` and ``platforms.xpu``): the
overlays were renumbered per host from the entries that differed from the input only, so
prefill kept the Thinker's copied npu ``devices: "0,1"`` while the Talker beside it on A was
renumbered onto 1. ``placement: {0: A, 1: B}`` (Talker and Code2Wav with decode) worked by
luck: prefill was alone on A. Every placement of the four stages over two hosts is run here:
expand exits 0 (and the file validates with the inventory on every platform) or refuses with
the user-facing OPD805 (exit 2), never 3.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from omni_pd.cli import main

HOSTS = """\
hosts:
  host-a: {accelerator: cuda, count: 8, memory_gib: 80, address: 10.0.0.1}
  host-b: {accelerator: cuda, count: 8, memory_gib: 80, address: 10.0.0.2}
"""
#: the docs' router: a relay (pull), which cannot serve expand's default MooncakeConnector (bootstrap)
RELAY = "router: {relays_kv_transfer_params: true}\n"
#: routers that speak Mooncake's bootstrap protocol (presets/targets/routers.yaml `kinds`)
MOONCAKE_ROUTERS = ("router: {kind: omni-pd}\n", "router: {kind: vllm-router, kv_connector: mooncake}\n")


def _inventory(tmp_path: Path, placement: str, router: str) -> Path:
    inv = tmp_path / "hosts.yaml"
    inv.write_text(HOSTS + f"placement: {placement}\n" + router)
    return inv


def _expand(tmp_path: Path, inv: Path, capsys) -> tuple[int, str, Path]:
    out = tmp_path / "pd.yaml"
    out.unlink(missing_ok=True)
    capsys.readouterr()
    rc = main(["expand", "-q", "--inventory", str(inv), "-o", str(out)])
    return rc, capsys.readouterr().err, out


def _devices(path: Path) -> dict[str, dict[int, object]]:
    """Each stage's effective ``devices`` in the base (key ``base``) and under every
    ``platforms.<P>`` overlay of the file at ``path``."""
    from omni_pd.compile.parse import parse_config
    from omni_pd.compile.pipelines import load_catalogue
    from omni_pd.compile.topology import resolve
    from omni_pd.io import load_file

    doc = load_file(path)
    cfg = parse_config(doc)
    pipe = load_catalogue().get(str(cfg.pipeline))
    return {str(p or "base"): {s.stage_id: s.devices for s in resolve(cfg, pipe, p, doc).stages}
            for p in (None, *(cfg.platforms or {}))}


#: every stage's devices on its own host (prefill 0, decode 1, Talker 2, Code2Wav 3), the same
#: whichever host the Talker and Code2Wav share with prefill or decode: local ids restart per host
BASE = {0: (0,), 1: (0,), 2: (1,), 3: (1,)}
WANT = {"base": BASE, "cuda": BASE, "musa": BASE, "rocm": BASE,
        "npu": {0: (0, 1), 1: (0, 1), 2: (2,), 3: (2,)},          # TP 2 per side, the Talker on the next device
        "xpu": {0: (0, 1, 2, 3), 1: (0, 1, 2, 3), 2: (4,), 3: (4,)}}


def test_the_docs_inventory_is_the_users_router_choice_not_a_bug(tmp_path, capsys):
    rc, err, out = _expand(tmp_path, _inventory(tmp_path, "{all: host-a, 1: host-b}", RELAY), capsys)
    assert rc == 2 and not out.exists(), err
    assert "OPD000" not in err and "OPD404" not in err
    assert "error[OPD705]" in err
    assert "error[OPD805]: the inventory's router cannot serve the PD pair expand wrote (OPD705, above)" in err


@pytest.mark.parametrize("placement, hosts", [
    ("{all: host-a, 1: host-b}", {0: "host-a", 1: "host-b", 2: "host-a", 3: "host-a"}),   # the docs' placement
    ("{0: host-a, 1: host-b}", {0: "host-a", 1: "host-b", 2: "host-b", 3: "host-b"}),     # downstream after decode
])
@pytest.mark.parametrize("router", MOONCAKE_ROUTERS)
def test_a_router_that_speaks_mooncake_gets_a_file_that_validates_on_every_platform(
        tmp_path, capsys, placement, hosts, router):
    inv = _inventory(tmp_path, placement, router)
    rc, err, out = _expand(tmp_path, inv, capsys)
    assert rc == 0, err
    text = out.read_text()
    said = ", ".join(f"stage {s} -> {h}" for s, h in hosts.items())
    assert f"# Placement (--inventory): {said}; device ids and ports are per host." in text
    assert _devices(out) == WANT
    assert main(["validate", "-q", str(out), "--inventory", str(inv), "--all-platforms"]) == 0, \
        capsys.readouterr().out


def test_an_overlay_entry_that_inherits_its_base_devices_is_placed_with_the_overlay(tmp_path, capsys):
    """The npu overlay moves only the Thinker (to 4,5 at TP 2); the Talker and Code2Wav inherit
    their base device. On host-a (prefill, Talker, Code2Wav) the npu devices in use are 1 (the
    Talker's, inherited) and 4, 5 (prefill's): they become 0 and 1, 2 there, so the overlay
    spells out the Talker's and Code2Wav's devices too (the base numbering gives them 1)."""
    src = tmp_path / "in.yaml"
    src.write_text('pipeline: qwen3_omni_moe\nasync_chunk: false\nstages:\n'
                   '  - {stage_id: 0, devices: "0", gpu_memory_utilization: 0.8}\n'
                   '  - {stage_id: 1, devices: "1", gpu_memory_utilization: 0.4}\n'
                   '  - {stage_id: 2, devices: "1", gpu_memory_utilization: 0.2}\n'
                   'platforms:\n  npu:\n    stages:\n      - {stage_id: 0, devices: "4,5", tensor_parallel_size: 2}\n')
    inv = _inventory(tmp_path, "{all: host-a, 1: host-b}", MOONCAKE_ROUTERS[0])
    out = tmp_path / "pd.yaml"
    assert main(["expand", "-q", str(src), "--inventory", str(inv), "-o", str(out)]) == 0, capsys.readouterr().err
    assert _devices(out) == {"base": {0: (0,), 1: (0,), 2: (1,), 3: (1,)},
                             "npu": {0: (1, 2), 1: (0, 1), 2: (0,), 3: (0,)}}
    assert main(["validate", "-q", str(out), "--inventory", str(inv), "--all-platforms"]) == 0, \
        capsys.readouterr().out


def test_an_overlay_that_does_not_fit_a_host_is_refused_naming_the_overlay(tmp_path, capsys):
    """Every stage on host-a: the base needs 3 devices, but the preset's xpu overlay (TP 4 per
    side and the Talker) needs 9 of its 8; validate --all-platforms would report OPD402, which
    expand said as OPD000 (exit 3). On xpu hosts it is the placement's: OPD805, exit 2. On cuda
    hosts the xpu overlay never runs (vllm-omni applies the overlay of the platform it runs on),
    so the one-host layout of the README's 8-GPU machine expands and validates."""
    rc, err, out = _expand(tmp_path, _inventory(tmp_path, "{all: host-a}", MOONCAKE_ROUTERS[0]), capsys)
    assert rc == 0, err
    assert main(["validate", "-q", str(out), "--inventory", str(tmp_path / "hosts.yaml"), "--all-platforms"]) == 0, \
        capsys.readouterr().out
    inv = _inventory(tmp_path, "{all: host-a}", MOONCAKE_ROUTERS[0])
    inv.write_text(inv.read_text().replace("accelerator: cuda", "accelerator: xpu"))
    rc, err, out = _expand(tmp_path, inv, capsys)
    assert rc == 2 and not out.exists()
    assert err == ("error[OPD805]: cannot place the stages: host host-a has 8 device(s) but stages 0, 1, 2, 3 placed "
                   "on it need 9 with the platforms.xpu overlay\n"
                   "  = help: place some of them on another host (placement: in the inventory), or raise "
                   "hosts.host-a.count, or leave platforms.xpu out of the input\n")


PLACEMENTS = list(itertools.product(("host-a", "host-b"), repeat=4))


@pytest.mark.parametrize("hosts", PLACEMENTS, ids=["".join(h[-1] for h in p) for p in PLACEMENTS])
def test_no_placement_of_the_four_stages_over_two_hosts_is_an_internal_error(tmp_path, capsys, hosts):
    """Stage 0 placed by ``all:``, stages 1-3 each named. With the docs' relay router expand
    refuses (OPD805: the router, or a host the overlays do not fit); with a router that speaks
    Mooncake it writes a file that validates with the inventory on every platform, or refuses
    with OPD805 for a host the overlays do not fit."""
    placement = "{all: %s, 1: %s, 2: %s, 3: %s}" % hosts
    rc, err, out = _expand(tmp_path, _inventory(tmp_path, placement, RELAY), capsys)
    assert rc == 2 and "error[OPD805]" in err and "OPD000" not in err, err
    inv = _inventory(tmp_path, placement, MOONCAKE_ROUTERS[0])
    rc, err, out = _expand(tmp_path, inv, capsys)
    assert rc in (0, 2) and "OPD000" not in err, err
    if rc == 2:
        assert err.startswith("error[OPD805]: cannot place the stages: host ") and "platforms.xpu" in err, err
        return
    assert main(["validate", "-q", str(out), "--inventory", str(inv), "--all-platforms"]) == 0, \
        capsys.readouterr().out


def test_the_docs_inventory_expands_and_validates_as_printed(tmp_path, capsys):
    """docs/validate.md's inventory names a router that speaks Mooncake's bootstrap protocol
    (vllm-router with ``kv_connector: mooncake``), so ``expand --inventory`` with expand's
    default connector writes a file, which validates with it on every platform; the relay its
    text names instead needs ``--connector NixlConnector``."""
    from docs_pages import fenced_blocks, page, section

    [block] = [b for b in fenced_blocks(section(page("docs/validate.md"), "## Inventory and model facts"), "yaml")
               if b.startswith("hosts:")]
    inv = tmp_path / "hosts.yaml"
    inv.write_text(block)
    rc, err, out = _expand(tmp_path, inv, capsys)
    assert rc == 0, err
    assert _devices(out) == WANT
    assert main(["validate", "-q", str(out), "--inventory", str(inv), "--all-platforms"]) == 0, \
        capsys.readouterr().out
    relay = _inventory(tmp_path, "{all: host-a, 1: host-b}", RELAY)
    capsys.readouterr()
    assert main(["expand", "-q", "--inventory", str(relay), "--connector", "NixlConnector", "-o", str(out)]) == 0, \
        capsys.readouterr().err
    assert main(["validate", "-q", str(out), "--inventory", str(relay), "--all-platforms"]) == 0, \
        capsys.readouterr().out


def test_an_overlay_entry_of_a_stage_spanning_hosts_lists_one_hosts_devices(tmp_path, capsys):
    """``placement: {0: [A, B], 1: B}``: prefill (TP 2) spans A and B, one device on each. The
    rocm overlay's own Thinker entry ``devices: "2,3"`` was kept whole (only entries listed as
    differing were spanned), so validate --all-platforms found OPD401 and expand exited 3; it
    is now spanned and renumbered with the rest of the overlay's layout: on B the spanning
    prefill takes local 0 first, decode 1, 2 after it (as in the base)."""
    src = tmp_path / "in.yaml"
    src.write_text('stages:\n  - stage_id: 0\n    max_model_len: 1024\n    devices: "0,1"\n'
                   '    tensor_parallel_size: 2\nplatforms:\n  rocm:\n    stages:\n'
                   '      - {stage_id: 0, devices: "2,3", tensor_parallel_size: 2}\n')
    inv = tmp_path / "hosts.yaml"
    inv.write_text("hosts:\n  A: {address: 10.0.0.1, count: 8}\n  B: {address: 10.0.0.2, count: 8}\n"
                   "placement: {0: [A, B], 1: B}\n")
    out = tmp_path / "pd.yaml"
    assert main(["expand", "-q", str(src), "--pipeline", "llm", "--connector", "NixlConnector",
                 "--inventory", str(inv), "-o", str(out)]) == 0, capsys.readouterr().err
    assert _devices(out) == {"base": {0: (0,), 1: (1, 2)}, "rocm": {0: (0,), 1: (1, 2)}}
    assert main(["validate", "-q", str(out), "--inventory", str(inv), "--all-platforms"]) == 0, \
        capsys.readouterr().out
