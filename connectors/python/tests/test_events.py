"""The connector names blocks as the engine's own KV events do once the sidecar has
translated them: vLLM's real scheduler publishes its events (vLLM's ZMQ publisher), the
real sidecar relays them, and the blocks the connector offloaded appear in the sidecar's
event stream in the host tier under the same hashes as vLLM's GPU blocks. Blocks vLLM
itself offloads (its events with medium CPU or STORAGE, in both of the forms 0.33
writes) are credited by tier as well."""

import os
import socket
import threading
import time

import grpc
from vllm.config import KVEventsConfig
from vllm.distributed.kv_events import (
    BlockRemoved,
    BlockStored,
    EventPublisherFactory,
    KVEventBatch,
)

from dynamo_kv.api import load_messages
from engine import BLOCK_SIZE, Engine, hashes
from sidecar import Sidecar, eventually

TIERS = {0: "gpu", 1: "host", 2: "disk", 3: "object"}


MESSAGES = load_messages(os.path.join(os.path.dirname(__file__), "kv_events.binpb"))


class PodView:
    """What a subscriber of the sidecar's KV event stream knows: our hash -> its tiers."""

    def __init__(self, sidecar: Sidecar):
        with open(sidecar.token_file) as f:
            token = f.read().strip()
        self.channel = grpc.insecure_channel(sidecar.block_api)
        subscribe = self.channel.unary_stream(
            "/dynamo.kv.v1.KvEventStream/Subscribe",
            request_serializer=MESSAGES["dynamo.kv.v1.SubscribeRequest"].SerializeToString,
            response_deserializer=MESSAGES["dynamo.kv.v1.EventMessage"].FromString,
        )
        self.stream = subscribe(
            MESSAGES["dynamo.kv.v1.SubscribeRequest"](), metadata=(("authorization", f"Bearer {token}"),)
        )
        self.tiers: dict[int, set[str]] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._follow, daemon=True).start()

    def _stored(self, stored):
        for block in stored.blocks:
            self.tiers.setdefault(block.seq_hash, set()).add(TIERS[block.tier])

    def _follow(self):
        try:
            for event in self.stream:
                with self.lock:
                    body = event.WhichOneof("body")
                    if body == "snapshot":
                        self.tiers = {}
                        for chain in event.snapshot.chains:
                            self._stored(chain)
                    elif body == "stored":
                        self._stored(event.stored)
                    elif body == "removed":
                        for block in event.removed.blocks:
                            self.tiers.get(block.seq_hash, set()).discard(TIERS[event.removed.tier])
                    elif body == "cleared":
                        self.tiers = {}
        except grpc.RpcError:
            pass  # closed at the end of a test

    def of(self, chain: list[int]) -> list[set[str]]:
        with self.lock:
            return [set(self.tiers.get(h, ())) for h in chain]

    def close(self):
        self.stream.cancel()
        self.channel.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_offloaded_blocks_have_the_hashes_of_the_engines_own_events():
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    with Sidecar("--kv-host-bytes", "64MiB", kv_events=endpoint) as sidecar:
        engine = Engine(sidecar.block_api, sidecar.token_file, events=endpoint)
        view = PodView(sidecar)
        try:
            # ZMQ delivers only once the sidecar's subscription has reached vLLM's
            # publisher: warm up with short prompts until one shows in the stream.
            for warm in range(100):
                probe = [9000 + 100 * warm + i for i in range(BLOCK_SIZE + 1)]
                rid = engine.add(probe, max_tokens=1)
                engine.run(lambda: engine.finished(rid))
                time.sleep(0.05)
                if "gpu" in view.of(hashes(probe))[0]:
                    break
            prompt = [4000 + 13 * i for i in range(100)]
            chain = hashes(prompt)
            rid = engine.add(prompt)
            engine.run(lambda: engine.finished(rid))
            # vLLM cached the 6 full blocks of what it computed; the sidecar named them by
            # our hash, the connector offloaded the same 6 under the same names.
            eventually(lambda: all("gpu" in t for t in view.of(chain[:6])), "vLLM's GPU blocks in the stream")
            eventually(lambda: all("host" in t for t in view.of(chain[:6])), "the connector's blocks in the host tier")
            assert engine.worker._worker._offloader.offloaded_blocks == 6 + warm + 1
        finally:
            view.close()


def test_blocks_vllm_offloads_itself_are_credited_by_tier():
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    publisher = EventPublisherFactory.create(
        KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint)
    )
    with Sidecar(kv_events=endpoint) as sidecar:
        view = PodView(sidecar)
        try:
            prompt = [7000 + 5 * i for i in range(4 * BLOCK_SIZE)]
            chain = hashes(prompt)
            # vLLM's own hashes of the blocks, opaque to us.
            theirs = [0xA0 + i for i in range(4)]

            def stored(i, medium):
                return BlockStored(
                    block_hashes=[theirs[i]],
                    parent_block_hash=theirs[i - 1] if i else None,
                    token_ids=prompt[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE],
                    block_size=BLOCK_SIZE,
                    lora_id=None,
                    medium=medium,
                    lora_name=None,
                )

            def by_hash(i, medium):
                # What vLLM's offloading connector writes for a block it holds no tokens
                # of (`_placeholder_stored`).
                return BlockStored(
                    block_hashes=[theirs[i]],
                    parent_block_hash=None,
                    token_ids=[],
                    block_size=0,
                    lora_id=None,
                    medium=medium,
                    lora_name=None,
                )

            events = [stored(i, "GPU") for i in range(4)]
            events += [stored(0, "CPU"), stored(1, "CPU"), by_hash(2, "CPU"), by_hash(3, "STORAGE")]
            events += [BlockRemoved(block_hashes=theirs, medium="GPU")]
            deadline = time.monotonic() + 30
            # Until the sidecar's subscription has reached the publisher.
            while "gpu" not in view.of(chain)[0] and time.monotonic() < deadline:
                publisher.publish(KVEventBatch(ts=time.time(), events=events[:1]))
                time.sleep(0.05)
            publisher.publish(KVEventBatch(ts=time.time(), events=events))
            want = [{"host"}, {"host"}, {"host"}, {"disk"}]
            eventually(lambda: view.of(chain) == want, f"tiers {want}, not {view.of(chain)}")
        finally:
            view.close()
            publisher.shutdown()
