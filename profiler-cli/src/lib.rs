//! `dynamo profile -f DGDR.yaml`: the DGDR profiler offline (docs/dgdr.md). The request is
//! checked as the API server would, profiled, and the generated graph printed on stdout
//! as YAML (checked by the same validator, so it applies as written); the predictions
//! and the Pareto table go to stderr. With `--verify`, the graph then runs on this machine
//! on mock engines and the predictions are set against what is measured ([`verify`]).
//! With `--calibrate FILE`, the hardware model's efficiency factors are first fitted to
//! measurements ([`dynamo_profiler::calibrate`]): alone, the fit is printed (the table on
//! stderr, the factors on stdout as a file `--calibrate` takes back); with `-f`, the
//! request is profiled on them.

mod verify;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use dynamo_crds::dgdr::DynamoGraphDeploymentRequestSpec;
use dynamo_operator::reconcile::names::validate_manifest;
use dynamo_perfmodel::{Estimator, ModelArch};
use dynamo_profiler::calibrate;
use dynamo_profiler::graph::{PROFILE_KEY, profile_config_map};
use dynamo_server::parse_duration;

#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// The DynamoGraphDeploymentRequest (one YAML document).
    #[arg(short = 'f', long = "file", required_unless_present = "calibrate")]
    file: Option<PathBuf>,
    /// Measured TTFT/ITL points of one GPU, model and TP (YAML or JSON, inline or aiperf
    /// exports; docs/perfmodel.md, "Calibration"): the hardware model's efficiency factors
    /// are fitted to them and the fit printed. With -f, the request (of the same GPU and
    /// model) is profiled on the fitted factors. A file of factors and no points, as a fit
    /// prints, is used as it is. A request naming spec.profilingConfig.calibrationRef
    /// needs it: the file that ConfigMap key holds.
    #[arg(long, value_name = "FILE")]
    calibrate: Option<PathBuf>,
    /// The model's config.json, for a model the built-in catalog does not know; a request
    /// naming spec.modelConfigRef needs it: the file that ConfigMap key holds.
    #[arg(long, requires = "file")]
    model_config: Option<PathBuf>,
    /// Write the planner's profile of the selected engines (JSON, docs/planner.md) here. A
    /// generated planner of real engines reads it from the ConfigMap `{graph}-planner-profile`
    /// (key `profile.json`).
    #[arg(long, requires = "file")]
    profile_out: Option<PathBuf>,
    /// Then run the generated graph on this machine (as `dynamo run` does) with every engine
    /// the mock engine on the same performance model, under the request's workload, and
    /// print the predicted against the measured TTFT, ITL, end-to-end time and throughput.
    #[arg(long, requires = "file")]
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
    let Some(path) = &args.file else {
        // Alone (clap requires one of the two).
        if let Some(calibration_file) = &args.calibrate
            && let (_, Some(fitted)) = calibration(calibration_file)?
        {
            print!("{fitted}");
        }
        return Ok(());
    };
    let file = path.display();
    // Refused before the fit's and the profile's seconds are spent.
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
    let yaml = std::fs::read_to_string(path).with_context(|| format!("reading {file}"))?;
    let validated = validate_manifest(&yaml).map_err(|e| anyhow::anyhow!("{file}:\n{e}"))?;
    let mut requests = validated.requests();
    let (Some(request), None) = (requests.next(), requests.next()) else {
        bail!("{file}: expected exactly one DynamoGraphDeploymentRequest");
    };
    unread_references(&request.spec, args).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
    let model = match &args.model_config {
        Some(path) => Some(model_config(&request.spec.model, path)?),
        None => None,
    };
    let name = request
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| dynamo_profiler::default_name(&request.spec.model));
    let calibrated = match &args.calibrate {
        Some(calibration_file) => Some(calibration(calibration_file)?.0),
        None => None,
    };
    let started = Instant::now();
    let mut profiled =
        dynamo_profiler::profile_calibrated(&name, &request.spec, model, calibrated.as_ref())?;
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

/// Refuses a request naming a ConfigMap the operator would read when its file is not
/// given: profiled without it, the answer would not be the operator's.
fn unread_references(
    spec: &DynamoGraphDeploymentRequestSpec,
    args: &ProfileArgs,
) -> anyhow::Result<()> {
    if let Some(r) = &spec.model_config_ref
        && args.model_config.is_none()
    {
        bail!(
            "spec.modelConfigRef names key {} of ConfigMap {}, which the operator reads: pass \
             that file with --model-config FILE",
            r.key,
            r.name
        );
    }
    let calibration_ref = spec
        .profiling_config
        .as_ref()
        .and_then(|p| p.calibration_ref.as_ref());
    if let Some(r) = calibration_ref
        && args.calibrate.is_none()
    {
        bail!(
            "spec.profilingConfig.calibrationRef names key {} of ConfigMap {}, which the \
             operator fits: pass that file with --calibrate FILE",
            r.key,
            r.name
        );
    }
    Ok(())
}

/// The estimator of the calibration at `path`, on the factors fitted to its points (or
/// given without points), and the fitted factors as a calibration file of factors only.
/// The fit goes to stderr.
fn calibration(path: &Path) -> anyhow::Result<(Estimator, Option<String>)> {
    let started = Instant::now();
    let shown = path.display();
    let c = calibrate::load(path).with_context(|| format!("--calibrate {shown}"))?;
    let e = &c.measurements.estimator;
    eprintln!(
        "calibration {shown}: {} on {} x {}, weights {}, KV {}",
        e.model.name, e.tp, e.gpu.name, e.weight_dtype, e.kv_dtype
    );
    let (estimator, fit) =
        calibrate::calibrated(&c).with_context(|| format!("--calibrate {shown}"))?;
    let Some(fit) = fit else {
        let e = &estimator.efficiency;
        eprintln!(
            "no points: the factors as given (compute {}, memory {}, kv_memory {}, step overhead \
             {} ms)",
            e.compute, e.memory, e.kv_memory, e.step_overhead_ms
        );
        return Ok((estimator, None));
    };
    eprint!("{}", fit.summary());
    eprintln!("fitted in {:.2} s", started.elapsed().as_secs_f64());
    let out = c.with_efficiency(&fit.efficiency);
    let yaml = serde_saphyr::to_string(&out).context("the fitted factors as YAML")?;
    // As written, relative: it holds beside the calibration file and as a key of the same
    // ConfigMap (calibrationRef), where an absolute path of this machine would not.
    let beside = match &out.model_config {
        Some(config) => format!(
            "; keep it beside {shown}: its model_config {} is relative to that folder",
            config.display()
        ),
        None => String::new(),
    };
    let fitted = format!(
        "# the factors `dynamo profile --calibrate {shown}` fitted; --calibrate takes this \
         file back{beside}\n{yaml}"
    );
    Ok((estimator, Some(fitted)))
}

fn model_config(model: &str, path: &Path) -> anyhow::Result<ModelArch> {
    let json =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    ModelArch::from_config_json(model, &json).with_context(|| format!("{}", path.display()))
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ProfileArgs,
    }

    #[test]
    fn calibrate_alone_needs_no_request_and_prints_factors_it_takes_back() {
        assert!(
            Cli::try_parse_from(["profile"]).is_err(),
            "-f or --calibrate"
        );
        for needs_a_request in ["--verify", "--profile-out=x", "--model-config=x"] {
            let argv = ["profile", "--calibrate", "c.yaml", needs_a_request];
            assert!(Cli::try_parse_from(argv).is_err(), "{needs_a_request}");
        }
        let cli = Cli::try_parse_from(["profile", "--calibrate", "c.yaml"]).unwrap();
        assert_eq!(cli.args.file, None);

        let dir = std::env::temp_dir().join(format!("calibrate-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let points = dir.join("points.yaml");
        std::fs::write(
            &points,
            "gpu: H100_SXM\nmodel: Qwen/Qwen3-8B\ntp: 1\npoints:\n\
             - {isl: 3000, osl: 10, concurrency: 1, ttft_ms: 200, itl_ms: 12}\n\
             - {isl: 300, osl: 10, concurrency: 1, ttft_ms: 30, itl_ms: 11.5}\n",
        )
        .unwrap();
        let (estimator, fitted) = calibration(&points).unwrap();
        let fitted = fitted.expect("points are fitted");
        assert_ne!(
            estimator.efficiency,
            dynamo_perfmodel::Efficiency::default()
        );
        // Fed back: the same estimator, nothing to fit.
        let factors = dir.join("factors.yaml");
        std::fs::write(&factors, &fitted).unwrap();
        let (again, none) = calibration(&factors).unwrap();
        assert_eq!(again, estimator);
        assert_eq!(none, None);
        let err = calibration(&dir.join("absent.yaml")).unwrap_err();
        assert!(format!("{err:#}").contains("--calibrate"), "{err:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
