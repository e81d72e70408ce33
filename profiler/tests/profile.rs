//! The profiler as the DGDR controller and `dynamo profile` call it: requests in, a
//! graph that applies and the choice the SLA asks for out, bad requests refused.

use clap::Parser;
use dynamo_crds::dgdr::{DynamoGraphDeploymentRequestSpec, RequestBackend};
use dynamo_crds::{BackendFramework, ComponentType};
use dynamo_mocker::EngineConfig;
use dynamo_perfmodel::{Estimator, GpuSpec, ModelArch, Uncertainty};
use dynamo_profiler::{Layout, ProfileError, Profiled, profile, profile_named};

/// A request from the YAML of its spec.
fn spec(yaml: &str) -> DynamoGraphDeploymentRequestSpec {
    serde_saphyr::from_str(yaml).expect("a DGDR spec")
}

/// Qwen3-8B on up to four H100s: small enough to sweep quickly in a debug build.
fn qwen8b(load: &str, sla: &str) -> DynamoGraphDeploymentRequestSpec {
    spec(&format!(
        "{{model: Qwen/Qwen3-8B, hardware: {{gpuSku: h100_sxm, totalGpus: 4}}, \
         workload: {{isl: 2000, osl: 200, {load}}}, sla: {{{sla}}}}}"
    ))
}

fn refusal(yaml: &str) -> String {
    match profile(&spec(yaml), None) {
        Ok(p) => panic!("{yaml} was profiled: {}", p.summary()),
        Err(e) => e.to_string(),
    }
}

/// The engine services' (name, main container command + args).
fn engine_commands(p: &Profiled) -> Vec<(String, Vec<String>)> {
    p.dgd
        .spec
        .services
        .iter()
        .filter(|(_, s)| {
            matches!(
                s.component_type,
                Some(ComponentType::Worker | ComponentType::Prefill | ComponentType::Decode)
            )
        })
        .map(|(name, s)| (name.clone(), s.main_command()))
        .collect()
}

/// What the mock engine's own parser makes of a generated worker's command.
fn mock_engine_args(name: &str, argv: &[String]) -> dynamo_mocker::Args {
    dynamo_mocker::Args::try_parse_from(
        argv.iter()
            .cloned()
            .chain(["--model-path".into(), "/no/such/dir".into()]),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Whether two layouts have the same engines, whatever their step budgets: each request
/// tunes a layout's budget to its own SLA.
fn same_engines(a: &Layout, b: &Layout) -> bool {
    let engines = |l: &Layout| match *l {
        Layout::Aggregated { workers: w } => vec![(w.tp, w.replicas)],
        Layout::Disaggregated { prefill, decode } => {
            vec![(prefill.tp, prefill.replicas), (decode.tp, decode.replicas)]
        }
    };
    engines(a) == engines(b)
}

#[test]
fn the_generated_graph_passes_the_crd_schema_and_its_mock_engines_are_the_simulated_ones() {
    let mut request = qwen8b("requestRate: 4", "ttft: 100, itl: 8");
    request.features =
        Some(serde_saphyr::from_str("{mocker: {enabled: true}, planner: {}}").unwrap());
    let p = profile_named("qwen-mock", &request, None).unwrap();
    assert_eq!(p.request.backend, BackendFramework::Mocker);
    let yaml = serde_saphyr::to_string(&p.dgd).unwrap();
    let validated = dynamo_crds::validate_manifest(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    assert_eq!(validated.graph_deployments().count(), 1);
    let services = &p.dgd.spec.services;
    assert_eq!(services["epp"].component_type, Some(ComponentType::Epp));
    // The mock engine measures its own planner profile from the workers' flags.
    let planner = services["planner"].main_command();
    assert!(!planner.contains(&"--profile".to_string()), "{planner:?}");
    let commands = engine_commands(&p);
    assert!(!commands.is_empty());
    let model = ModelArch::by_name("Qwen/Qwen3-8B").unwrap();
    for (name, argv) in commands {
        assert_eq!(argv[0], "dynamo-mocker", "{name}: {argv:?}");
        // The mock engine's own parser reads the flags into the engine the sweep ran.
        let parsed = mock_engine_args(&name, &argv);
        let config = parsed.engine_config().unwrap();
        let tp = parsed.timing.tensor_parallel_size;
        let e = Estimator::new(GpuSpec::by_name("H100_SXM").unwrap(), model.clone(), tp).unwrap();
        let (simulated, _) = EngineConfig::default().on_hardware(e, None).unwrap();
        assert_eq!(config.timing, simulated.timing, "{name}");
        assert_eq!(config.num_gpu_blocks, simulated.num_gpu_blocks, "{name}");
        assert_eq!(config.max_num_seqs, simulated.max_num_seqs, "{name}");
        assert_eq!(config.block_size, simulated.block_size, "{name}");
        // Mock engines take no GPUs.
        assert_eq!(services[&name].resources, None);
    }
}

/// The brief's disaggregation request (docs/performance-disagg.md): Llama-3.3-70B in FP8
/// on up to 8 H100s, ISL 3,000 / OSL 150, on mock engines (no headroom).
fn brief_70b(rate: u32, itl_ms: u32) -> DynamoGraphDeploymentRequestSpec {
    spec(&format!(
        "{{model: nvidia/Llama-3.3-70B-Instruct-FP8, hardware: {{gpuSku: h100_sxm, totalGpus: 8}}, \
         workload: {{isl: 3000, osl: 150, requestRate: {rate}}}, sla: {{ttft: 500, itl: {itl_ms}}}, \
         features: {{mocker: {{enabled: true}}}}}}"
    ))
}

#[test]
fn a_smaller_step_budget_is_kept_where_the_default_misses_and_the_engines_run_it() {
    // At 9 req/s three TP2 engines prefilling whole 3,000-token prompts in a step stall
    // their decodes past 50 ms; in 512-token chunks they meet it, on 6 GPUs where
    // disaggregation needs 8.
    let p = profile(&brief_70b(9, 50), None).unwrap();
    let Layout::Aggregated { workers } = p.selected.layout else {
        panic!("{}", p.summary());
    };
    assert_eq!((workers.tp, workers.replicas), (2, 3), "{}", p.summary());
    assert_eq!(workers.max_num_batched_tokens, 512, "{}", p.summary());
    assert!(p.summary().contains("agg 3 x TP2 with 512-token chunks"));
    // The worker runs that budget, with the batch the sweep simulated beside it.
    let commands = engine_commands(&p);
    let [(name, argv)] = &commands[..] else {
        panic!("{commands:?}");
    };
    let flag = |f: &str| argv.windows(2).find(|w| w[0] == f).map(|w| w[1].clone());
    assert_eq!(flag("--max-num-batched-tokens").as_deref(), Some("512"));
    assert_eq!(flag("--max-num-seqs").as_deref(), Some("256"));
    let parsed = mock_engine_args(name, argv);
    let config = parsed.engine_config().unwrap();
    let model = ModelArch::by_name("nvidia/Llama-3.3-70B-Instruct-FP8").unwrap();
    let e = Estimator::new(GpuSpec::by_name("H100_SXM").unwrap(), model, 2).unwrap();
    let budgeted = EngineConfig {
        max_num_batched_tokens: 512,
        ..EngineConfig::default()
    };
    let (simulated, _) = budgeted.on_hardware(e, None).unwrap();
    assert_eq!(config.max_num_batched_tokens, 512);
    assert_eq!(config.num_gpu_blocks, simulated.num_gpu_blocks);
    assert_eq!(config.timing, simulated.timing);

    // Where the default meets the SLA it stays, and the command names no budget.
    let loose = profile(&brief_70b(9, 200), None).unwrap();
    let budgets = budgets(&loose.selected.layout);
    assert!(budgets.iter().all(|&b| b == 8192), "{}", loose.summary());
    for (_, argv) in engine_commands(&loose) {
        assert!(
            !argv.contains(&"--max-num-batched-tokens".to_string()),
            "{argv:?}"
        );
    }
}

/// The step budgets of a layout's engines.
fn budgets(layout: &Layout) -> Vec<u32> {
    match *layout {
        Layout::Aggregated { workers } => vec![workers.max_num_batched_tokens],
        Layout::Disaggregated { prefill, decode } => {
            vec![
                prefill.max_num_batched_tokens,
                decode.max_num_batched_tokens,
            ]
        }
    }
}

#[test]
fn real_engines_get_their_gpus_tensor_parallel_flags_and_the_planner_its_profile() {
    let mut request = qwen8b("requestRate: 4", "ttft: 100, itl: 8");
    request.features = Some(serde_saphyr::from_str("{planner: {}}").unwrap());
    let p = profile_named("qwen", &request, None).unwrap();
    assert_eq!(p.request.backend, BackendFramework::Vllm, "auto is vLLM");
    let Layout::Aggregated { workers } = p.selected.layout else {
        panic!("{}", p.summary());
    };
    let worker = &p.dgd.spec.services["worker"];
    assert_eq!(worker.replicas, Some(workers.replicas as i32));
    let gpus = worker.resources.as_ref().and_then(|r| r.limits.as_ref());
    assert_eq!(
        gpus.and_then(|l| l.gpu.clone()),
        Some(workers.tp.to_string())
    );
    let tp = workers.tp.to_string();
    let expected = [
        "vllm",
        "serve",
        "Qwen/Qwen3-8B",
        "--tensor-parallel-size",
        &tp,
    ];
    assert_eq!(worker.main_command(), expected);
    // The planner reads the profile from the ConfigMap `dynamo profile` tells how to make,
    // with the SLA's targets and the graph's budget and engine sizes.
    let planner = &p.dgd.spec.services["planner"];
    let argv = planner.main_command().join(" ");
    assert_eq!(
        argv,
        format!(
            "dynamo planner --ttft-ms 100 --itl-ms 8 --max-gpu-budget 4 --prefill-gpus {tp} \
             --decode-gpus {tp} --profile /etc/dynamo/planner-profile/profile.json"
        )
    );
    let pod = serde_json::to_value(planner.extra_pod_spec.as_ref().unwrap()).unwrap();
    assert_eq!(
        pod["volumes"][0]["configMap"]["name"],
        "qwen-planner-profile"
    );
    assert_eq!(
        pod["mainContainer"]["volumeMounts"][0]["mountPath"],
        "/etc/dynamo/planner-profile"
    );
    // The profile is of the selected engine: per GPU of its TP.
    assert_eq!(p.planner_profile.gpus_per_engine(), workers.tp);
    let expected_ttft = p.planner_profile.expected_ttft_ms(2000.0);
    assert!(
        expected_ttft > 0.0 && expected_ttft < p.selected.ttft_ms,
        "queueing adds to a lone prefill"
    );
}

#[test]
fn a_tighter_sla_needs_more_gpus() {
    let loose = profile(&qwen8b("requestRate: 4", "ttft: 1000, itl: 50"), None).unwrap();
    let tight = profile(&qwen8b("requestRate: 4", "ttft: 100, itl: 8"), None).unwrap();
    assert!(loose.selected.meets_sla && tight.selected.meets_sla);
    assert!(
        tight.selected.gpus > loose.selected.gpus,
        "{}\n{}",
        loose.summary(),
        tight.summary()
    );
    // What the loose SLA chose misses the tight one, at any step budget (the tight run
    // keeps the one closest to its SLA).
    let same = tight
        .candidates
        .iter()
        .find(|c| same_engines(&c.layout, &loose.selected.layout))
        .unwrap();
    assert!(!same.meets_sla && same.itl_ms > 8.0);
    // The fewest GPUs that meet it: every layout with fewer misses.
    for c in tight
        .candidates
        .iter()
        .filter(|c| c.gpus < tight.selected.gpus)
    {
        assert!(!c.meets_sla, "{c:?}");
    }
    // The selection is in the Pareto set, which holds only layouts nothing beats.
    assert!(
        tight
            .pareto
            .iter()
            .any(|c| c.layout == tight.selected.layout)
    );
}

#[test]
fn without_a_calibration_a_real_engine_is_sized_with_the_models_headroom() {
    let sla = "ttft: 300, itl: 10";
    let real = profile(&qwen8b("requestRate: 4", sla), None).unwrap();
    let mut mock = qwen8b("requestRate: 4", sla);
    mock.backend = RequestBackend::Mocker;
    let mock = profile(&mock, None).unwrap();
    assert_eq!(mock.request.uncertainty, Uncertainty::NONE);
    let u = &real.request.uncertainty;
    assert_eq!(*u, Uncertainty::UNCALIBRATED);
    // The mock engine runs the model: its choice meets the SLA as predicted.
    assert!(mock.selected.itl_ms <= 10.0 && mock.selected.ttft_ms <= 300.0);
    // A real engine's meets it at the bounds of the predictions.
    let s = &real.selected;
    assert!(
        s.bound_itl_ms(u) <= 10.0 && s.bound_ttft_ms(u) <= 300.0,
        "{s:?}"
    );
    let mocks_choice = real
        .candidates
        .iter()
        .find(|c| same_engines(&c.layout, &mock.selected.layout))
        .unwrap();
    assert!(!mocks_choice.meets_sla, "{}", real.summary());
    assert!(
        s.gpus > mock.selected.gpus,
        "{}\n{}",
        real.summary(),
        mock.summary()
    );
    assert!(
        real.summary()
            .contains("headroom for an uncalibrated model")
    );
    assert!(!mock.summary().contains("headroom"));

    // Four GPUs reach 5 ms as predicted, not at the bound: refused, saying so.
    let tight = "ttft: 300, itl: 5";
    let mut mock = qwen8b("requestRate: 4", tight);
    mock.backend = RequestBackend::Mocker;
    assert!(profile(&mock, None).is_ok());
    let err = profile(&qwen8b("requestRate: 4", tight), None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("the ITL target of 5 ms is out of reach")
            && err.contains("with the uncalibrated model's headroom")
            && err.contains("--calibrate"),
        "{err}"
    );
}

#[test]
fn the_optimization_type_changes_the_choice() {
    let run = |kind: &str| {
        profile(
            &qwen8b(
                "requestRate: 4",
                &format!("optimizationType: {kind}, ttft: 1000, itl: 50"),
            ),
            None,
        )
        .unwrap()
    };
    let (throughput, latency) = (run("throughput"), run("latency"));
    let meeting: Vec<_> = latency.candidates.iter().filter(|c| c.meets_sla).collect();
    let best_tput = meeting
        .iter()
        .map(|c| c.throughput_per_gpu)
        .fold(0.0, f64::max);
    let lowest = meeting
        .iter()
        .map(|c| c.e2e_ms)
        .fold(f64::INFINITY, f64::min);
    assert_eq!(throughput.selected.throughput_per_gpu, best_tput);
    assert_eq!(latency.selected.e2e_ms, lowest);
    assert!(latency.selected.gpus > throughput.selected.gpus);
}

#[test]
fn a_concurrency_is_carried_closed_loop() {
    let p = profile(&qwen8b("concurrency: 16", "ttft: 300, itl: 15"), None).unwrap();
    for c in &p.candidates {
        // At most one engine per request in flight; closed loops never overload.
        match c.layout {
            Layout::Aggregated { workers } => assert!(workers.replicas <= 16),
            Layout::Disaggregated { prefill, decode } => {
                assert!(prefill.replicas <= 16 && decode.replicas <= 16)
            }
        }
        if let Layout::Aggregated { .. } = c.layout {
            assert!(!c.overloaded);
            // Little's law over the whole layout: 16 in flight, one per end-to-end time.
            let little = 16.0 * 1000.0 / c.e2e_ms;
            assert!((c.requests_per_s / little - 1.0).abs() < 0.05, "{c:?}");
        }
    }
    // The same request, the same answer.
    let again = profile(&qwen8b("concurrency: 16", "ttft: 300, itl: 15"), None).unwrap();
    assert_eq!(again.candidates, p.candidates);
}

#[test]
fn without_a_load_one_unit_is_sized_at_the_most_it_serves_within_the_sla() {
    let request = |workload: &str| {
        spec(&format!(
            "{{model: Qwen/Qwen3-8B, hardware: {{totalGpus: 4}}, \
             workload: {{isl: 2000, osl: 200{workload}}}, sla: {{ttft: 300, itl: 15}}}}"
        ))
    };
    let p = profile(&request(""), None).unwrap();
    for c in &p.candidates {
        let units = match c.layout {
            Layout::Aggregated { workers } => vec![workers],
            Layout::Disaggregated { prefill, decode } => vec![prefill, decode],
        };
        assert!(units.iter().all(|e| e.replicas == 1), "{}", c.layout);
    }
    assert!(p.selected.meets_sla);
    // The most of each GPU among those that meet the SLA, as Dynamo chooses.
    let best = p
        .candidates
        .iter()
        .filter(|c| c.meets_sla)
        .map(|c| c.throughput_per_gpu)
        .fold(0.0, f64::max);
    assert_eq!(p.selected.throughput_per_gpu, best);
    let dynamo_profiler::Load::Concurrency(most) = p.load else {
        panic!("sized as requests in flight: {:?}", p.load)
    };
    assert!(most > 1, "{most}");
    // One request more and the same layout misses the SLA.
    let more = profile(&request(&format!(", concurrency: {}", most + 1)), None);
    let over = match &more {
        Ok(more) => *more
            .candidates
            .iter()
            .find(|c| c.layout == p.selected.layout)
            .expect("the unit layout is among the loaded ones"),
        // No layout meets it at all, so neither does this one.
        Err(ProfileError::Unreachable { .. }) => return,
        Err(e) => panic!("{e}"),
    };
    assert!(!over.meets_sla, "{over:?} at {}", most + 1);
    assert!(
        p.summary().contains("sized without a load"),
        "{}",
        p.summary()
    );

    // Out of reach even with one request in flight.
    let err = refusal(
        "{model: Qwen/Qwen3-8B, hardware: {totalGpus: 2}, workload: {isl: 2000, osl: 200}, \
         sla: {ttft: 1, itl: 15}}",
    );
    assert!(err.contains("at any load"), "{err}");
}

#[test]
fn an_unreachable_sla_names_the_target_and_what_the_best_reaches() {
    let err = profile(&qwen8b("requestRate: 4", "ttft: 100, itl: 2"), None).unwrap_err();
    let ProfileError::Unreachable { best, .. } = &err else {
        panic!("{err}");
    };
    let message = err.to_string();
    assert!(
        message.contains("the ITL target of 2 ms is out of reach"),
        "{message}"
    );
    assert!(!message.contains("TTFT target"), "{message}");
    let reached = format!(
        "the best, {} ({} GPUs), reaches TTFT {:.1} ms, ITL {:.1} ms",
        best.layout, best.gpus, best.ttft_ms, best.itl_ms
    );
    assert!(best.gpus > 1, "{best:?}");
    assert!(message.contains(&reached), "{message}");
    // More load than four GPUs carry: which rate, and the most any layout serves.
    let err = refusal(
        "{model: Qwen/Qwen3-8B, hardware: {totalGpus: 2}, \
         workload: {isl: 2000, osl: 200, requestRate: 500}, sla: {ttft: 1000, itl: 50}}",
    );
    assert!(err.contains("keeps up with 500 req/s"), "{err}");
}

#[test]
fn bad_requests_are_refused_naming_the_field() {
    let base = |hardware: &str, workload: &str, sla: &str| {
        format!(
            "{{model: Qwen/Qwen3-0.6B, hardware: {hardware}, workload: {workload}, sla: {sla}}}"
        )
    };
    let ok_hw = "{totalGpus: 2}";
    let ok_load = "{isl: 1000, osl: 100, requestRate: 2}";
    let ok_sla = "{ttft: 500, itl: 30}";
    let cases = [
        (
            base("{totalGpus: 0}", ok_load, ok_sla),
            "hardware.totalGpus is 0: a deployment needs at least 1 GPU",
        ),
        (
            base("{totalGpus: 2, numGpusPerNode: 4}", ok_load, ok_sla),
            "hardware.numGpusPerNode 4 is more than hardware.totalGpus 2",
        ),
        (
            base("{gpuSku: tpu_v5}", ok_load, ok_sla),
            "hardware.gpuSku: ",
        ),
        (
            base("{vramMb: 200000}", ok_load, ok_sla),
            "hardware.vramMb 200000 is more than the 81920 MiB of one H100_SXM",
        ),
        (
            base(ok_hw, ok_load, "{ttft: -5, itl: 30}"),
            "sla.ttft is -5: it must be a number above 0",
        ),
        (
            base(ok_hw, ok_load, "{ttft: 500, itl: 0}"),
            "sla.itl is 0: it must be a number above 0",
        ),
        (
            base(ok_hw, ok_load, "{ttft: 500}"),
            "set exactly one SLA mode: sla.ttft and sla.itl together, or sla.e2eLatency",
        ),
        (
            base(ok_hw, ok_load, "{ttft: 500, itl: 30, e2eLatency: 9000}"),
            "set exactly one SLA mode",
        ),
        (
            base(ok_hw, "{isl: 40000, osl: 1000, requestRate: 2}", ok_sla),
            "workload.isl 40000 + workload.osl 1000 is 41000 tokens, more than Qwen/Qwen3-0.6B's \
             context of 40960 tokens",
        ),
        (
            base(
                ok_hw,
                "{isl: 1000, osl: 100, requestRate: 2, concurrency: 4}",
                ok_sla,
            ),
            "workload sets both requestRate and concurrency",
        ),
        (
            base(ok_hw, "{isl: 1000, osl: 100, requestRate: -1}", ok_sla),
            "workload.requestRate is -1: it must be a number above 0",
        ),
        (
            "{model: acme/secret-model, workload: {requestRate: 1}}".to_string(),
            "model \"acme/secret-model\" is not in the built-in catalog and no config.json was given",
        ),
    ];
    for (yaml, expected) in cases {
        let err = refusal(&yaml);
        assert!(err.contains(expected), "{yaml}:\n{err}\nlacks {expected:?}");
    }
    // Llama 3.1 70B's weights alone are 141 GB: one H100 cannot hold them.
    let err = refusal(
        "{model: meta-llama/Llama-3.1-70B-Instruct, hardware: {totalGpus: 1}, \
         workload: {isl: 1000, osl: 100, requestRate: 1}}",
    );
    assert!(
        err.starts_with("no tensor parallel size within a node fits"),
        "{err}"
    );
}

#[test]
fn a_config_json_serves_a_model_the_catalog_lacks_and_kv_routing_can_be_off() {
    // Qwen3-0.6B's architecture under a private name.
    let config = r#"{"num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072,
        "vocab_size": 151936, "torch_dtype": "bfloat16", "max_position_embeddings": 40960,
        "tie_word_embeddings": true}"#;
    let model = ModelArch::from_config_json("acme/secret-model", config).unwrap();
    let request = spec(
        "{model: acme/secret-model, hardware: {totalGpus: 1}, \
         workload: {isl: 1000, osl: 100, requestRate: 2}, sla: {ttft: 500, itl: 30}, \
         features: {kvRouter: {enabled: false}}}",
    );
    let p = profile(&request, Some(model)).unwrap();
    assert_eq!(p.dgd.metadata.name.as_deref(), Some("secret-model"));
    let worker = p.dgd.spec.services["worker"].main_command();
    assert_eq!(worker[2], "acme/secret-model");
    // Without KV routing the picker balances round-robin.
    let epp = serde_json::to_value(&p.dgd.spec.services["epp"]).unwrap();
    assert_eq!(
        epp["envs"],
        serde_json::json!([{"name": "DYN_ROUTER_MODE", "value": "round-robin"}])
    );
}

#[test]
fn an_end_to_end_sla_is_split_for_the_planner_as_the_choice_spends_it() {
    let mut request = qwen8b("requestRate: 4", "e2eLatency: 3000");
    request.features = Some(serde_saphyr::from_str("{planner: {enabled: true}}").unwrap());
    let p = profile(&request, None).unwrap();
    assert!(p.selected.e2e_ms <= 3000.0);
    let argv = p.dgd.spec.services["planner"].main_command();
    let flag = |name: &str| -> f64 {
        let i = argv.iter().position(|a| a == name).unwrap();
        argv[i + 1].parse().unwrap()
    };
    let scale = 3000.0 / p.selected.e2e_ms;
    assert!((flag("--ttft-ms") - p.selected.ttft_ms * scale).abs() <= 0.05);
    assert!((flag("--itl-ms") - p.selected.itl_ms * scale).abs() <= 0.05);
    // `planner: {enabled: false}` asks for none.
    request.features = Some(serde_saphyr::from_str("{planner: {enabled: false}}").unwrap());
    let p = profile(&request, None).unwrap();
    assert!(!p.dgd.spec.services.contains_key("planner"));
}

#[test]
fn less_vram_than_the_datasheet_is_a_smaller_share_of_its_memory() {
    let request = spec(
        "{model: Qwen/Qwen3-8B, hardware: {gpuSku: h100_sxm, vramMb: 40960, totalGpus: 1}, \
         workload: {isl: 1000, osl: 100, requestRate: 1}, sla: {ttft: 1000, itl: 50}, \
         features: {mocker: {enabled: true}}}",
    );
    let p = profile(&request, None).unwrap();
    // Half of an 80 GiB H100: half of vLLM's 0.9.
    assert_eq!(p.request.gpu_memory_utilization, Some(0.45));
    let argv = p.dgd.spec.services["worker"].main_command();
    let i = argv
        .iter()
        .position(|a| a == "--gpu-memory-utilization")
        .unwrap();
    assert_eq!(argv[i + 1], "0.45");
    let blocks = |argv: &[String]| {
        let args = argv
            .iter()
            .cloned()
            .chain(["--model-path".into(), "/no/such/dir".into()]);
        let parsed = dynamo_mocker::Args::try_parse_from(args).unwrap();
        parsed.engine_config().unwrap().num_gpu_blocks
    };
    let full: Vec<String> = [&argv[..i], &argv[i + 2..]].concat();
    assert!(
        blocks(&argv) < blocks(&full) / 2,
        "the weights take the same bytes of less"
    );
}
