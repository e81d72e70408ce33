"""Block identity as the router and the sidecar compute it (kvcache/src/hash.rs, DESIGN.md
"Block hashing"): full blocks only; a block's local hash is XXH3-64 of its token ids as
little-endian u32; the first block's sequence hash is its local hash, every later one is
XXH3-64 of the parent's sequence hash and the local hash, both little-endian u64. The seed
is 1337, salted by the model and LoRA names. `tests/test_vectors.py` checks this file
against vectors the Rust code writes."""

import struct

import xxhash

BASE_SEED = 1337


def salted_seed(model: str, lora: str | None) -> int:
    # The NUL keeps ("ab", "c") and ("a", "bc") apart, as in Rust.
    salt = model.encode()
    if lora is not None:
        salt += b"\0" + lora.encode()
    return xxhash.xxh3_64_intdigest(salt, seed=BASE_SEED)


class BlockHasher:
    """Sequence hashes of full `block_size`-token blocks of one model and LoRA adapter."""

    def __init__(self, block_size: int, model: str, lora: str | None = None):
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self._seed = salted_seed(model, lora)
        self._tokens = struct.Struct(f"<{block_size}I")

    def local_hash(self, tokens) -> int:
        return xxhash.xxh3_64_intdigest(self._tokens.pack(*tokens), seed=self._seed)

    def chain(self, parent: int | None, local: int) -> int:
        if parent is None:
            return local
        return xxhash.xxh3_64_intdigest(struct.pack("<QQ", parent, local), seed=self._seed)

    def seq_hashes(self, tokens, parent: int | None = None) -> list[int]:
        """The sequence hash of every full block of `tokens`, continuing after `parent`."""
        size = self.block_size
        out = []
        for start in range(0, len(tokens) - size + 1, size):
            parent = self.chain(parent, self.local_hash(tokens[start : start + size]))
            out.append(parent)
        return out
