"""What the scheduler side tells the workers each step (vLLM pickles it to them)."""

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)


@dataclass
class Load:
    """Onboard a run of a request's prompt blocks into the engine's block slots."""

    req_id: str
    # Sequence hashes, in chain order, and the hash of the block before the first
    # (None: the run starts the prompt).
    hashes: list[int]
    parent: int | None
    block_ids: list[int]


@dataclass
class Save:
    """Copy a finished request's blocks out and offload them; its blocks stay allocated
    until the copy is done (the worker reports the request in `finished_sending`)."""

    req_id: str
    # (sequence hash, parent hash or None, block id) per block.
    blocks: list[tuple[int, int | None, int]]


@dataclass
class StepMetadata(KVConnectorMetadata):
    loads: list[Load] = field(default_factory=list)
    saves: list[Save] = field(default_factory=list)


@dataclass
class Offloaded(KVConnectorWorkerMetadata):
    """Worker -> scheduler: blocks the sidecar confirmed it holds."""

    hashes: list[int] = field(default_factory=list)

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        assert isinstance(other, Offloaded)
        return Offloaded(self.hashes + other.hashes)
