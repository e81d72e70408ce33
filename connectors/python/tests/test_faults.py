"""What goes wrong loads no wrong KV: with the sidecar down or slow the connector reports
no hit and the prompt is computed; a block without the graph's MAC, or whose checksum
fails, is never loaded (vLLM computes it instead). The engine leaks no block either way."""

from concurrent import futures

import grpc

from dynamo_kv.api import BlockApi, message
from dynamo_kv.blocks import Credential, Layout, checksum

from engine import BLOCK_SIZE, LAYERS, Engine, block_bytes, expected_bytes, hashes, spec
from sidecar import Sidecar

PROMPT = [3000 + 11 * i for i in range(100)]
LOADABLE = (len(PROMPT) - 1) // BLOCK_SIZE
TOKEN = "the-graphs-token"


def assert_computed_right(engine: Engine, rid: str):
    """`rid` ran to the end, its whole prompt's KV as computing it gives."""
    blocks = engine.block_ids(rid)[:LOADABLE]
    assert engine.kv_bytes(blocks) == expected_bytes(PROMPT, LOADABLE)
    engine.run(lambda: engine.finished(rid))


def assert_no_leak(engine: Engine):
    engine.run(lambda: not engine.scheduler.requests)
    pool = engine.scheduler.kv_cache_manager.block_pool
    # Every block is free again but the pool's null block.
    assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1


def test_a_sidecar_that_is_down_gives_no_hit_and_the_prompt_is_computed():
    sidecar = Sidecar("--kv-host-bytes", "64MiB")
    address = sidecar.block_api
    sidecar.stop()
    engine = Engine(address, None)
    rid = engine.add(PROMPT)
    engine.run(lambda: rid in engine.scheduler.requests and engine.scheduler.requests[rid].num_computed_tokens > 0)
    assert engine.first_scheduled(rid) == len(PROMPT)
    assert_computed_right(engine, rid)
    assert_no_leak(engine)


def test_a_slow_sidecar_gives_no_hit_within_the_lookup_timeout():
    with Sidecar("--kv-host-bytes", "64MiB") as sidecar:
        engine = Engine(sidecar.block_api, sidecar.token_file)
        first = engine.add(PROMPT)
        engine.run(lambda: engine.finished(first))
        engine.wait_offloaded(LOADABLE)
        assert engine.scheduler.reset_prefix_cache()
        engine.zero_kv()
        sidecar.freeze()
        try:
            rid = engine.add(PROMPT)
            engine.run(lambda: any(rid in step for step in engine.scheduled[-1:]))
            # The blocks are in the tiers, but the lookup did not answer in time.
            assert engine.first_scheduled(rid) == len(PROMPT)
            assert engine.connector._scheduler.lookup_timeouts == 1
            assert_computed_right(engine, rid)
        finally:
            sidecar.thaw()
        assert_no_leak(engine)


def _write(token: str) -> str:
    import tempfile

    f = tempfile.NamedTemporaryFile("w", delete=False, suffix=".token")
    f.write(token)
    f.close()
    return f.name


def _payloads() -> list[bytes]:
    """The right payload of each loadable block of PROMPT: every layer's page in turn."""
    layers = expected_bytes(PROMPT, LOADABLE)
    page = spec().page_size_bytes
    return [b"".join(layer[i * page : (i + 1) * page] for layer in layers) for i in range(LOADABLE)]


LAYOUT = Layout(block_bytes=block_bytes(), block_size=BLOCK_SIZE, layers=LAYERS, dtype="float16")


def _block(hash_, parent, payload: bytes, sum_: int, mac: bytes = b""):
    m = message("Block")(
        hash=hash_,
        tokens=BLOCK_SIZE,
        checksum=sum_,
        layout=message("Layout")(block_bytes=LAYOUT.block_bytes, block_size=BLOCK_SIZE, layers=LAYERS, dtype="float16"),
        payload=payload,
        mac=mac,
    )
    if parent is not None:
        m.parent = parent
    return m


def _reloaded_by_computing(engine: Engine):
    """Request 2 is told of the blocks, refuses them when they come, and computes them."""
    rid = engine.add(PROMPT)
    steps = lambda: [step[rid] for step in engine.scheduled if rid in step]  # noqa: E731
    engine.run(lambda: len(steps()) == 2)
    # The lookup promised the blocks; the load refused the first, so vLLM computed the
    # prompt again from there.
    assert steps() == [len(PROMPT) - LOADABLE * BLOCK_SIZE, len(PROMPT)]
    assert engine.worker._worker.refused_blocks == 1
    assert_computed_right(engine, rid)
    assert_no_leak(engine)


def test_a_block_without_the_graphs_mac_is_never_loaded():
    # A sidecar without a credential takes blocks from any local process: a stranger
    # stores the prompt's blocks with the right checksums but garbage payloads.
    with Sidecar("--kv-host-bytes", "64MiB", token=None) as sidecar:
        engine = Engine(sidecar.block_api, _write(TOKEN))
        chain = hashes(PROMPT)[:LOADABLE]
        garbage = [bytes([0x55]) * LAYOUT.block_bytes for _ in chain]
        stranger = BlockApi(sidecar.block_api)
        reply = stranger.offload(
            [_block(h, chain[i - 1] if i else None, p, checksum(p)) for i, (h, p) in enumerate(zip(chain, garbage))],
            timeout=10,
        )
        assert reply.stored == LOADABLE
        _reloaded_by_computing(engine)


class _LyingBlockApi:
    """A block API that says it holds the prompt and serves its blocks with payloads that
    do not match their checksums (what rot or a compromised peer would send)."""

    def __init__(self, payloads: list[bytes]):
        chain = hashes(PROMPT)[:LOADABLE]
        key = Credential(TOKEN).block_key()
        self.blocks = {}
        for i, (h, good) in enumerate(zip(chain, payloads)):
            parent = chain[i - 1] if i else None
            bad = bytes([good[0] ^ 0xFF]) + good[1:]
            self.blocks[h] = _block(h, parent, bad, checksum(good), key.mac(h, parent, BLOCK_SIZE, LAYOUT, bad))
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        handlers = {
            "Lookup": grpc.unary_unary_rpc_method_handler(
                self.lookup,
                request_deserializer=message("LookupRequest").FromString,
                response_serializer=message("LookupReply").SerializeToString,
            ),
            "Onboard": grpc.unary_stream_rpc_method_handler(
                self.onboard,
                request_deserializer=message("OnboardRequest").FromString,
                response_serializer=message("Block").SerializeToString,
            ),
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("dynamo.kvblocks.v1.KvBlocks", handlers),)
        )
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def lookup(self, request, context):
        held = [message("Held")(hash=h, tier=1) for h in request.hashes if h in self.blocks]
        return message("LookupReply")(held=held)

    def onboard(self, request, context):
        for h in request.hashes:
            yield self.blocks[h]


def test_a_block_whose_checksum_fails_is_never_loaded():
    liar = _LyingBlockApi(_payloads())
    try:
        _reloaded_by_computing(Engine(liar.address, _write(TOKEN)))
    finally:
        liar.server.stop(0)
