//! What the wiring plan generates must run: every container of ours that the operator
//! puts in a pod, and every process of ours the local runner starts, for every sample
//! graph (Dynamo's published ones included), has its command line parsed by the real
//! binary's own argument parser. A generated flag a binary does not take fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::Parser;
use dynamo_crds::{BackendFramework, DynamoGraphDeployment};
use dynamo_e2e::disagg::Topology;
use dynamo_local::plan::{Caps, Graph, ReplicaPorts, RunOptions};
use dynamo_names::Role;
use dynamo_operator::reconcile::{Observed, OperatorConfig, reconcile};
use dynamo_wiring::{DYNAMO_BINARY, EPP_BINARY, MOCKER_BINARY, SIDECAR_BINARY};

/// The sample graphs, and the graphs benchmarks run (`e2e/configs/`).
fn samples() -> Vec<(PathBuf, DynamoGraphDeployment)> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.join("../config/samples");
    let mut found = Vec::new();
    for dir in [
        root.clone(),
        root.join("dynamo"),
        root.join("v1beta1"),
        manifest.join("configs"),
    ] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let yaml = std::fs::read_to_string(&path).unwrap();
            let validated = dynamo_crds::validate_manifest(&yaml)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for dgd in validated.graph_deployments() {
                let mut dgd = dgd.clone();
                dgd.metadata.namespace.get_or_insert_with(|| "ns".into());
                dgd.metadata.uid = Some("uid".into());
                found.push((path.clone(), dgd));
            }
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// Parses `argv` with the parser of the binary it names; returns that binary, or `None`
/// for a program that is not ours (an engine).
fn parse(argv: &[String], context: &str) -> Option<&'static str> {
    fn fail<T>(context: &str, argv: &[String], e: impl std::fmt::Display) -> T {
        panic!("{context}: {argv:?} does not parse: {e}")
    }
    let program = argv.first()?.as_str();
    match program {
        SIDECAR_BINARY => {
            dynamo_sidecar::Config::try_parse_from(argv).unwrap_or_else(|e| fail(context, argv, e));
            Some(SIDECAR_BINARY)
        }
        EPP_BINARY => {
            let args =
                dynamo_epp::Args::try_parse_from(argv).unwrap_or_else(|e| fail(context, argv, e));
            args.into_config()
                .unwrap_or_else(|e| fail(context, argv, e));
            Some(EPP_BINARY)
        }
        MOCKER_BINARY => {
            dynamo_mocker::Args::try_parse_from(argv).unwrap_or_else(|e| fail(context, argv, e));
            Some(MOCKER_BINARY)
        }
        // Our binary runs the planner (`dynamo planner ...`) and writes the KV connector's
        // package (`dynamo connector install DIR`).
        DYNAMO_BINARY if argv.get(1).is_some_and(|w| w == "connector") => {
            dynamo_wiring::connector::parse(&argv[2..]).unwrap_or_else(|e| fail(context, argv, e));
            Some(DYNAMO_BINARY)
        }
        DYNAMO_BINARY => {
            dynamo_wiring::planner::parse(&argv[1..]).unwrap_or_else(|e| fail(context, argv, e));
            Some(DYNAMO_BINARY)
        }
        _ => None,
    }
}

#[test]
fn every_container_of_ours_in_every_generated_pod_parses() {
    let mut parsed = BTreeSet::new();
    let mut tier_flags = BTreeSet::new();
    for (path, dgd) in samples() {
        let desired = reconcile(&dgd, &Observed::default(), &OperatorConfig::default())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let pods = desired.pods.iter().filter_map(|p| p.spec.as_ref());
        let templates = desired
            .deployments
            .iter()
            .filter_map(|d| d.spec.as_ref()?.template.spec.as_ref());
        for spec in pods.chain(templates) {
            let init = spec.init_containers.iter().flatten();
            for container in spec.containers.iter().chain(init) {
                let mut argv = container.command.clone().unwrap_or_default();
                argv.extend(container.args.clone().unwrap_or_default());
                let context = format!("{}: container {}", path.display(), container.name);
                parsed.extend(parse(&argv, &context));
                tier_flags.extend(
                    TIER_FLAGS
                        .into_iter()
                        .filter(|f| argv.iter().any(|w| w == f)),
                );
            }
        }
    }
    assert_eq!(
        parsed,
        BTreeSet::from([DYNAMO_BINARY, EPP_BINARY, MOCKER_BINARY, SIDECAR_BINARY]),
        "every binary of ours appears in some sample"
    );
    assert_eq!(
        tier_flags.len(),
        TIER_FLAGS.len(),
        "a sample with KV block tiers (agg-mocker-kvbm.yaml) exercises their flags"
    );
}

/// The KV block tier flags of the sidecar and the mock engine the samples generate.
const TIER_FLAGS: [&str; 4] = [
    "--kv-host-bytes",
    "--kv-disk-dir",
    "--kv-disk-bytes",
    "--kv-blocks-url",
];

/// The profile a planner command reads (`--profile`) and the one a mock engine's
/// command writes (`--planner-profile-out`), each as its own binary's parser reads it.
fn profile_paths(planner: &[String], mocker: &[String]) -> (Option<PathBuf>, Option<PathBuf>) {
    let reads = dynamo_wiring::planner::parse(&planner[1..])
        .unwrap()
        .profile;
    let writes = dynamo_mocker::Args::try_parse_from(mocker)
        .unwrap()
        .planner_profile_out;
    (reads, writes)
}

/// On a cluster, the planner sample (our planner in throughput mode, no profile, mock
/// engine workers) runs its worker's mock engine in an init container that writes the
/// profile where the planner reads it; run for real (into a file of ours, the pod's path
/// aside), that command writes a profile the planner starts from.
#[test]
fn the_planner_samples_pod_measures_the_profile_its_planner_reads() {
    let (path, dgd) = samples()
        .into_iter()
        .find(|(path, _)| path.ends_with("config/samples/agg-mocker-planner.yaml"))
        .expect("the planner sample");
    let desired = reconcile(&dgd, &Observed::default(), &OperatorConfig::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let pod = desired
        .deployments
        .iter()
        .find(|d| d.metadata.name.as_deref() == Some("agg-mocker-planner-planner"))
        .and_then(|d| d.spec.as_ref()?.template.spec.as_ref())
        .expect("the planner's Deployment");
    let argv = |command: &Option<Vec<String>>, args: &Option<Vec<String>>| {
        command
            .iter()
            .chain(args)
            .flatten()
            .cloned()
            .collect::<Vec<_>>()
    };
    let main = &pod.containers[0];
    let planner = argv(&main.command, &main.args);
    let inits = pod.init_containers.as_deref().unwrap_or_default();
    assert_eq!(inits.len(), 1, "one profile measurement");
    let measure = argv(&inits[0].command, &inits[0].args);
    assert_eq!(parse(&planner, "planner"), Some(DYNAMO_BINARY));
    assert_eq!(parse(&measure, "its init container"), Some(MOCKER_BINARY));
    let (reads, writes) = profile_paths(&planner, &measure);
    assert!(reads.is_some(), "{planner:?}");
    assert_eq!(reads, writes);
    // The worker's own engine flags, measured.
    let worker = desired
        .pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some("agg-mocker-planner-worker-0"))
        .and_then(|p| p.spec.as_ref())
        .expect("the worker's pod");
    let engine = &worker.containers[0];
    assert_eq!(
        measure[..measure.len() - 2],
        argv(&engine.command, &engine.args)
    );

    let dir = std::env::temp_dir().join(format!("planner-sample-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("profile.json");
    let mut mocker = dynamo_mocker::Args::try_parse_from(&measure).unwrap();
    mocker.planner_profile_out = Some(out.clone());
    assert!(mocker.write_planner_profile().unwrap(), "measured and done");
    let mut args = dynamo_wiring::planner::parse(&planner[1..]).unwrap();
    args.profile = Some(out);
    let settings = dynamo_planner_service::settings(&args);
    std::fs::remove_dir_all(&dir).unwrap();
    settings.unwrap_or_else(|e| panic!("the planner refuses the measured profile: {e:#}"));
}

/// A local run of a sample on `backend` (the file's when `None`).
fn run_options(backend: Option<BackendFramework>) -> RunOptions {
    RunOptions {
        model_path: Some(PathBuf::from("/models/m")),
        backend,
        router_mode: None,
        replicas: Default::default(),
        caps: Caps {
            replicas_per_service: 8,
            processes: 64,
        },
    }
}

/// One replica's ports, as the local runner hands them out.
const PORTS: ReplicaPorts = ReplicaPorts {
    engine: 41001,
    engine_kv_events: 41002,
    engine_kv_replay: 41003,
    sidecar: 41004,
    sidecar_grpc: 41005,
    sidecar_metrics: 41006,
    kv_side_channel: 41007,
};

#[test]
fn every_process_the_local_runner_starts_parses() {
    let ports = PORTS;
    let mut ran = 0;
    let mut planners = 0;
    for (path, dgd) in samples() {
        // Multi-node graphs run on clusters only; the plan says so (tested there).
        let Ok(graph) = Graph::from_dgd(&dgd, &run_options(Some(BackendFramework::Mocker))) else {
            continue;
        };
        let context = path.display().to_string();
        let epp = graph.epp_command(("127.0.0.1", 8000), 9002, Path::new("/tmp/e.json"));
        let argv = |c: dynamo_local::plan::CommandSpec| {
            std::iter::once(c.program).chain(c.args).collect::<Vec<_>>()
        };
        assert_eq!(parse(&argv(epp), &context), Some(EPP_BINARY));
        for service in graph.workers.keys() {
            let engine = argv(graph.engine_command(service, ports));
            assert_eq!(parse(&engine, &context), Some(MOCKER_BINARY));
            let sidecar = argv(graph.sidecar_command(
                service,
                ports,
                Path::new("/tmp/kv"),
                Path::new("/tmp/e.json"),
            ));
            assert_eq!(parse(&sidecar, &context), Some(SIDECAR_BINARY));
        }
        if graph.planner.is_some() {
            let profile = Path::new("/tmp/planner-profile.json");
            let measure = graph.profile_command(profile).map(argv);
            let planner = graph
                .planner_command(
                    "http://127.0.0.1:41010",
                    "http://127.0.0.1:41011",
                    "127.0.0.1:41012".parse().unwrap(),
                    measure.as_ref().map(|_| profile),
                )
                .unwrap()
                .unwrap_or_else(|e| panic!("{context}: {e}"));
            let planner = argv(planner);
            assert_eq!(parse(&planner, &context), Some(DYNAMO_BINARY));
            if let Some(measure) = measure {
                assert_eq!(parse(&measure, &context), Some(MOCKER_BINARY));
                let (reads, writes) = profile_paths(&planner, &measure);
                assert_eq!(reads.as_deref(), Some(profile), "{context}");
                assert_eq!(writes.as_deref(), Some(profile), "{context}");
            }
            planners += 1;
        }
        ran += 1;
    }
    assert!(
        planners >= 2,
        "the planner samples run locally ({planners})"
    );
    assert!(
        ran >= 6,
        "most samples run locally on the mock engine ({ran})"
    );
}

/// The disaggregation benchmark's graphs (`e2e/configs/disagg-{agg4,2p2d,1p3d}.yaml`)
/// are the graphs their names say: `dynamo-e2e bench --modes agg4,2p2d,1p3d` reads the
/// names as topologies for its per-engine figures, and `replay --topology` simulates
/// the same shapes. Every engine is a mocker worker, and a disaggregated graph's workers
/// are wired for the prefill hop (block API, no tiers, a decode sidecar's prefill peers).
#[test]
fn the_disaggregation_benchmark_graphs_are_the_topologies_they_are_named_after() {
    let ports = PORTS;
    let options = RunOptions {
        model_path: Some(PathBuf::from("/models/m")),
        backend: None,
        router_mode: None,
        replicas: Default::default(),
        caps: Caps {
            replicas_per_service: 8,
            processes: 64,
        },
    };
    let argv = |c: dynamo_local::plan::CommandSpec| {
        std::iter::once(c.program).chain(c.args).collect::<Vec<_>>()
    };
    let mut found = Vec::new();
    for (path, dgd) in samples() {
        let Some(mode) = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.strip_prefix("disagg-"))
            .filter(|_| path.parent().is_some_and(|d| d.ends_with("configs")))
        else {
            continue;
        };
        let context = path.display().to_string();
        let topology = Topology::parse(mode).unwrap_or_else(|e| panic!("{context}: {e}"));
        let graph = Graph::from_dgd(&dgd, &options).unwrap_or_else(|e| panic!("{context}: {e}"));
        let count = |role: Role| -> usize {
            graph
                .workers
                .values()
                .filter(|w| w.role == role)
                .map(|w| w.replicas as usize)
                .sum()
        };
        let shape = (
            count(Role::Aggregated),
            count(Role::Prefill),
            count(Role::Decode),
        );
        let expected = match topology {
            Topology::Aggregated { engines } => (engines, 0, 0),
            Topology::Disaggregated { prefill, decode } => (0, prefill, decode),
        };
        assert_eq!(shape, expected, "{context}");
        assert_eq!(
            topology.engines(),
            4,
            "{context}: the same 4 engines in each graph"
        );
        for (service, worker) in &graph.workers {
            let engine = argv(graph.engine_command(service, ports));
            assert_eq!(parse(&engine, &context), Some(MOCKER_BINARY));
            let sidecar = argv(graph.sidecar_command(
                service,
                ports,
                Path::new("/tmp/kv"),
                Path::new("/tmp/e.json"),
            ));
            assert_eq!(parse(&sidecar, &context), Some(SIDECAR_BINARY));
            let has = |argv: &[String], flag: &str| argv.iter().any(|w| w == flag);
            let disaggregated = worker.role != Role::Aggregated;
            assert_eq!(
                has(&engine, "--kv-blocks-url"),
                disaggregated,
                "{context}: {engine:?}"
            );
            if disaggregated {
                let offload = engine.iter().position(|w| w == "--kv-offload");
                assert_eq!(
                    offload.map(|i| engine[i + 1].as_str()),
                    Some("none"),
                    "{context}: {engine:?}"
                );
            }
            assert_eq!(
                has(&sidecar, "--prefill-peers"),
                worker.role == Role::Decode,
                "{context}: {sidecar:?}"
            );
        }
        found.push(topology.to_string());
    }
    found.sort();
    assert_eq!(found, ["1p3d", "2p2d", "agg:4"]);
}

/// Every vLLM command line the operator's pods and the local runner start, parsed by
/// vLLM 0.33's own parser (`connectors/python/tests/parse_vllm_commands.py`: `vllm serve`'s
/// parser and `AsyncEngineArgs`) in the vLLM environment (`make vllm`; skipped without it
/// unless `DYNAMO_REQUIRE_VLLM` is set), each KV connector it names resolved to its class
/// as vLLM does, our own from the package on its `PYTHONPATH`.
#[test]
fn every_vllm_command_line_parses_with_vllms_own_parser() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let vllm = std::env::var_os("VLLM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".cache/vllm"));
    if !vllm.join("bin/python").exists() {
        assert!(
            std::env::var_os("DYNAMO_REQUIRE_VLLM").is_none(),
            "no vLLM at {} (`make vllm`), and DYNAMO_REQUIRE_VLLM is set",
            vllm.display()
        );
        eprintln!("skipped: no vLLM at {}", vllm.display());
        return;
    }
    let mut cases = Vec::new();
    for (path, dgd) in samples() {
        let desired = reconcile(&dgd, &Observed::default(), &OperatorConfig::default())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for pod in desired.pods.iter().filter_map(|p| p.spec.as_ref()) {
            for container in &pod.containers {
                let mut argv = container.command.clone().unwrap_or_default();
                argv.extend(container.args.clone().unwrap_or_default());
                if argv.first().is_some_and(|p| p == "vllm") {
                    let context = format!("{}: container {}", path.display(), container.name);
                    cases.push(serde_json::json!({"context": context, "argv": argv}));
                }
            }
        }
        let Ok(graph) = Graph::from_dgd(&dgd, &run_options(None)) else {
            continue;
        };
        for service in graph.workers.keys() {
            let engine = graph.engine_command(service, PORTS);
            if engine.program == "vllm" {
                let argv: Vec<String> =
                    std::iter::once(engine.program).chain(engine.args).collect();
                let context = format!("{}: local {service}", path.display());
                cases.push(serde_json::json!({"context": context, "argv": argv}));
            }
        }
    }
    let file = std::env::temp_dir().join(format!("vllm-commands-{}.json", std::process::id()));
    std::fs::write(&file, serde_json::to_vec(&cases).unwrap()).unwrap();
    let output = std::process::Command::new(vllm.join("bin/python"))
        .arg(root.join("connectors/python/tests/parse_vllm_commands.py"))
        .arg(&file)
        .env("PYTHONPATH", root.join("connectors/python"))
        .env("VLLM_TARGET_DEVICE", "cpu")
        .output()
        .expect("runs vLLM's Python");
    std::fs::remove_file(&file).ok();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let parsed: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(parsed.len(), cases.len(), "every command line parsed");
    let connectors: BTreeSet<String> = parsed
        .iter()
        .flat_map(|p| p["connectors"].as_array().unwrap().clone())
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    // vLLM 0.33's `NixlConnector` is its class `NixlPullConnector`.
    assert_eq!(
        connectors,
        BTreeSet::from(["DynamoSidecarConnector".into(), "NixlPullConnector".into()]),
        "the KV tier and disaggregated samples load both"
    );
    for p in &parsed {
        // vLLM 0.33 connects to this endpoint, where the sidecar listens
        // (`--engine-kv-events-listen`); `tcp://*` would open it to the network.
        let events = p["kv_events"]
            .as_str()
            .unwrap_or_else(|| panic!("{p}: no KV events"));
        assert!(events.starts_with("tcp://127.0.0.1:"), "{p}");
    }
}
