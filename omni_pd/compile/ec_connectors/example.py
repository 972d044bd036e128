"""ECExampleConnector: encoder outputs through a shared directory (safetensors files).

Facts (vLLM 0.30.0 ``distributed/ec_transfer/ec_connector/example_connector.py``; rows in
``presets/targets/ec_connectors.yaml``): registered from vLLM 0.13 (pre-release name
ECSharedStorageConnector); the one option is ``shared_storage_path`` (default ``/tmp``);
the producer writes ``<dir>/<mm_hash>/encoder_cache.safetensors``; the consumer checks that
file per item (``has_cache_item``) and logs ``Success load encoder cache for hash <mm_hash>``
at DEBUG when it loads it. No port, no side channel: E and the consumer must see the same
directory (one host, or a shared filesystem mounted at the same path). A debug connector
upstream; it is the one that runs anywhere (no RDMA, no NIXL build).
"""

from __future__ import annotations

import os
from typing import Any

from omni_pd.compile.ec_connectors.base import EC_ROLE, ECConnector, ECSideConfig, ec_facts, ec_row


class ECExampleConnector(ECConnector):
    name = "ECExampleConnector"
    summary = "shared directory (safetensors per item); E and the consumer must see the same path"
    storage_key = "shared_storage_path"

    def _emit(self) -> dict[str, Any]:
        return ec_facts()["emit"][self.name]

    def configure(self, side, engine_id, target, *, storage=None) -> ECSideConfig:
        if ec_row(self.name, target.version) is None:
            raise ValueError(f"{self.name} is not registered in vLLM {target.label}")
        path = storage or self._emit()["storage_default"]
        extra = {k: str(v).replace("{storage}", path) for k, v in self._emit()["extra"].items()}
        ec = {"ec_connector": self.name, "ec_role": EC_ROLE[side], "engine_id": engine_id,
              "ec_connector_extra_config": extra}
        return ECSideConfig(ec_transfer_config=ec, env={})

    def storage_path(self, ec: dict[str, Any]) -> str | None:
        extra = ec.get("ec_connector_extra_config") or {}
        got = extra.get(self.storage_key) if isinstance(extra, dict) else None
        return str(got) if got else str(self._emit()["storage_default"])

    def cache_file(self, storage: str, mm_hash: str) -> str | None:
        return os.path.join(storage, mm_hash, "encoder_cache.safetensors")

    def load_log(self) -> str | None:
        return str(self._emit()["load_log"])


CONNECTOR = ECExampleConnector()
