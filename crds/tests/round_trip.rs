//! A manifest written for Dynamo's v1alpha1 deserializes into our types and serializes back
//! to the same JSON, including fields we do not model.

use dynamo_crds::{BackendFramework, ComponentType, DynamoGraphDeployment};
use serde_json::Value;

const DYNAMO_STYLE: &str = r#"
apiVersion: nvidia.com/v1alpha1
kind: DynamoGraphDeployment
metadata:
  name: vllm-disagg
  namespace: inference
spec:
  backendFramework: vllm
  restart:
    id: "1"
  services:
    Frontend:
      dynamoNamespace: vllm-disagg
      componentType: frontend
      replicas: 1
      ingress:
        enabled: true
        host: example.local
      extraPodSpec:
        mainContainer:
          image: nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0
    VllmDecodeWorker:
      dynamoNamespace: vllm-disagg
      globalDynamoNamespace: false
      envFromSecret: hf-token-secret
      componentType: worker
      subComponentType: decode
      replicas: 1
      multinode:
        nodeCount: 2
      resources:
        limits:
          gpu: "8"
      extraPodSpec:
        terminationGracePeriodSeconds: 60
        priority: 10
        mainContainer:
          image: nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0
          workingDir: /workspace/examples/backends/vllm
          command: ["python3", "-m", "dynamo.vllm"]
          args: ["--model", "Qwen/Qwen3-0.6B", "--is-decode-worker"]
    VllmPrefillWorker:
      envFromSecret: hf-token-secret
      componentType: worker
      subComponentType: prefill
      replicas: 1
      autoscaling:
        enabled: false
      resources:
        limits:
          gpu: "1"
      extraPodSpec:
        mainContainer:
          image: nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0
          workingDir: /workspace/examples/backends/vllm
          command: ["python3", "-m", "dynamo.vllm"]
          args: ["--model", "Qwen/Qwen3-0.6B", "--is-prefill-worker"]
"#;

#[test]
fn dynamo_manifest_round_trips_unchanged() {
    let original: Value = serde_saphyr::from_str(DYNAMO_STYLE).unwrap();
    let typed: DynamoGraphDeployment = serde_json::from_value(original.clone()).unwrap();
    assert_eq!(serde_json::to_value(&typed).unwrap(), original);
}

#[test]
fn dynamo_manifest_reads_into_the_typed_fields() {
    let typed: DynamoGraphDeployment = serde_saphyr::from_str(DYNAMO_STYLE).unwrap();
    let spec = &typed.spec;
    assert_eq!(spec.backend_framework, Some(BackendFramework::Vllm));
    assert!(spec.other.contains_key("restart"));
    let decode = &spec.services["VllmDecodeWorker"];
    assert_eq!(decode.component_type, Some(ComponentType::Worker));
    assert_eq!(decode.sub_component_type.as_deref(), Some("decode"));
    assert_eq!(decode.node_count(), 2);
    assert_eq!(decode.resources.as_ref().unwrap().gpus_per_pod(), 8);
    assert_eq!(decode.dynamo_namespace.as_deref(), Some("vllm-disagg"));
    assert_eq!(decode.other["globalDynamoNamespace"], Value::Bool(false));
    let pod = decode.extra_pod_spec.as_ref().unwrap();
    assert_eq!(pod.termination_grace_period_seconds, Some(60));
    assert_eq!(pod.other["priority"], serde_json::json!(10));
    let main = pod.main_container.as_ref().unwrap();
    assert_eq!(
        main.image.as_deref(),
        Some("nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.6.0")
    );
    assert_eq!(
        main.working_dir.as_deref(),
        Some("/workspace/examples/backends/vllm")
    );
    assert_eq!(main.name, "", "a missing container name reads as empty");
}

#[test]
fn dynamo_manifest_passes_validation() {
    dynamo_crds::validate_manifest(DYNAMO_STYLE).unwrap();
}
