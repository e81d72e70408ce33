//! A v1beta1 graph reconciles exactly as its v1alpha1 twin. The controller watches
//! v1alpha1 (the stored version); a graph written as v1beta1 reaches it converted by the
//! API server through the operator's webhook, i.e. by `dynamo_crds::conversion`.

mod common;

use common::{cluster, observed, repo_root, run, sample};
use dynamo_crds::DynamoGraphDeployment;
use serde_json::Value;

#[test]
fn every_v1beta1_sample_reconciles_as_its_v1alpha1_twin() {
    let dir = repo_root().join("config/samples/v1beta1");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        let beta: Value = serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let stored = dynamo_crds::conversion::convert(&beta, "nvidia.com/v1alpha1").unwrap();
        let mut dgd: DynamoGraphDeployment = serde_json::from_value(stored).unwrap();
        let twin = sample(&name);
        dgd.metadata.namespace = twin.metadata.namespace.clone();
        dgd.metadata.uid = twin.metadata.uid.clone();
        dgd.metadata.generation = twin.metadata.generation;

        let first = run(&dgd, &observed(vec![], cluster()));
        let expected_first = run(&twin, &observed(vec![], cluster()));
        assert_eq!(
            first.to_yaml(),
            expected_first.to_yaml(),
            "{name}: first pass"
        );
        let second = run(&dgd, &observed(first.pods.clone(), cluster()));
        let expected_second = run(&twin, &observed(expected_first.pods, cluster()));
        assert_eq!(
            second.to_yaml(),
            expected_second.to_yaml(),
            "{name}: second pass"
        );
        assert!(
            !first.pods.is_empty() && !first.scaling_adapters.is_empty(),
            "{name}: the comparison covers pods and scaling adapters"
        );
        checked += 1;
    }
    assert!(checked >= 2, "{checked} v1beta1 samples");
}
