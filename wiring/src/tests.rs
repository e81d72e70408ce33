use super::*;

fn graph(yaml: &str) -> DynamoGraphDeploymentSpec {
    serde_saphyr::from_str(yaml).unwrap()
}

fn wire(yaml: &str) -> Result<Option<GraphWiring>, WiringError> {
    let defaults = Defaults {
        mocker_model_path: Some("/models/model".into()),
    };
    GraphWiring::new(&graph(yaml), &defaults)
}

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

/// Dynamo's published disaggregated vLLM graph (examples/backends/vllm/deploy/disagg.yaml):
/// no backendFramework, Dynamo's worker wrapper.
const DYNAMO_DISAGG: &str = "
services:
  Frontend: {componentType: frontend, extraPodSpec: {mainContainer: {image: 'nvcr.io/nvidia/ai-dynamo/vllm-runtime:1.0.0'}}}
  VllmDecodeWorker:
    componentType: worker
    subComponentType: decode
    extraPodSpec:
      mainContainer:
        command: [python3, -m, dynamo.vllm]
        args: [--model, Qwen/Qwen3-0.6B, --is-decode-worker]
  VllmPrefillWorker:
    componentType: worker
    subComponentType: prefill
    extraPodSpec:
      mainContainer:
        command: [python3, -m, dynamo.vllm]
        args: [--model, Qwen/Qwen3-0.6B, --is-prefill-worker, --connector, nixl]
";

const KV_EVENTS: &str = r#"{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:5557","publisher":"zmq","replay_endpoint":"tcp://127.0.0.1:5558"}"#;

#[test]
fn dynamos_vllm_workers_become_vllms_own_server_with_kv_events_and_nixl() {
    let wiring = wire(DYNAMO_DISAGG).unwrap().unwrap();
    assert_eq!(wiring.backend, BackendFramework::Vllm);
    assert_eq!(wiring.served_model.as_deref(), Some("Qwen/Qwen3-0.6B"));
    assert_eq!(wiring.block_size, 16);
    assert!(wiring.is_disaggregated());

    let prefill = &wiring.engines["VllmPrefillWorker"];
    assert_eq!(prefill.role, Role::Prefill);
    let mut expected = words(
        "vllm serve Qwen/Qwen3-0.6B --served-model-name Qwen/Qwen3-0.6B \
         --host 127.0.0.1 --port 8001 --kv-events-config",
    );
    expected.push(KV_EVENTS.into());
    expected.push("--kv-transfer-config".into());
    expected.push(r#"{"kv_connector":"NixlConnector","kv_role":"kv_both"}"#.into());
    assert_eq!(prefill.engine_argv(&Addresses::POD), expected);

    let sidecar = prefill
        .sidecar_args(&Addresses::POD, Some("/model-cache/huggingface"), &[])
        .join(" ");
    assert_eq!(
        sidecar,
        "--listen 0.0.0.0:8000 --host 0.0.0.0 --grpc-port 9100 --metrics-port 9090 \
         --engine-url http://127.0.0.1:8001 --engine-kv-events tcp://127.0.0.1:5557 \
         --engine-kv-events-listen --engine-kv-replay tcp://127.0.0.1:5558 --block-size 16 \
         --model-name Qwen/Qwen3-0.6B --model-source Qwen/Qwen3-0.6B \
         --hf-home /model-cache/huggingface"
    );
    assert_eq!(
        wiring.engines["VllmDecodeWorker"].role,
        Role::Decode,
        "the wrapper's --is-decode-worker agrees with subComponentType"
    );
}

#[test]
fn the_same_graph_on_the_mock_engine_keeps_its_model_name_and_drops_vllms_flags() {
    let yaml = format!("backendFramework: mocker\n{DYNAMO_DISAGG}");
    let wiring = wire(&yaml).unwrap().unwrap();
    assert_eq!(wiring.block_size, 64);
    let local = Addresses {
        engine: 41001,
        kv_events: 41002,
        kv_replay: 41003,
        sidecar_host: IpAddr::V4(Ipv4Addr::LOCALHOST),
        sidecar_http: 41004,
        sidecar_grpc: 41005,
        sidecar_metrics: 41006,
        kv_side_channel: Some(41007),
    };
    assert_eq!(
        wiring.engines["VllmPrefillWorker"].engine_argv(&local),
        words(
            "dynamo-mocker --model-path /models/model --model-name Qwen/Qwen3-0.6B \
             --host 127.0.0.1 --port 41001 --kv-events-endpoint tcp://127.0.0.1:41002 \
             --kv-blocks-url http://127.0.0.1:41005 --kv-offload none"
        )
    );
    let sidecar = wiring.engines["VllmPrefillWorker"].sidecar_args(&local, None, &[]);
    assert!(
        sidecar.join(" ").ends_with(
            "--engine-kv-replay none --block-size 64 --model-name Qwen/Qwen3-0.6B \
             --model-source /models/model"
        ),
        "{sidecar:?}"
    );
}

#[test]
fn sglang_and_trtllm_workers_keep_their_own_flags_and_lose_dynamos() {
    let sglang = wire(
        "services:
  w:
    subComponentType: prefill
    extraPodSpec:
      mainContainer:
        command: [python3, -m, dynamo.sglang]
        args: [--model-path, deepseek-ai/DeepSeek-R1, --served-model-name, ds, --page-size, '16',
               --tp, '8', --skip-tokenizer-init, --disaggregation-mode, prefill, --dyn-reasoning-parser, deepseek_r1]",
    )
    .unwrap()
    .unwrap();
    let engine = &sglang.engines["w"];
    let argv = engine.engine_argv(&Addresses::POD);
    assert_eq!(
        argv[..15],
        words(
            "python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-R1 \
             --served-model-name ds --page-size 16 --tp 8 --disaggregation-mode prefill \
             --reasoning-parser deepseek_r1"
        )[..]
    );
    assert_eq!(
        argv[15..19],
        words("--host 127.0.0.1 --port 8001")[..],
        "{argv:?}"
    );
    assert_eq!(argv[19], "--kv-events-config");
    assert!(!argv[20].contains("replay"), "SGLang answers no replays");
    assert_eq!(
        argv[21..],
        words("--disaggregation-bootstrap-port 8998")[..],
        "its bootstrap server on SGLang's default port"
    );
    assert_eq!(engine.block_size, 16);
    assert!(engine.engine_env(&Addresses::POD).is_empty());

    let trtllm = wire(
        "services:
  w:
    extraPodSpec:
      mainContainer:
        command: [python3, -m, dynamo.trtllm]
        args: [--model-path, nvidia/Llama-3.1-8B-Instruct-FP8, --tensor-parallel-size, '2',
               --extra-engine-args, /config/agg.yaml, --namespace, dynamo]",
    )
    .unwrap()
    .unwrap();
    let engine = &trtllm.engines["w"];
    assert_eq!(
        engine.engine_argv(&Addresses::POD),
        words(
            "trtllm-serve nvidia/Llama-3.1-8B-Instruct-FP8 --tp_size 2 \
             --extra_llm_api_options /config/agg.yaml --host 127.0.0.1 --port 8001"
        )
    );
    assert_eq!(engine.block_size, 32);
    assert!(
        engine
            .sidecar_args(&Addresses::POD, None, &[])
            .join(" ")
            .contains("--engine-kv-events none")
    );
}

#[test]
fn the_engines_own_launchers_and_unknown_commands() {
    let own = wire(
        "backendFramework: vllm
services:
  w: {extraPodSpec: {mainContainer: {command: [vllm, serve, m, --port, '9', --block-size, '32']}}}",
    )
    .unwrap()
    .unwrap();
    let argv = own.engines["w"].engine_argv(&Addresses::POD);
    assert_eq!(
        argv[..11],
        words("vllm serve m --served-model-name m --block-size 32 --host 127.0.0.1 --port 8001")[..]
    );
    assert_eq!(own.block_size, 32);

    let custom = wire(
        "backendFramework: vllm
services:
  w: {extraPodSpec: {mainContainer: {command: [bash, -c, 'vllm serve m --port 8001']}}}",
    )
    .unwrap()
    .unwrap();
    assert_eq!(
        custom.engines["w"].engine_argv(&Addresses::POD),
        ["bash", "-c", "vllm serve m --port 8001"]
    );
}

#[test]
fn graphs_that_cannot_be_wired_say_why() {
    assert_eq!(
        wire("services: {w: {extraPodSpec: {mainContainer: {command: [my-engine]}}}}"),
        Err(WiringError::NoBackend)
    );
    assert_eq!(
        wire("backendFramework: vllm\nservices: {w: {componentType: worker}}"),
        Err(WiringError::NoModel("w".into()))
    );
    let two_models = "backendFramework: vllm
services:
  a: {extraPodSpec: {mainContainer: {command: [vllm, serve, m1]}}}
  b: {extraPodSpec: {mainContainer: {command: [vllm, serve, m2]}}}";
    assert_eq!(
        wire(two_models),
        Err(WiringError::ModelMismatch("m1".into(), "m2".into()))
    );
    let two_sizes = "backendFramework: vllm
services:
  a: {extraPodSpec: {mainContainer: {command: [vllm, serve, m]}}}
  b: {extraPodSpec: {mainContainer: {command: [vllm, serve, m, --block-size, '32']}}}";
    assert_eq!(wire(two_sizes), Err(WiringError::BlockSizeMismatch(16, 32)));
    assert_eq!(
        wire("services: {Frontend: {componentType: frontend}}"),
        Ok(None)
    );
}

#[test]
fn the_picker_gets_its_model_block_size_and_pods() {
    let wiring = wire(DYNAMO_DISAGG).unwrap().unwrap();
    let picker = Picker {
        host: "0.0.0.0".into(),
        http_port: 8000,
        ext_proc_port: 9002,
        metrics_port: Some(9090),
        model_path: None,
        router_mode: "kv".into(),
        pods: PickerPods::Pool {
            name: "g".into(),
            namespace: "ns".into(),
            selector: "pool=g".into(),
            role_selectors: vec![
                (Role::Prefill, "pool=g,role=prefill".into()),
                (Role::Decode, "pool=g,role=decode".into()),
            ],
        },
    };
    assert_eq!(
        picker.args(Some(&wiring)).join(" "),
        "--host 0.0.0.0 --http-port 8000 --ext-proc-port 9002 --metrics-port 9090 \
         --model-name Qwen/Qwen3-0.6B --block-size 16 --router-mode kv --pool-name g \
         --pool-namespace ns --selector pool=g --prefill-selector pool=g,role=prefill \
         --decode-selector pool=g,role=decode"
    );
    // A mock engine takes the prompt's token ids from the picker.
    let mocker = wire(&format!("backendFramework: mocker\n{DYNAMO_DISAGG}"))
        .unwrap()
        .unwrap();
    let args = picker.args(Some(&mocker));
    assert!(args.contains(&"--forward-token-ids".to_owned()), "{args:?}");
}

#[test]
fn the_router_mode_comes_from_dynamos_variable_or_its_frontend_flag() {
    let env = graph(
        "services: {F: {componentType: frontend, envs: [{name: DYN_ROUTER_MODE, value: round-robin}]}}",
    );
    assert_eq!(router_mode(&env).as_deref(), Some("round-robin"));
    let flag = graph(
        "services: {F: {extraPodSpec: {mainContainer: {command: [python3, -m, dynamo.frontend, --router-mode, kv]}}}}",
    );
    assert_eq!(router_mode(&flag).as_deref(), Some("kv"));
    assert_eq!(router_mode(&graph("services: {}")), None);
}

#[test]
fn the_mock_engine_offloads_to_its_sidecar_only_when_the_service_has_tiers() {
    let yaml = "
backendFramework: mocker
services:
  worker:
    componentType: worker
    envs: [{name: DYN_KVBM_CPU_CACHE_GB, value: '1'}]
    extraPodSpec: {mainContainer: {command: [dynamo-mocker, --kv-blocks-url, 'http://elsewhere:1']}}
";
    let wiring = wire(yaml).unwrap().unwrap();
    let at = Addresses {
        sidecar_grpc: 41004,
        ..Addresses::POD
    };
    let argv = wiring.engines["worker"].engine_argv(&at);
    let urls: Vec<_> = argv
        .iter()
        .enumerate()
        .filter(|(_, w)| *w == "--kv-blocks-url")
        .map(|(i, _)| argv[i + 1].as_str())
        .collect();
    assert_eq!(
        urls,
        ["http://127.0.0.1:41004"],
        "the user's own is replaced"
    );
    let plain = wire(&yaml.replace("'1'", "'0'")).unwrap().unwrap();
    assert!(
        !plain.engines["worker"]
            .engine_argv(&at)
            .contains(&"--kv-blocks-url".to_string())
    );
}

#[test]
fn tiers_on_an_engine_without_a_block_api_connector_are_named_as_holding_nothing() {
    let graph = |backend: &str, kvbm: &str, flags: &str| {
        wire(&format!(
            "
backendFramework: {backend}
services:
  worker:
    componentType: worker
    envs: [{{name: DYN_KVBM_CPU_CACHE_GB, value: '{kvbm}'}}]
    extraPodSpec: {{mainContainer: {{command: [python3, -m, dynamo.{backend}, --model, m{flags}]}}}}
"
        ))
        .unwrap()
        .unwrap()
    };
    let unfed = |backend, kvbm, flags| {
        graph(backend, kvbm, flags).engines["worker"].unfed_kv_tiers("worker")
    };
    for backend in ["sglang", "trtllm"] {
        assert_eq!(
            unfed(backend, "1", "").as_deref(),
            Some(
                format!(
                    "worker: KV block tiers are set (DYN_KVBM_*), but its {backend} engine has \
                     no connector to the sidecar's block API, so they hold nothing"
                )
                .as_str()
            )
        );
        assert_eq!(unfed(backend, "0", ""), None);
    }
    // vLLM's goes through our connector, which keeps one rank's blocks.
    assert_eq!(unfed("vllm", "1", ""), None);
    assert_eq!(unfed("vllm", "1", ", --tensor-parallel-size, '1'"), None);
    assert_eq!(
        unfed("vllm", "1", ", -tp, '2', --pipeline-parallel-size, '2'").as_deref(),
        Some(
            "worker: KV block tiers are set (DYN_KVBM_*), but its vllm engine runs 4 ranks \
             (tensor or pipeline parallel), whose shards of a block our KV connector does not \
             keep apart yet, so they hold nothing"
        )
    );
    let mocker = wire(
        "
backendFramework: mocker
services:
  worker: {componentType: worker, envs: [{name: DYN_KVBM_CPU_CACHE_GB, value: '1'}]}
",
    )
    .unwrap()
    .unwrap();
    assert_eq!(mocker.engines["worker"].unfed_kv_tiers("worker"), None);
}

/// A disaggregated graph on the mock engine, with an aggregated worker beside it and
/// `prefill_env` as its prefill service's env.
fn mocker_disagg(prefill_env: &str) -> GraphWiring {
    wire(&format!(
        "
backendFramework: mocker
services:
  prefill: {{componentType: prefill, envs: {prefill_env}}}
  decode:
    componentType: decode
    extraPodSpec: {{mainContainer: {{command: [dynamo-mocker, --kv-offload, all]}}}}
  worker: {{componentType: worker}}
"
    ))
    .unwrap()
    .unwrap()
}

#[test]
fn disaggregated_mock_engines_lease_through_their_sidecar_and_offload_only_to_tiers() {
    let wiring = mocker_disagg("[]");
    let argv = |service: &str| {
        wiring.engines[service]
            .engine_argv(&Addresses::POD)
            .join(" ")
    };
    assert!(
        argv("prefill").ends_with("--kv-blocks-url http://127.0.0.1:9100 --kv-offload none"),
        "{}",
        argv("prefill")
    );
    // The user's own choice stays.
    let decode = argv("decode");
    assert!(
        decode.contains("--kv-offload all") && !decode.contains("--kv-offload none"),
        "{decode}"
    );
    assert!(
        decode.ends_with("--kv-blocks-url http://127.0.0.1:9100"),
        "{decode}"
    );
    let worker = argv("worker");
    assert!(
        !worker.contains("--kv-blocks-url") && !worker.contains("--kv-offload"),
        "{worker}"
    );
    // With tiers the engine offloads to them as an aggregated one does.
    let tiered = mocker_disagg("[{name: DYN_KVBM_CPU_CACHE_GB, value: '1'}]");
    let prefill = tiered.engines["prefill"]
        .engine_argv(&Addresses::POD)
        .join(" ");
    assert!(
        prefill.ends_with("--kv-blocks-url http://127.0.0.1:9100"),
        "{prefill}"
    );
}

#[test]
fn only_decode_sidecars_get_the_prefill_peers() {
    let wiring = mocker_disagg("[]");
    let peers = [
        PrefillPeers::Dns {
            name: "g-prefill-peers.ns.svc.cluster.local".into(),
            port: 8000,
        },
        PrefillPeers::File("/run/endpoints.json".into()),
    ];
    let args = |service: &str| wiring.engines[service].sidecar_args(&Addresses::POD, None, &peers);
    let decode = args("decode");
    assert_eq!(
        decode[decode.len() - 2..],
        [
            "--prefill-peers",
            "dns:g-prefill-peers.ns.svc.cluster.local:8000,file:/run/endpoints.json"
        ]
    );
    for service in ["prefill", "worker"] {
        assert!(
            !args(service).contains(&"--prefill-peers".to_string()),
            "{service}"
        );
    }
    // No prefill service, no flag: the sidecar then refuses every prefiller header.
    assert!(
        !wiring.engines["decode"]
            .sidecar_args(&Addresses::POD, None, &[])
            .contains(&"--prefill-peers".to_string())
    );
}

#[test]
fn disaggregated_vllm_gets_nixls_side_channel_on_the_pod_ip_unless_the_user_set_it() {
    let wiring = wire(DYNAMO_DISAGG).unwrap().unwrap();
    let expected = [
        ("VLLM_NIXL_SIDE_CHANNEL_HOST", EnvValue::PodIp),
        (
            "VLLM_NIXL_SIDE_CHANNEL_PORT",
            EnvValue::Literal("5600".into()),
        ),
    ];
    for service in ["VllmPrefillWorker", "VllmDecodeWorker"] {
        assert_eq!(
            wiring.engines[service].engine_env(&Addresses::POD),
            expected,
            "{service}"
        );
    }
    let local = Addresses {
        kv_side_channel: Some(41007),
        ..Addresses::POD
    };
    assert_eq!(
        wiring.engines["VllmDecodeWorker"].engine_env(&local)[1],
        (
            "VLLM_NIXL_SIDE_CHANNEL_PORT",
            EnvValue::Literal("41007".into())
        )
    );
    let agg = wire(
        "backendFramework: vllm\nservices: {w: {extraPodSpec: {mainContainer: {command: [vllm, serve, m]}}}}",
    )
    .unwrap()
    .unwrap();
    assert!(agg.engines["w"].engine_env(&Addresses::POD).is_empty());
}

#[test]
fn dynamos_wrapper_flags_decide_an_engines_role() {
    let spec = |yaml: &str| -> ComponentSpec { serde_saphyr::from_str(yaml).unwrap() };
    let prefill = spec(
        "{extraPodSpec: {mainContainer: {command: [python3, -m, dynamo.vllm, --model, m, --is-prefill-worker]}}}",
    );
    assert_eq!(engine_role(&prefill), Some(Role::Prefill));
    // Only Dynamo's wrappers take the flag.
    let own = spec(
        "{componentType: decode, extraPodSpec: {mainContainer: {command: [vllm, serve, m, --is-prefill-worker]}}}",
    );
    assert_eq!(engine_role(&own), Some(Role::Decode));
    assert_eq!(engine_role(&spec("componentType: epp")), None);
}

#[test]
fn the_planners_profile_is_measured_on_the_aggregated_else_decode_else_prefill_mock_engine() {
    let measured = |yaml: &str| {
        let wiring = wire(yaml).unwrap().unwrap();
        let (service, engine) = wiring.profile_engine()?;
        let argv = engine.profile_argv(&Addresses::POD, "/p.json").unwrap();
        assert_eq!(argv[..argv.len() - 2], engine.engine_argv(&Addresses::POD));
        assert_eq!(
            argv[argv.len() - 2..],
            words("--planner-profile-out /p.json")
        );
        Some(service.to_owned())
    };
    let disagg = "
backendFramework: mocker
services:
  a: {componentType: prefill}
  b: {componentType: decode}
";
    assert_eq!(measured(disagg).as_deref(), Some("b"));
    let with_worker = format!("{disagg}  c: {{componentType: worker}}\n");
    assert_eq!(measured(&with_worker).as_deref(), Some("c"));
    let prefill_only = "
backendFramework: mocker
services: {a: {componentType: prefill}}
";
    assert_eq!(measured(prefill_only).as_deref(), Some("a"));
    // A command of the user's that runs our mock engine, by any path.
    let custom = "
backendFramework: mocker
services:
  w: {componentType: worker, extraPodSpec: {mainContainer: {command: [/usr/local/bin/dynamo-mocker, --model-path, /m]}}}
";
    assert_eq!(measured(custom).as_deref(), Some("w"));
    // Real engines measure nothing.
    assert_eq!(measured(DYNAMO_DISAGG), None);
    let wiring = wire(DYNAMO_DISAGG).unwrap().unwrap();
    let decode = &wiring.engines["VllmDecodeWorker"];
    assert_eq!(decode.profile_argv(&Addresses::POD, "/p.json"), None);
}

#[test]
fn a_vllm_worker_with_tiers_loads_our_connector_beside_nixl_when_disaggregated() {
    let graph = |component: &str| {
        wire(&format!(
            "
backendFramework: vllm
services:
  worker:
    componentType: {component}
    envs: [{{name: DYN_KVBM_CPU_CACHE_GB, value: '2'}}]
    extraPodSpec: {{mainContainer: {{command: [vllm, serve, m]}}}}
"
        ))
        .unwrap()
        .unwrap()
    };
    let agg = &graph("worker").engines["worker"];
    let argv = agg.engine_argv(&Addresses::POD);
    let config = argv::value(&argv, "--kv-transfer-config").unwrap();
    assert_eq!(
        config,
        crate::connector::kv_transfer_config(Role::Aggregated, 9100, Some("m"))
    );
    assert_eq!(
        agg.engine_env(&Addresses::POD),
        [(crate::connector::PYTHONPATH, EnvValue::ConnectorPath)]
    );
    let prefill = &graph("prefill").engines["worker"];
    let config = argv::value(
        &prefill.engine_argv(&Addresses::POD),
        "--kv-transfer-config",
    );
    assert_eq!(
        config.unwrap(),
        crate::connector::kv_transfer_config(Role::Prefill, 9100, Some("m"))
    );
    let env = prefill.engine_env(&Addresses::POD);
    assert!(env.contains(&(crate::connector::PYTHONPATH, EnvValue::ConnectorPath)));
    assert!(
        env.iter()
            .any(|(name, _)| *name == "VLLM_NIXL_SIDE_CHANNEL_PORT")
    );
    // A user's own connector configuration is theirs.
    let own = wire(
        "
backendFramework: vllm
services:
  worker:
    componentType: worker
    envs: [{name: DYN_KVBM_CPU_CACHE_GB, value: '2'}]
    extraPodSpec: {mainContainer: {command: [vllm, serve, m, --kv-transfer-config, '{}']}}
",
    )
    .unwrap()
    .unwrap();
    let argv = own.engines["worker"].engine_argv(&Addresses::POD);
    assert_eq!(
        argv::value(&argv, "--kv-transfer-config").as_deref(),
        Some("{}")
    );
}
