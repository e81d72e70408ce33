"""Request 1's blocks are offloaded to a real sidecar when it finishes; after vLLM's GPU
prefix cache is reset, request 2 with the same prompt gets them as an external hit from
vLLM's real scheduler, and its KV is loaded byte for byte, from host memory and from
disk."""

from dynamo_kv.api import BlockApi
from dynamo_kv.blocks import Credential

from engine import BLOCK_SIZE, Engine, block_bytes, expected_bytes, hashes
from sidecar import Sidecar, eventually

PROMPT = [1000 + 7 * i for i in range(100)]
# vLLM always computes a prompt's last token: 6 of its 6.25 blocks can be loaded.
LOADABLE = (len(PROMPT) - 1) // BLOCK_SIZE


def held(sidecar: Sidecar, tokens) -> list:
    api = BlockApi(sidecar.block_api, Credential.read(sidecar.token_file))
    try:
        return api.lookup(hashes(tokens), timeout=10)
    finally:
        api.close()


def first_run(engine: Engine, sidecar: Sidecar):
    """Request 1 computes the prompt and, once finished, offloads its blocks."""
    r1 = engine.add(PROMPT)
    engine.run(lambda: engine.finished(r1))
    assert engine.first_scheduled(r1) == len(PROMPT), "nothing to load the first time"
    # 100 prompt tokens and the first answer token are computed: 6 full blocks.
    engine.wait_offloaded(LOADABLE)
    assert len(held(sidecar, PROMPT)) == LOADABLE


def second_run(engine: Engine):
    """Request 2 loads what request 1 left and computes only the rest."""
    assert engine.scheduler.reset_prefix_cache()
    engine.zero_kv()
    r2 = engine.add(PROMPT)
    engine.run(lambda: r2 in engine.scheduled[-1] if engine.scheduled else False)
    assert engine.scheduled[-1][r2] == len(PROMPT) - LOADABLE * BLOCK_SIZE
    request = engine.scheduler.requests[r2]
    assert request.num_computed_tokens == len(PROMPT)
    loaded = engine.block_ids(r2)[:LOADABLE]
    assert engine.kv_bytes(loaded) == expected_bytes(PROMPT, LOADABLE)
    engine.run(lambda: engine.finished(r2))
    return r2


def test_blocks_offloaded_from_host_memory_load_byte_exact():
    with Sidecar("--kv-host-bytes", "64MiB") as sidecar:
        engine = Engine(sidecar.block_api, sidecar.token_file)
        first_run(engine, sidecar)
        assert {h.tier for h in held(sidecar, PROMPT)} == {"host"}
        second_run(engine)
        assert engine.worker._worker.loaded_blocks == LOADABLE


def test_blocks_demoted_to_disk_load_byte_exact(tmp_path):
    # Room for 8 blocks in host memory; every block goes on to disk.
    host = 8 * block_bytes()
    flags = ["--kv-host-bytes", str(host), "--kv-disk-dir", str(tmp_path), "--kv-disk-bytes", "64MiB", "--kv-disk-min-reuse", "1"]
    with Sidecar(*flags) as sidecar:
        engine = Engine(sidecar.block_api, sidecar.token_file)
        first_run(engine, sidecar)
        # Another request's 12 blocks push request 1's out of host memory.
        other = [5000 + 3 * i for i in range(12 * BLOCK_SIZE + 1)]
        r = engine.add(other)
        engine.run(lambda: engine.finished(r))
        engine.wait_offloaded(LOADABLE + 12)
        eventually(lambda: [h.tier for h in held(sidecar, PROMPT)] == ["disk"] * LOADABLE, "request 1's blocks on disk only")
        second_run(engine)
