"""vLLM's real v1 scheduler with our connector, and a worker that runs it as vLLM's model
runner would: bind the step's connector metadata, load, run the "model", save, report.
The model writes each token's KV (every layer, head and channel) as a function of the
tokens up to it, so KV loaded from the sidecar can be compared with what computing it
gives, byte for byte. The KV cache is vLLM's own allocation (`allocate_kv_cache`, one
`[B, H, N, C]` view per layer) on CPU tensors."""

import os
import time

import torch
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVEventsConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.utils import allocate_kv_cache

from dynamo_kv.hashing import BlockHasher
from dynamo_kv.vllm import DynamoSidecarConnector

from sidecar import MODEL

BLOCK_SIZE = 16
LAYERS = 3
HEADS = 2
HEAD_SIZE = 8
EOS = 2

init_none_hash(sha256)


def spec() -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=BLOCK_SIZE, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=torch.float16
    )


def block_bytes() -> int:
    """Bytes of one block's payload: every layer's page."""
    return LAYERS * spec().page_size_bytes


def hashes(prompt: list[int]) -> list[int]:
    """Our hashes of a prompt's full blocks, as the router and the sidecar name them."""
    return BlockHasher(BLOCK_SIZE, MODEL).seq_hashes(prompt)


class Engine:
    def __init__(self, block_api: str, token_file: str | None, num_blocks: int = 128, events: str | None = None, **extra):
        extra_config = {"block_api": block_api, "lookup_timeout_s": 0.3, "transfer_timeout_s": 3.0, **extra}
        if token_file is not None:
            extra_config["token_file"] = token_file
        model_config = ModelConfig(
            model=os.environ["DYNAMO_MODEL_DIR"],
            served_model_name=MODEL,
            dtype="float16",
            seed=0,
            max_model_len=4096,
            skip_tokenizer_init=True,
        )
        self.config = VllmConfig(
            model_config=model_config,
            scheduler_config=SchedulerConfig(
                max_num_seqs=16,
                max_num_batched_tokens=512,
                max_model_len=4096,
                enable_chunked_prefill=True,
                is_encoder_decoder=False,
            ),
            cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True),
            kv_transfer_config=KVTransferConfig(
                kv_connector="DynamoSidecarConnector",
                kv_connector_module_path="dynamo_kv.vllm",
                kv_role="kv_both",
                kv_load_failure_policy="recompute",
                kv_connector_extra_config=extra_config,
            ),
            kv_events_config=(
                KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=events)
                if events
                else None
            ),
            device_config=DeviceConfig("cpu"),
        )
        layers = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        page = spec().page_size_bytes
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[
                KVCacheTensor(
                    size=page * num_blocks * LAYERS,
                    layers=layers,
                    layer_stride=page * num_blocks,
                    block_stride=page,
                )
            ],
            kv_cache_groups=[KVCacheGroupSpec(layers, spec())],
        )
        self.config.cache_config.num_gpu_blocks = num_blocks
        self.scheduler = Scheduler(
            vllm_config=self.config,
            kv_cache_config=self.kv_cache_config,
            log_stats=True,
            structured_output_manager=StructuredOutputManager(self.config),
            block_size=BLOCK_SIZE,
        )
        caches = allocate_kv_cache(self.kv_cache_config, torch.device("cpu"), KVCacheLayout.LBNHC)
        self.kv = [caches[name] for name in layers]
        self.worker = DynamoSidecarConnector(self.config, KVConnectorRole.WORKER, self.kv_cache_config)
        self.worker.register_kv_caches(caches)
        self._next = 0
        # Per step: request id -> tokens the scheduler computed (not loaded).
        self.scheduled: list[dict[str, int]] = []

    @property
    def connector(self) -> DynamoSidecarConnector:
        return self.scheduler.connector

    def add(self, prompt: list[int], max_tokens: int = 2) -> str:
        self._next += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        params.update_from_generation_config({}, EOS)
        request = Request(
            request_id=f"r{self._next}",
            prompt_token_ids=list(prompt),
            sampling_params=params,
            pooling_params=None,
            block_hasher=get_request_block_hasher(BLOCK_SIZE, sha256),
        )
        self.scheduler.add_request(request)
        return request.request_id

    def step(self):
        out = self.scheduler.schedule()
        worker = self.worker
        worker.bind_connector_metadata(out.kv_connector_metadata)
        worker.start_load_kv(None)
        sampled = self._forward(out)
        worker.wait_for_save()
        sending, recving = worker.get_finished(out.finished_req_ids)
        errors = worker.get_block_ids_with_load_errors()
        worker_meta = worker.build_connector_worker_meta()
        worker.clear_connector_metadata()
        ids = list(out.num_scheduled_tokens)
        output = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=[sampled[r] for r in ids],
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=None,
            kv_connector_output=KVConnectorOutput(
                finished_sending=sending,
                finished_recving=recving,
                invalid_block_ids=errors,
                kv_connector_worker_meta=worker_meta,
            ),
        )
        self.scheduled.append(dict(out.num_scheduled_tokens))
        self.scheduler.update_from_output(out, output)
        return out

    def _forward(self, out) -> dict[str, list[int]]:
        sampled = {}
        for rid, count in out.num_scheduled_tokens.items():
            request = self.scheduler.requests[rid]
            end = request.num_computed_tokens
            start = end - count
            block_ids = self.block_ids(rid)
            tokens = request.all_token_ids
            for pos in range(start, end):
                value = kv_of(tokens, pos)
                for layer, kv in enumerate(self.kv):
                    kv[block_ids[pos // BLOCK_SIZE], :, pos % BLOCK_SIZE, :] = value + layer
            done_prefill = end >= request.num_prompt_tokens
            sampled[rid] = [100 + end] if done_prefill else []
        return sampled

    def block_ids(self, rid: str) -> list[int]:
        return list(self.scheduler.kv_cache_manager.get_block_ids(rid)[0])

    def run(self, until, timeout: float = 30.0):
        """Steps until `until()` holds; a step that schedules nothing (a lookup still out)
        is followed by a pause, as an idle engine polls."""
        deadline = time.monotonic() + timeout
        while not until():
            if time.monotonic() > deadline:
                raise AssertionError("the engine did not get there")
            if not self.step().num_scheduled_tokens:
                time.sleep(0.001)

    def first_scheduled(self, rid: str) -> int:
        """The tokens the scheduler computed in the first step it scheduled `rid`."""
        return next(step[rid] for step in self.scheduled if rid in step)

    def finished(self, rid: str) -> bool:
        return rid not in self.scheduler.requests

    def wait_offloaded(self, count: int, timeout: float = 30.0):
        """Until the worker's offloader has had `count` blocks confirmed by the sidecar."""
        offloader = self.worker._worker._offloader
        deadline = time.monotonic() + timeout
        while offloader.offloaded_blocks < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{offloader.offloaded_blocks} of {count} blocks offloaded")
            time.sleep(0.02)

    def zero_kv(self):
        for kv in self.kv:
            kv.zero_()

    def kv_bytes(self, block_ids: list[int]) -> list[bytes]:
        """Each layer's pages of `block_ids`, as bytes."""
        return [kv[block_ids].contiguous().view(torch.uint8).numpy().tobytes() for kv in self.kv]



def expected_bytes(tokens: list[int], blocks: int) -> list[bytes]:
    """What computing `blocks` blocks of `tokens` writes in each layer, as bytes."""
    out = []
    for layer in range(LAYERS):
        pages = torch.zeros((blocks, HEADS, BLOCK_SIZE, 2 * HEAD_SIZE), dtype=torch.float16)
        for pos in range(blocks * BLOCK_SIZE):
            pages[pos // BLOCK_SIZE, :, pos % BLOCK_SIZE, :] = kv_of(tokens, pos) + layer
        out.append(pages.view(torch.uint8).numpy().tobytes())
    return out


def kv_of(tokens: list[int], pos: int) -> torch.Tensor:
    """The "model": one token's KV (`[H, C]`, C holding K and V), a function of every
    token up to it."""
    prefix = sum((t % 251) * (i + 1) for i, t in enumerate(tokens[: pos + 1])) % 997
    heads = torch.arange(HEADS, dtype=torch.float32).reshape(HEADS, 1)
    channels = torch.arange(2 * HEAD_SIZE, dtype=torch.float32).reshape(1, 2 * HEAD_SIZE)
    return (prefix / 8 + heads * 0.5 + channels * 0.125).to(torch.float16)
