"""The Python client computes what the Rust code computes: block hashes (the router's and
the sidecar's), payload checksums and block MACs, on vectors Rust writes
(kvblocks/tests/python_vectors.rs)."""

import json
import os

from dynamo_kv.blocks import Credential, Layout, checksum
from dynamo_kv.hashing import BlockHasher

with open(os.path.join(os.path.dirname(__file__), "vectors.json")) as f:
    VECTORS = json.load(f)


def test_block_hashes_are_the_routers():
    for v in VECTORS["hashes"]:
        hasher = BlockHasher(v["block_size"], v["model"], v["lora"])
        assert hasher.seq_hashes(v["tokens"]) == v["seq_hashes"], (v["model"], v["lora"])


def test_checksums_and_macs_are_the_sidecars():
    b = VECTORS["block"]
    payload = bytes.fromhex(b["payload_hex"])
    layout = Layout(**b["layout"])
    key = Credential(b["token"]).block_key()
    assert checksum(payload) == b["checksum"]
    mac = key.mac(b["hash"], None, b["tokens"], layout, payload)
    assert mac.hex() == b["mac_hex"]
    assert key.mac(b["hash"], b["parent"], b["tokens"], layout, payload).hex() == b["mac_with_parent_hex"]
    assert key.admits(mac, b["hash"], None, b["tokens"], layout, payload)
    tampered = bytes([payload[0] ^ 1]) + payload[1:]
    assert not key.admits(mac, b["hash"], None, b["tokens"], layout, tampered)
    other = Credential("another-graphs-token").block_key()
    assert not other.admits(mac, b["hash"], None, b["tokens"], layout, payload)
