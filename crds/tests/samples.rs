//! Every sample in config/samples validates; every manifest in tests/bad is refused with
//! the message its `# expect:` line names.

use std::path::{Path, PathBuf};

/// The YAML files under `dir`, its subdirectories included (`v1beta1/`, `dynamo/`).
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "yaml") {
            files.push(path);
        }
    }
    files.sort();
    files
}

#[test]
fn every_sample_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/samples");
    let files = yaml_files(&dir);
    assert!(
        files.len() >= 10,
        "expected the six samples, two v1beta1 ones and Dynamo's two, found {files:?}"
    );
    for path in files {
        let yaml = std::fs::read_to_string(&path).unwrap();
        let documents = yaml.split("\n---").filter(|d| d.contains("kind:")).count();
        match dynamo_crds::validate_manifest(&yaml) {
            Ok(validated) => assert_eq!(validated.objects.len(), documents, "{}", path.display()),
            Err(e) => panic!("{} is refused:\n{e}", path.display()),
        }
    }
}

#[test]
fn every_bad_manifest_is_refused_with_the_expected_message() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad");
    let files = yaml_files(&dir);
    assert!(
        files.len() >= 11,
        "expected at least 11 bad manifests, found {}",
        files.len()
    );
    for path in files {
        let yaml = std::fs::read_to_string(&path).unwrap();
        let expected = yaml
            .lines()
            .next()
            .and_then(|line| line.strip_prefix("# expect: "))
            .unwrap_or_else(|| {
                panic!(
                    "{}: first line must be `# expect: <substring>`",
                    path.display()
                )
            });
        match dynamo_crds::validate_manifest(&yaml) {
            Ok(_) => panic!(
                "{} was accepted; expected an error containing {expected:?}",
                path.display()
            ),
            Err(e) => assert!(
                e.to_string().contains(expected),
                "{}: error does not contain {expected:?}:\n{e}",
                path.display()
            ),
        }
    }
}

#[test]
fn every_problem_of_a_bad_manifest_names_its_field() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bad");
    for path in yaml_files(&dir) {
        let yaml = std::fs::read_to_string(&path).unwrap();
        let err = dynamo_crds::validate_manifest(&yaml).unwrap_err();
        for problem in err.problems() {
            assert!(!problem.path.is_empty(), "{}: {problem}", path.display());
            // Neither jsonschema's own type text nor the `null` of nullable fields.
            assert!(
                !problem.message.contains("is not of type") && !problem.message.contains("null"),
                "{}: {problem}",
                path.display()
            );
        }
    }
}

#[test]
fn all_problems_of_a_manifest_are_reported_with_paths() {
    let yaml = r#"
apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata:
  name: many-problems
spec:
  backendFramework: tgi
  services:
    worker:
      componentType: worker
      replicas: -1
      multinode:
        nodeCount: 2
"#;
    let err = dynamo_crds::validate_manifest(yaml).unwrap_err();
    let paths: Vec<&str> = err.problems().iter().map(|p| p.path.as_str()).collect();
    assert!(paths.contains(&"spec.backendFramework"), "{err}");
    assert!(paths.contains(&"spec.services.worker.replicas"), "{err}");
    assert!(
        err.to_string()
            .contains("spec.services.worker: multinode requires GPUs"),
        "{err}"
    );
}

#[test]
fn defaults_are_applied_before_deserializing() {
    let yaml = r#"
apiVersion: nvidia.com/v1beta1
kind: DynamoGraphDeploymentRequest
metadata:
  name: defaults
spec:
  model: Qwen/Qwen3-0.6B
  workload:
    concurrency: 8
  sla:
    e2eLatency: 3000
"#;
    let validated = dynamo_crds::validate_manifest(yaml).unwrap();
    let request = validated.requests().next().unwrap();
    assert_eq!(request.spec.backend, dynamo_crds::RequestBackend::Auto);
    assert!(request.spec.auto_apply);
    let workload = request.spec.workload.as_ref().unwrap();
    assert_eq!((workload.isl, workload.osl), (4000, 1000));
}

#[test]
fn non_yaml_and_empty_input_are_refused() {
    assert!(matches!(
        dynamo_crds::validate_manifest("a: [unclosed"),
        Err(dynamo_crds::ValidationError::Yaml(_))
    ));
    assert_eq!(
        dynamo_crds::validate_manifest(""),
        Err(dynamo_crds::ValidationError::Empty)
    );
}
