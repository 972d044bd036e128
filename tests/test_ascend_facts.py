"""vllm-ascend facts: presets/targets/vllm_ascend.yaml against the released sources.

The drift test re-runs :func:`omni_pd.upstream.ascend_facts.extract` on the vllm-ascend
archives in ``$OMNI_PD_CACHE/ascend`` (else ``<repo>/.cache/ascend``): the 0.18.0 and
0.13.0 wheels are downloaded with pip when missing; the 0.23.0.post1 sdist cannot be
(pip must build its metadata, which needs the NPU toolchain), so that case is skipped
unless the file is there. ``OMNI_PD_OFFLINE=1`` skips every download.
The unit tests below run on small in-memory sources and need nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from omni_pd.resources import data_dir, load_data
from omni_pd.upstream.ascend_facts import extract, read_archive

REPO = Path(__file__).resolve().parents[1]
FACTS = load_data(data_dir("presets") / "targets" / "vllm_ascend.yaml")
ARCHIVES = {
    "0.23.0.post1": ("vllm_ascend-0.23.0.post1.tar.gz", None),
    "0.18.0": ("vllm_ascend-0.18.0-cp311-cp311-manylinux_2_24_x86_64.whl", "vllm-ascend==0.18.0"),
    "0.13.0": ("vllm_ascend-0.13.0-cp311-cp311-manylinux_2_24_x86_64.whl", "vllm-ascend==0.13.0"),
}


def _cache() -> Path:
    env = os.environ.get("OMNI_PD_CACHE")
    return (Path(env) if env else REPO / ".cache") / "ascend"


def _archive(version: str) -> Path:
    name, spec = ARCHIVES[version]
    path = _cache() / name
    if path.is_file():
        return path
    if spec is None:
        pytest.skip(f"{name} not in the ascend cache (pip cannot build its metadata on CPU; download the sdist by hand)")
    if os.environ.get("OMNI_PD_OFFLINE") == "1":
        pytest.skip(f"OMNI_PD_OFFLINE=1 and no {name} in the ascend cache")
    _cache().mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "--platform",
           "manylinux_2_24_x86_64", "--python-version", "311", spec, "-d", str(_cache())]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not path.is_file():
        pytest.fail(f"could not download {spec}: {proc.stderr.strip()[-400:]}", pytrace=False)
    return path


@pytest.mark.wheel
@pytest.mark.parametrize("version", list(ARCHIVES))
def test_extracted_facts_match_the_released_sources(version: str) -> None:
    got = extract(read_archive(_archive(version)))
    if got.get("vllm_base"):
        got["vllm_base"]["value"] = {k: v for k, v in got["vllm_base"]["value"].items() if k in ARCHIVES}
    assert got == FACTS["extracted"][version]


def test_targets_follow_the_extracted_vllm_base() -> None:
    base = FACTS["extracted"]["0.23.0.post1"]["vllm_base"]["value"]
    assert {v: t["vllm"] for v, t in FACTS["targets"].items()} == {
        v: ".".join(b.split(".")[:2]) for v, b in base.items()}


def test_every_release_registers_both_mooncake_pd_connectors() -> None:
    for version, facts in FACTS["extracted"].items():
        names = facts["connectors"]["value"]
        assert names["MooncakeConnectorV1"].endswith(":MooncakeConnector"), version
        assert names["MooncakeLayerwiseConnector"].endswith(":MooncakeLayerwiseConnector"), version
        assert facts["pull_peer_blocks"]["decode"]["required"] == ["dp_size", "tp_size"], version


# --- the extractor on small sources ------------------------------------------------------

_PULL = '''class MooncakeConnectorWorker:
    def __init__(self):
        if self._prefill_tp_size < self._decode_tp_size:
            raise ValueError("x")
        self.side_channel_port = (
            vllm_config.kv_transfer_config.kv_port
            + vllm_config.parallel_config.data_parallel_rank * (tp)
        )
    def _get_prefill_decode_size(self, vllm_config):
        prefill_parallel_config = vllm_config.kv_transfer_config.get_from_extra_config("prefill", {})
        assert "tp_size" in prefill_parallel_config
        assert "dp_size" in prefill_parallel_config
        self._prefill_pp_size = prefill_parallel_config.get("pp_size", 1)
        decode_parallel_config = vllm_config.kv_transfer_config.get_from_extra_config("decode", {})
        assert "tp_size" in decode_parallel_config
        assert self._decode_pp_size == 1, "decode pp size must be 1"
'''


def test_extract_reads_peer_blocks_tp_rule_and_port_expression_with_lines() -> None:
    path = "vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py"
    got = extract({path: _PULL})
    assert got["pull_peer_blocks"] == {"source": f"{path}:10",
                                       "prefill": {"required": ["dp_size", "tp_size"], "optional_default_1": ["pp_size"]},
                                       "decode": {"required": ["tp_size"], "optional_default_1": []}}
    assert got["pull_prefill_tp_ge_decode_tp"] == {"value": True, "source": f"{path}:3"}
    assert got["pull_decode_pp_must_be_1"] == {"value": True, "source": f"{path}:16"}
    assert got["pull_side_channel_port"] == {
        "value": "vllm_config.kv_transfer_config.kv_port + vllm_config.parallel_config.data_parallel_rank * tp",
        "source": f"{path}:5"}
    assert got["push_peer_blocks"] is None and got["connectors"] is None


def test_extract_sees_a_dropped_tp_check() -> None:
    path = "vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py"
    got = extract({path: _PULL.replace("if self._prefill_tp_size < self._decode_tp_size:", "if False:")})
    assert got["pull_prefill_tp_ge_decode_tp"] is None
