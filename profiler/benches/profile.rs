//! Time to profile the sample request (`config/samples/dgdr.yaml`): the goal is seconds
//! on one core.

use criterion::{Criterion, criterion_group, criterion_main};
use dynamo_crds::DynamoGraphDeploymentRequest;

fn sample() -> DynamoGraphDeploymentRequest {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/samples/dgdr.yaml");
    let yaml = std::fs::read_to_string(path).expect("the sample");
    serde_saphyr::from_str(&yaml).expect("a DGDR")
}

fn bench(c: &mut Criterion) {
    let request = sample();
    let mut group = c.benchmark_group("profile");
    group.sample_size(10);
    group.bench_function("config/samples/dgdr.yaml", |b| {
        b.iter(|| dynamo_profiler::profile(&request.spec, None).expect("profiled"))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
