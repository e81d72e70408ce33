//! `dynamo profile -f DGDR.yaml`: the DGDR profiler offline (docs/dgdr.md). The request is
//! checked as the API server would, profiled, and the generated graph printed on stdout
//! as YAML (checked by the same validator, so it applies as written); the predictions
//! and the Pareto table go to stderr. With `--verify`, the graph then runs on this machine
//! on mock engines and the predictions are set against what is measured ([`verify`]).

mod verify;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use dynamo_operator::reconcile::names::validate_manifest;
use dynamo_perfmodel::ModelArch;
use dynamo_profiler::graph::{PROFILE_KEY, profile_config_map};
use dynamo_server::parse_duration;

#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// The DynamoGraphDeploymentRequest (one YAML document).
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// The model's config.json, for a model the built-in catalog does not know.
    #[arg(long)]
    model_config: Option<PathBuf>,
    /// Write the planner's profile of the selected engines (JSON, docs/planner.md) here. A
    /// generated planner of real engines reads it from the ConfigMap `{graph}-planner-profile`
    /// (key `profile.json`).
    #[arg(long)]
    profile_out: Option<PathBuf>,
    /// Then run the generated graph on this machine (as `dynamo run` does) with every engine
    /// the mock engine on the same performance model, under the request's workload, and
    /// print the predicted against the measured TTFT, ITL, end-to-end time and throughput.
    #[arg(long)]
    verify: bool,
    /// How long --verify measures, after its warm-up (e.g. 15, 30s, 1m).
    #[arg(long, default_value = "15", value_parser = parse_duration, requires = "verify")]
    verify_duration: Duration,
    /// Model directory (tokenizer.json; `make model` builds one) for --verify's endpoint
    /// picker and mock engines.
    #[arg(long, env = "DYNAMO_MODEL_PATH")]
    model_path: Option<PathBuf>,
}

pub fn run(args: &ProfileArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let file = args.file.display();
    // Refused before the profile's seconds are spent.
    let verify_model = match (args.verify, &args.model_path) {
        (false, _) => None,
        (true, None) => bail!(
            "--verify runs the graph on this machine: pass --model-path DIR (a Hugging \
             Face-style directory with tokenizer.json; `make model` builds one)"
        ),
        (true, Some(_)) if args.verify_duration.is_zero() => {
            bail!("--verify-duration must be above 0")
        }
        (true, Some(dir)) => Some(dir),
    };
    let yaml = std::fs::read_to_string(&args.file).with_context(|| format!("reading {file}"))?;
    let validated = validate_manifest(&yaml).map_err(|e| anyhow::anyhow!("{file}:\n{e}"))?;
    let mut requests = validated.requests();
    let (Some(request), None) = (requests.next(), requests.next()) else {
        bail!("{file}: expected exactly one DynamoGraphDeploymentRequest");
    };
    let model = match &args.model_config {
        Some(path) => Some(model_config(&request.spec.model, path)?),
        None => None,
    };
    let name = request
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| dynamo_profiler::default_name(&request.spec.model));
    let mut profiled = dynamo_profiler::profile_named(&name, &request.spec, model)?;
    profiled
        .dgd
        .metadata
        .namespace
        .clone_from(&request.metadata.namespace);
    let out = serde_saphyr::to_string(&profiled.dgd).context("the graph as YAML")?;
    // The generated graph must pass what it will meet on apply; a refusal is our bug.
    validate_manifest(&out).map_err(|e| anyhow::anyhow!("the generated graph is refused:\n{e}"))?;
    eprint!("{}", profiled.summary());
    if let Some(path) = &args.profile_out {
        let json = serde_json::to_string_pretty(&profiled.planner_profile)? + "\n";
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        eprintln!(
            "planner profile written to {}; a planner of real engines reads it from: kubectl \
             create configmap {} --from-file={PROFILE_KEY}={}",
            path.display(),
            profile_config_map(&name),
            path.display()
        );
    }
    eprintln!("profiled in {:.2} s", started.elapsed().as_secs_f64());
    print!("{out}");
    if let Some(model_path) = verify_model {
        // The graph is the product: a pipe gets it before the measuring starts.
        std::io::Write::flush(&mut std::io::stdout())?;
        verify::run(&profiled, &name, model_path, args.verify_duration)?;
    }
    Ok(())
}

fn model_config(model: &str, path: &Path) -> anyhow::Result<ModelArch> {
    let json =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    ModelArch::from_config_json(model, &json).with_context(|| format!("{}", path.display()))
}
