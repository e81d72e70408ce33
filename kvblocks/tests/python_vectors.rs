//! Vectors the Python client checks itself against (`connectors/python/tests/
//! test_vectors.py`): block hashes, a payload's checksum and a block's MAC as this code
//! computes them. Rewrite with `UPDATE_GOLDEN=1 cargo nextest run -p dynamo-kvblocks
//! --test python_vectors`.

use bytes::Bytes;
use dynamo_kvblocks::{Block, BlockKey, Credential, Layout};
use dynamo_kvcache::{BlockHasher, SeqHash};
use serde_json::json;

fn hashes(block_size: usize, model: &str, lora: Option<&str>, tokens: &[u32]) -> serde_json::Value {
    let seq: Vec<u64> = BlockHasher::new(block_size, model, lora)
        .seq_hashes(tokens)
        .into_iter()
        .map(|h| h.0)
        .collect();
    json!({"block_size": block_size, "model": model, "lora": lora, "tokens": tokens, "seq_hashes": seq})
}

fn vectors() -> serde_json::Value {
    let tokens: Vec<u32> = (0..70).map(|i| i * 7919 % 151_000).collect();
    let token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), format!("{token}\n")).unwrap();
    let key = BlockKey::of(&Credential::read(file.path()).unwrap());
    let payload: Vec<u8> = (0..4096u32).map(|i| (i * 31 % 251) as u8).collect();
    let layout = Layout {
        block_bytes: payload.len() as u64,
        block_size: 16,
        layers: 2,
        dtype: "bfloat16".into(),
    };
    let block = |parent| {
        Block::new(
            SeqHash(0xDEAD_BEEF_0123_4567),
            parent,
            16,
            layout.clone(),
            Bytes::from(payload.clone()),
        )
    };
    let first = block(None);
    let later = block(Some(SeqHash(u64::MAX - 1)));
    json!({
        "hashes": [
            hashes(16, "Qwen/Qwen3-0.6B", None, &tokens),
            hashes(16, "Qwen/Qwen3-0.6B", Some("sql-adapter"), &tokens),
            hashes(4, "", None, &tokens[..9]),
        ],
        "block": {
            "token": token,
            "hash": first.hash.0,
            "tokens": 16,
            "layout": {"block_bytes": layout.block_bytes, "block_size": 16, "layers": 2, "dtype": "bfloat16"},
            "payload_hex": hex(&payload),
            "checksum": first.checksum,
            "mac_hex": hex(&key.mac(&first)),
            "parent": later.parent.unwrap().0,
            "mac_with_parent_hex": hex(&key.mac(&later)),
        },
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn the_python_clients_vectors_are_what_this_code_computes() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../connectors/python/tests/vectors.json");
    let want = serde_json::to_string_pretty(&vectors()).unwrap() + "\n";
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == want,
        "{} differs from what the Rust code computes: run `UPDATE_GOLDEN=1 cargo nextest run -p \
         dynamo-kvblocks --test python_vectors` and review the diff",
        path.display()
    );
}
