"""`DynamoSidecarConnector`: vLLM's KV connector API (`KVConnectorBase_V1`, vLLM 0.33) on
the sidecar's KV block tiers. Loaded with

    --kv-transfer-config '{"kv_connector": "DynamoSidecarConnector",
      "kv_connector_module_path": "dynamo_kv.vllm", "kv_role": "kv_both",
      "kv_load_failure_policy": "recompute",
      "kv_connector_extra_config": {"block_api": "127.0.0.1:9100"}}'

One instance runs in the scheduler (`scheduler.py`), one in each worker (`worker.py`).
It is a best-effort cache: a block it cannot load is computed, a save it cannot make is a
miss later."""

import logging
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from ..api import BlockApi
from .metadata import StepMetadata
from .scheduler import SchedulerSide
from .settings import Settings
from .worker import WorkerSide

logger = logging.getLogger(__name__)

_SOURCES = {"host": CacheHitSource.HOST, "disk": CacheHitSource.DISK}


def unsupported(vllm_config, kv_cache_config) -> str | None:
    """Why this engine's blocks cannot go to the tiers, if they cannot."""
    parallel = vllm_config.parallel_config
    if parallel.world_size > 1:
        # Each rank holds a shard of a block under the same hash; the tiers keep one.
        return f"{parallel.world_size} ranks (tensor or pipeline parallel)"
    if not vllm_config.cache_config.enable_prefix_caching:
        return "prefix caching off"
    groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
    if len(groups) != 1:
        return f"{len(groups)} KV cache groups (hybrid models)"
    spec = groups[0].kv_cache_spec
    if not isinstance(spec, FullAttentionSpec) or getattr(spec, "sliding_window", None):
        return f"{type(spec).__name__} layers"
    return None


class DynamoSidecarConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        settings = Settings.of(vllm_config)
        self._scheduler: SchedulerSide | None = None
        self._worker: WorkerSide | None = None
        reason = unsupported(vllm_config, kv_cache_config)
        if reason:
            logger.warning("DynamoSidecarConnector: KV tiers unused with %s", reason)
            return
        api = BlockApi(settings.block_api, settings.credential())
        block_size = vllm_config.cache_config.block_size
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(settings, vllm_config, api)
        else:
            self._worker = WorkerSide(settings, api, kv_cache_config, block_size)

    @property
    def requires_kv_delivery(self) -> bool:
        # A cache, not a hand-off: a dropped save is a later miss.
        return False

    # Worker side.

    def register_kv_caches(self, kv_caches):
        if self._worker is not None:
            self._worker.register(kv_caches)

    def start_load_kv(self, forward_context, **kwargs: Any) -> None:
        if self._worker is not None and self.has_connector_metadata():
            self._worker.load(self._metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads are done before the forward

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs: Any) -> None:
        return  # a finished request's blocks are saved whole (wait_for_save)

    def wait_for_save(self):
        if self._worker is not None and self.has_connector_metadata():
            self._worker.save(self._metadata())

    def get_finished(self, finished_req_ids: set[str]):
        if self._worker is None:
            return None, None
        return self._worker.finished(finished_req_ids) or None, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.load_errors() if self._worker is not None else set()

    def build_connector_worker_meta(self):
        return self._worker.offloaded() if self._worker is not None else None

    def shutdown(self):
        for side in (self._worker, self._scheduler):
            if side is not None:
                side.shutdown()

    def _metadata(self) -> StepMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, StepMetadata)
        return meta

    # Scheduler side.

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        if self._scheduler is None:
            return 0, False
        return self._scheduler.matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        if self._scheduler is not None:
            self._scheduler.after_alloc(request, blocks, num_external_tokens)

    def get_external_cache_hit_sources(self, request, num_external_tokens: int):
        if self._scheduler is None or num_external_tokens == 0:
            return {}
        counts: dict = {}
        for tier, n in self._scheduler.hit_tiers(request, num_external_tokens).items():
            source = _SOURCES.get(tier, CacheHitSource.EXTERNAL_UNSPECIFIED)
            counts[source] = counts.get(source, 0) + n
        return counts

    def build_connector_meta(self, scheduler_output) -> StepMetadata:
        if self._scheduler is None:
            return StepMetadata()
        return self._scheduler.step_metadata()

    def request_finished(self, request, block_ids: list[int]):
        if self._scheduler is None:
            return False, None
        return self._scheduler.finished(request, block_ids), None

    def update_connector_output(self, connector_output):
        if self._scheduler is not None:
            self._scheduler.worker_output(connector_output)
