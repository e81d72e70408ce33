"""The connector's worker side: copies blocks between the engine's paged KV cache and
the sidecar. Loads run before the step's forward (vLLM then computes only what follows);
a save copies a finished request's blocks out to host memory, which frees them, and a
thread of its own offloads the copies, so a slow sidecar never holds a step.

A payload is the block's bytes in every layer, layer after layer in the KV cache group's
order; in each layer, the block's `[H, N, C]` page (vLLM 0.33 hands connectors one
`[B, H, N, C]` view per layer), in that logical order whatever the physical layout, so
a block saved by one engine loads into any engine of the same model and dtype. Nothing
read back is used before its chain position, layout, checksum and MAC check out."""

import logging
import queue
import threading

import numpy as np
import torch

from ..api import Block, BlockApi, LayoutMessage, Region
from ..blocks import Layout, checksum
from .metadata import Load, Offloaded, StepMetadata
from .settings import Settings

logger = logging.getLogger(__name__)

# torch dtypes by the names the block API takes (kvblocks/src/layout_rules.rs).
_DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
    # vLLM's fp8 caches stored as bytes.
    torch.uint8: "fp8",
}


class PagedKv:
    """The engine's KV cache tensors, as block payloads."""

    def __init__(self, kv_caches: dict, layer_names: list[str], num_blocks: int, block_size: int):
        self.tensors = []
        seen = set()
        for name in layer_names:
            tensor = kv_caches.get(name)
            if tensor is None:
                continue
            # Layers sharing another layer's cache (cross-layer sharing) add no bytes.
            key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()))
            if key not in seen:
                seen.add(key)
                self.tensors.append(tensor)
        if not self.tensors:
            raise ValueError("no KV cache tensors to copy")
        first = self.tensors[0]
        if any(t.dtype != first.dtype or t.device != first.device for t in self.tensors):
            raise ValueError("KV cache layers differ in dtype or device")
        if first.dtype not in _DTYPE_NAMES:
            raise ValueError(f"KV cache dtype {first.dtype} has no block API name")
        if first.dim() < 2 or first.shape[0] % num_blocks:
            raise ValueError(f"KV cache view {tuple(first.shape)} is not [B, ...] of {num_blocks} blocks")
        # Kernel blocks may split a block into equal rows (vllm/v1/kv_cache_interface.py).
        self.rows = first.shape[0] // num_blocks
        self.layer_bytes = [
            self.rows * t[0].numel() * t.element_size() for t in self.tensors
        ]
        self.device = first.device
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.layout = Layout(
            block_bytes=sum(self.layer_bytes),
            block_size=block_size,
            layers=len(self.tensors),
            dtype=_DTYPE_NAMES[first.dtype],
        )

    def staging(self, count: int) -> torch.Tensor:
        """Host rows for `count` payloads (pinned beside a GPU, for DMA copies)."""
        return torch.empty((count, self.layout.block_bytes), dtype=torch.uint8, pin_memory=self.cuda)

    def _rows(self, block_ids: list[int]) -> torch.Tensor:
        r = self.rows
        rows = [b * r + j for b in block_ids for j in range(r)]
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        """The payloads of `block_ids`, copied to host rows; done when it returns."""
        out = self.staging(len(block_ids))
        with self._on_stream():
            rows = self._rows(block_ids)
            offset = 0
            for tensor, size in zip(self.tensors, self.layer_bytes):
                pages = tensor.index_select(0, rows).view(torch.uint8).reshape(len(block_ids), size)
                out[:, offset : offset + size].copy_(pages, non_blocking=self.cuda)
                offset += size
        self._synchronize()
        return out

    def scatter(self, block_ids: list[int], payloads: torch.Tensor):
        """Writes host rows of payloads into `block_ids`; done when it returns."""
        with self._on_stream():
            rows = self._rows(block_ids)
            source = payloads.to(self.device, non_blocking=self.cuda)
            offset = 0
            for tensor, size in zip(self.tensors, self.layer_bytes):
                part = source[:, offset : offset + size].contiguous().view(tensor.dtype)
                tensor.index_copy_(0, rows, part.reshape((len(rows), *tensor.shape[1:])))
                offset += size
        self._synchronize()

    def _on_stream(self):
        if not self.cuda:
            return _NoStream()
        # After whatever the engine queued on its stream (the forward that wrote them).
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self.stream)

    def _synchronize(self):
        if self.cuda:
            self.stream.synchronize()


class _NoStream:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Refused(Exception):
    pass


class WorkerSide:
    def __init__(self, settings: Settings, api: BlockApi, kv_cache_config, block_size: int):
        self._settings = settings
        self._api = api
        credential = settings.credential()
        self._key = credential.block_key() if credential else None
        self._kv_cache_config = kv_cache_config
        self._block_size = block_size
        self.kv: PagedKv | None = None
        self._region: Region | None = None
        self._region_tried = False
        self._offloader: _Offloader | None = None
        self._saved: set[str] = set()
        self._finished: set[str] = set()
        self._load_errors: set[int] = set()
        self.loaded_blocks = 0
        self.refused_blocks = 0

    def register(self, kv_caches: dict):
        group = self._kv_cache_config.kv_cache_groups[0]
        try:
            self.kv = PagedKv(kv_caches, list(group.layer_names), self._kv_cache_config.num_blocks, self._block_size)
        except ValueError as e:
            # Nothing is copied: every load the scheduler plans is reported failed.
            logger.warning("KV connector: the KV cache cannot be copied (%s); KV tiers unused", e)
            return
        self._offloader = _Offloader(self._settings, self._api, self._key, self.kv.layout)
        logger.info("KV connector: blocks of %s (%s) to the sidecar at %s", self.kv.layout, self.kv.device, self._settings.block_api)

    # Loads.

    def load(self, meta: StepMetadata):
        for load in meta.loads:
            if self.kv is None:
                self._load_errors.update(load.block_ids)
            else:
                self._load(load)

    def _onboard_region(self) -> Region | None:
        if not self._region_tried:
            self._region_tried = True
            self._region = _open_region(self._api, self._settings)
        return self._region

    def _load(self, load: Load):
        kv = self.kv
        staged = kv.staging(len(load.hashes))
        region = self._onboard_region()
        per_call = max(1, region.size // kv.layout.block_bytes) if region else len(load.hashes)
        got = 0
        try:
            for start in range(0, len(load.hashes), per_call):
                chunk = load.hashes[start : start + per_call]
                for message in self._api.onboard(chunk, region, self._settings.transfer_timeout_s):
                    if got >= len(load.hashes):
                        raise _Refused("more blocks than asked for")
                    self._admit(message, got, load, staged[got].numpy(), region)
                    got += 1
                if got < start + len(chunk):
                    break  # the tiers no longer hold the rest
        except _Refused as e:
            self.refused_blocks += 1
            logger.warning("KV connector: block %d of request %s refused (%s); computing from there", got, load.req_id, e)
        except Exception as e:  # the sidecar went away or is slow: compute the rest
            logger.warning("KV connector: onboarding for request %s stopped after %d blocks: %s", load.req_id, got, e)
        if got:
            kv.scatter(load.block_ids[:got], staged[:got])
            self.loaded_blocks += got
        if got < len(load.hashes):
            self._load_errors.update(load.block_ids[got:])

    def _admit(self, message, i: int, load: Load, row: np.ndarray, region: Region | None):
        """Copies block `i` of `load` into `row` if it is what was asked for, or refuses it."""
        want_parent = load.parent if i == 0 else load.hashes[i - 1]
        parent = message.parent if message.HasField("parent") else None
        if message.hash != load.hashes[i] or parent != want_parent:
            raise _Refused("not the block at this place in the chain")
        layout = self.kv.layout
        got = message.layout
        if (message.tokens, got.block_bytes, got.block_size, got.layers, got.dtype) != (
            layout.block_size,
            layout.block_bytes,
            layout.block_size,
            layout.layers,
            layout.dtype,
        ):
            raise _Refused("another layout")
        if message.HasField("region"):
            s = message.region
            if region is None or s.region_id != region.id or s.len != layout.block_bytes or s.offset + s.len > region.size:
                raise _Refused("a region slice that is not ours")
            row[:] = np.frombuffer(region.map, dtype=np.uint8, count=s.len, offset=s.offset)
        else:
            if len(message.payload) != layout.block_bytes:
                raise _Refused("a payload of another size")
            row[:] = np.frombuffer(message.payload, dtype=np.uint8)
        # Checked on our copy: the region is shared, what is in it may still change.
        if checksum(row) != message.checksum:
            raise _Refused("checksum")
        if self._key is not None and not self._key.admits(
            message.mac, message.hash, parent, message.tokens, layout, row
        ):
            raise _Refused("MAC")

    def load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    # Saves.

    def save(self, meta: StepMetadata):
        for save in meta.saves:
            try:
                size = len(save.blocks) * self.kv.layout.block_bytes if self.kv else 0
                if self.kv is not None and self._offloader.reserve(size):
                    staged = self.kv.gather([b for _, _, b in save.blocks])
                    self._offloader.submit(save.blocks, staged, size)
            except Exception as e:
                logger.warning("KV connector: copying request %s's blocks out failed: %s", save.req_id, e)
            finally:
                # Copied (or given up): its blocks may be freed.
                self._saved.add(save.req_id)

    def finished(self, finished_req_ids: set[str]) -> set[str]:
        """Saved requests vLLM has told this worker are finished (it may report only those)."""
        self._finished |= finished_req_ids
        done = self._saved & self._finished
        self._saved -= done
        self._finished -= done
        return done

    def offloaded(self) -> Offloaded | None:
        hashes = self._offloader.take_confirmed() if self._offloader else []
        return Offloaded(hashes) if hashes else None

    def shutdown(self):
        if self._offloader is not None:
            self._offloader.stop()


def _open_region(api: BlockApi, settings: Settings) -> Region | None:
    """A shared region for payloads, or none (they go inline): a sidecar on another host,
    or one whose region this process cannot map."""
    try:
        return api.open_region(settings.region_bytes, timeout=settings.transfer_timeout_s)
    except Exception as e:
        logger.info("KV connector: payloads go inline, no shared region (%s)", e)
        return None


class _Offloader:
    """Offloads copied-out payloads in the background, at most `offload_queue_bytes`
    waiting; what does not fit is dropped (a miss later, never a stall now)."""

    def __init__(self, settings: Settings, api: BlockApi, key, layout: Layout):
        self._settings = settings
        self._api = api
        self._key = key
        self._layout = layout
        self._layout_message = LayoutMessage(
            block_bytes=layout.block_bytes,
            block_size=layout.block_size,
            layers=layout.layers,
            dtype=layout.dtype,
        )
        self._queue: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._waiting = 0
        self._confirmed: list[int] = []
        self.dropped_blocks = 0
        self.offloaded_blocks = 0
        self._region: Region | None = None
        self._region_tried = False
        self._thread = threading.Thread(target=self._run, name="dynamo-kv-offload", daemon=True)
        self._thread.start()

    def reserve(self, size: int) -> bool:
        with self._lock:
            if self._waiting + size > self._settings.offload_queue_bytes:
                self.dropped_blocks += size // self._layout.block_bytes
                return False
            self._waiting += size
            return True

    def submit(self, blocks, staged: torch.Tensor, size: int):
        self._queue.put((blocks, staged, size))

    def take_confirmed(self) -> list[int]:
        with self._lock:
            confirmed, self._confirmed = self._confirmed, []
        return confirmed

    def stop(self):
        self._queue.put(None)

    def _run(self):
        while (job := self._queue.get()) is not None:
            blocks, staged, size = job
            try:
                self._offload(blocks, staged)
            except Exception as e:
                self.dropped_blocks += len(blocks)
                logger.warning("KV connector: offloading %d blocks failed: %s", len(blocks), e)
            finally:
                with self._lock:
                    self._waiting -= size

    def _offload(self, blocks, staged: torch.Tensor):
        if not self._region_tried:
            self._region_tried = True
            self._region = _open_region(self._api, self._settings)
        region = self._region
        size = self._layout.block_bytes
        per_call = max(1, region.size // size) if region else 1
        for start in range(0, len(blocks), per_call):
            chunk = blocks[start : start + per_call]
            messages = []
            for j, (hash_, parent, _) in enumerate(chunk):
                row = staged[start + j].numpy()
                message = Block(
                    hash=hash_,
                    tokens=self._layout.block_size,
                    checksum=checksum(row),
                    layout=self._layout_message,
                )
                if parent is not None:
                    message.parent = parent
                if self._key is not None:
                    message.mac = self._key.mac(hash_, parent, self._layout.block_size, self._layout, row)
                if region is not None:
                    view = np.frombuffer(region.map, dtype=np.uint8, count=size, offset=j * size)
                    view[:] = row
                    message.region.CopyFrom(region.slice(j * size, size))
                else:
                    message.payload = row.tobytes()
                messages.append(message)
            reply = self._api.offload(messages, timeout=self._settings.transfer_timeout_s)
            held = reply.stored + reply.duplicates
            self.offloaded_blocks += reply.stored
            self.dropped_blocks += len(chunk) - held
            if held == len(chunk):
                with self._lock:
                    self._confirmed.extend(h for h, _, _ in chunk)
