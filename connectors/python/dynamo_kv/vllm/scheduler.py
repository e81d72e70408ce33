"""The connector's scheduler side: which of a prompt's blocks the sidecar's tiers hold
(asked in the background, so a slow sidecar delays only that request, and never past the
lookup timeout), where the held ones go, and which blocks a finished request leaves to
offload."""

import logging
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from ..api import BlockApi, Held
from ..hashing import BlockHasher
from .metadata import Load, Offloaded, Save, StepMetadata
from .settings import Settings

logger = logging.getLogger(__name__)


@dataclass
class _Lookup:
    future: Future
    started: float
    # The prompt's chain: every full block but the one holding the last prompt token,
    # which the engine always computes.
    chain: list[int]


def ineligible(request) -> str | None:
    """Why a request's blocks cannot be named by token ids alone, if they cannot: vLLM
    also hashes images, salts and embeddings into a block, our hashes do not."""
    if request.prompt_token_ids is None or getattr(request, "prompt_embeds", None) is not None:
        return "prompt embeddings"
    if request.mm_features:
        return "multimodal input"
    if getattr(request, "cache_salt", None):
        return "a cache salt"
    params = request.kv_transfer_params or {}
    if params.get("do_remote_prefill"):
        # A disaggregated decode: its prompt's KV comes from the prefill engine.
        return "a remote prefill"
    return None


class SchedulerSide:
    def __init__(self, settings: Settings, vllm_config, api: BlockApi):
        self._settings = settings
        self._api = api
        self.block_size = vllm_config.cache_config.block_size
        self._model = settings.model_name
        self._hashers: dict[str | None, BlockHasher] = {}
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="dynamo-kv-lookup")
        self._lookups: dict[str, _Lookup] = {}
        # req_id -> (first block, hashes to load, parent of the first, their tiers), until
        # allocated.
        self._plans: dict[str, tuple[int, list[int], int | None, list[str]]] = {}
        self._loaded: dict[str, set[int]] = {}
        # req_id -> the tiers of the blocks being loaded, until vLLM asks (hit_tiers).
        self._tiers: dict[str, list[str]] = {}
        self._loads: list[Load] = []
        self._saves: list[Save] = []
        # Blocks the tiers hold (looked up, or confirmed offloaded), least recent first.
        self._known: OrderedDict[int, None] = OrderedDict()
        self.lookup_timeouts = 0

    def _hasher(self, request) -> BlockHasher:
        lora = request.lora_request.lora_name if request.lora_request else None
        hasher = self._hashers.get(lora)
        if hasher is None:
            hasher = self._hashers[lora] = BlockHasher(self.block_size, self._model, lora)
        return hasher

    def _remember(self, hashes):
        for h in hashes:
            self._known[h] = None
            self._known.move_to_end(h)
        while len(self._known) > self._settings.known_blocks:
            self._known.popitem(last=False)

    def _lookup(self, chain: list[int]) -> list[Held]:
        return self._api.lookup(chain, timeout=self._settings.lookup_timeout_s)

    def matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        if ineligible(request):
            return 0, False
        rid = request.request_id
        lookup = self._lookups.get(rid)
        if lookup is None:
            prompt = request.prompt_token_ids
            usable = (len(prompt) - 1) // self.block_size * self.block_size
            chain = self._hasher(request).seq_hashes(prompt[:usable])
            if not chain:
                return 0, False
            lookup = _Lookup(self._pool.submit(self._lookup, chain), time.monotonic(), chain)
            self._lookups[rid] = lookup
        first = num_computed_tokens // self.block_size
        if len(lookup.chain) <= first:
            return 0, False
        if not lookup.future.done():
            if time.monotonic() - lookup.started < self._settings.lookup_timeout_s:
                return None, False
            # The sidecar is slow: compute the prompt rather than wait.
            self.lookup_timeouts += 1
            lookup.future = _done([])
        try:
            held = lookup.future.result()
        except Exception as e:  # the sidecar is down or refused us: compute the prompt
            logger.warning("KV tier lookup failed, computing the prompt: %s", e)
            held = []
            lookup.future = _done(held)
        count = min(len(held), len(lookup.chain))
        self._remember(h.hash for h in held[:count])
        if count <= first:
            return 0, False
        parent = lookup.chain[first - 1] if first else None
        tiers = [h.tier for h in held[first:count]]
        self._plans[rid] = (first, lookup.chain[first:count], parent, tiers)
        return (count - first) * self.block_size, False

    def after_alloc(self, request, blocks, num_external_tokens: int):
        rid = request.request_id
        plan = self._plans.pop(rid, None)
        # A later call (after a preemption) asks the sidecar again.
        self._lookups.pop(rid, None)
        if plan is None or num_external_tokens <= 0:
            return
        first, hashes, parent, tiers = plan
        count = min(-(-num_external_tokens // self.block_size), len(hashes))
        block_ids = blocks.get_block_ids()[0][first : first + count]
        self._loads.append(Load(rid, hashes[:count], parent, list(block_ids)))
        self._loaded.setdefault(rid, set()).update(hashes[:count])
        self._tiers[rid] = tiers[:count]

    def hit_tiers(self, request, num_external_tokens: int) -> dict[str, int]:
        """The tokens of a request's external hit by the tier they come from."""
        tiers = self._tiers.pop(request.request_id, [])
        counts: dict[str, int] = {}
        left = num_external_tokens
        for tier in tiers:
            n = min(self.block_size, left)
            if n <= 0:
                break
            counts[tier] = counts.get(tier, 0) + n
            left -= n
        if left > 0:
            counts["unknown"] = counts.get("unknown", 0) + left
        return counts

    def step_metadata(self) -> StepMetadata:
        meta = StepMetadata(loads=self._loads, saves=self._saves)
        self._loads, self._saves = [], []
        return meta

    def finished(self, request, block_ids: list[int]) -> bool:
        """Queues the save of a finished request's computed blocks the tiers do not hold;
        true when its blocks must stay allocated until the worker has copied them."""
        rid = request.request_id
        self._lookups.pop(rid, None)
        self._plans.pop(rid, None)
        self._tiers.pop(rid, None)
        loaded = self._loaded.pop(rid, set())
        if ineligible(request):
            return False
        tokens = request.all_token_ids
        count = min(request.num_computed_tokens, len(tokens)) // self.block_size
        count = min(count, len(block_ids))
        hashes = self._hasher(request).seq_hashes(tokens[: count * self.block_size])
        blocks = [
            (h, hashes[i - 1] if i else None, block_ids[i])
            for i, h in enumerate(hashes)
            if h not in loaded and h not in self._known
        ]
        if not blocks:
            return False
        self._saves.append(Save(rid, blocks))
        return True

    def worker_output(self, output):
        meta = output.kv_connector_worker_meta
        if isinstance(meta, Offloaded):
            self._remember(meta.hashes)

    def shutdown(self):
        self._pool.shutdown(wait=False, cancel_futures=True)


def _done(value) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future
