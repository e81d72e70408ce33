//! Replays the shared Mooncake synthetic trace over 8 simulated workers with two routers
//! and prints wall time and the stats. Run: `cargo bench -p dynamo-mocker --bench
//! replay_mooncake`.

use std::time::Instant;

use dynamo_mocker::EngineConfig;
use dynamo_mocker::replay::{MostCachedPrefix, RoundRobin, Router, parse_trace, replay};

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../shared/data/mooncake_synthetic_trace.jsonl"
);

fn main() {
    let Ok(text) = std::fs::read_to_string(TRACE) else {
        println!("skipping: trace not found at {TRACE}");
        return;
    };
    let records = parse_trace(&text).expect("trace parses");
    let config = EngineConfig::default();
    let routers: [(&str, Box<dyn Router>); 2] = [
        ("round-robin", Box::new(RoundRobin::default())),
        ("most-cached-prefix", Box::new(MostCachedPrefix)),
    ];
    for (name, mut router) in routers {
        let start = Instant::now();
        let report = replay(&records, &config, 8, router.as_mut()).expect("replay");
        println!(
            "== {name}: {} requests over 8 workers, wall {:.2} s",
            records.len(),
            start.elapsed().as_secs_f64()
        );
        print!("{report}");
    }
}
