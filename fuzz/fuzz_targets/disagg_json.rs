//! Raw bytes as the JSON a decode pod's sidecar takes from outside in disaggregated
//! serving (`sidecar/src/disagg/`): a client's request body it rewrites into the prefill
//! leg, a prefill pod's answer with its `kv_transfer_params`, and the local runner's
//! endpoints file it reads its prefill peers from; and a request body's agent hints
//! (`nvext`, `dynamo_llm::agent_hints`), which the picker and the engine read. Nothing may
//! panic; the prefill leg always asks for one whole token and a remote decode; parameters
//! that parse read back the same once written; an endpoints file that parses reads back
//! the same; hints that parse have a pin TTL within its bounds.
#![no_main]

use dynamo_llm::agent_hints::AgentHints;
use dynamo_llm::disagg::{KvTransferParams, prefill_body};
use dynamo_server::endpoints_file::EndpointsFile;
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};

fn check_body(body: &Map<String, Value>) {
    let leg = prefill_body(body);
    assert_eq!(leg["stream"], false);
    assert_eq!(leg["max_tokens"], 1);
    assert!(!leg.contains_key("stream_options") && !leg.contains_key("min_tokens"));
    let params = KvTransferParams::of(&leg).expect("the leg's own parameters parse");
    assert!(params.do_remote_decode && !params.do_remote_prefill);

    if let Some(params) = KvTransferParams::of(body) {
        let mut written = Map::new();
        params.put(&mut written);
        assert_eq!(KvTransferParams::of(&written), Some(params));
    }
}

fn check_hints(body: &Map<String, Value>) {
    if let Ok(hints) = AgentHints::from_nvext(body.get("nvext")) {
        assert!(hints.pin_ttl.is_none_or(|t| !t.is_zero() && t.as_secs() <= 24 * 3600));
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(data) {
        check_body(&body);
        check_hints(&body);
    }
    if let Ok(text) = std::str::from_utf8(data)
        && let Ok(file) = EndpointsFile::parse(text)
    {
        let again = serde_json::to_string(&file).expect("serializes");
        assert_eq!(EndpointsFile::parse(&again), Ok(file));
    }
});
