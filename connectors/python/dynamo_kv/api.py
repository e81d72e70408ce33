"""A client of the sidecar's KV block API (kvblocks/proto/dynamo/kvblocks/v1/kv_blocks.proto).

The messages come from the proto's descriptors (`kv_blocks.binpb`, written by the Rust
build and kept equal to it by `kvblocks/tests/python_descriptors.rs`), so nothing here is
generated and no protoc is needed."""

import mmap
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_SERVICE = "/dynamo.kvblocks.v1.KvBlocks/"

# As the Rust client (kvblocks/src/lib.rs `MAX_MESSAGE_BYTES`): a block of a large
# model is several MB, past gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 64 << 20


def load_messages(path: str) -> dict:
    """The message classes of a `FileDescriptorSet` file, by full name."""
    with open(path, "rb") as f:
        files = descriptor_pb2.FileDescriptorSet.FromString(f.read()).file
    pool = descriptor_pool.DescriptorPool()
    for file in files:
        pool.Add(file)
    return message_factory.GetMessages(files, pool=pool)


_MESSAGES = load_messages(os.path.join(os.path.dirname(__file__), "kv_blocks.binpb"))


def message(name: str):
    """The message class `dynamo.kvblocks.v1.<name>`."""
    return _MESSAGES[f"dynamo.kvblocks.v1.{name}"]


Block = message("Block")
LayoutMessage = message("Layout")
RegionSlice = message("RegionSlice")

# `Tier` numbers (the proto's enum, as the KV event stream numbers them).
TIERS = {0: "gpu", 1: "host", 2: "disk", 3: "object"}


@dataclass(frozen=True)
class Held:
    hash: int
    tier: str


class Region:
    """A shared memory region the sidecar made (OpenRegion), mapped here: payloads cross
    by memory copy instead of through the socket."""

    def __init__(self, region_id: int, path: str, size: int):
        self.id = region_id
        fd = os.open(path, os.O_RDWR)
        try:
            self.map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.size = size

    def slice(self, offset: int, length: int):
        return RegionSlice(region_id=self.id, offset=offset, len=length)


class BlockApi:
    """One sidecar's block API at `address` (`host:port`), with the graph's credential."""

    def __init__(self, address: str, credential=None):
        self._channel = grpc.insecure_channel(
            address,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self._metadata = (("authorization", credential.header),) if credential else ()

        def call(kind, name, request, reply):
            return getattr(self._channel, kind)(
                _SERVICE + name,
                request_serializer=message(request).SerializeToString,
                response_deserializer=message(reply).FromString,
            )

        self._lookup = call("unary_unary", "Lookup", "LookupRequest", "LookupReply")
        self._offload = call("stream_unary", "Offload", "Block", "OffloadReply")
        self._onboard = call("unary_stream", "Onboard", "OnboardRequest", "Block")
        self._open_region = call("unary_unary", "OpenRegion", "OpenRegionRequest", "OpenRegionReply")

    def close(self):
        self._channel.close()

    def lookup(self, hashes: list[int], timeout: float) -> list[Held]:
        """The longest prefix of the chain `hashes` the tiers hold, with each block's tier."""
        reply = self._lookup(
            message("LookupRequest")(hashes=hashes), timeout=timeout, metadata=self._metadata
        )
        return [Held(h.hash, TIERS.get(h.tier, "unknown")) for h in reply.held]

    def offload(self, blocks: Iterable, timeout: float):
        """Streams `blocks` (Block messages) to the tiers; the reply counts what happened."""
        return self._offload(iter(blocks), timeout=timeout, metadata=self._metadata)

    def onboard(self, hashes: list[int], region: Region | None, timeout: float) -> Iterator:
        """The held blocks of `hashes`, in order, payloads in `region` while they fit."""
        request = message("OnboardRequest")(hashes=hashes)
        if region is not None:
            request.region_id = region.id
        return self._onboard(request, timeout=timeout, metadata=self._metadata)

    def open_region(self, size: int, timeout: float) -> Region:
        reply = self._open_region(
            message("OpenRegionRequest")(bytes=size), timeout=timeout, metadata=self._metadata
        )
        return Region(reply.region_id, reply.path, reply.bytes)
