//! The planner's command line, for the operator's planner pods and the local runner's
//! planner process alike: a planner service runs `dynamo planner` (docs/planner.md) when
//! its main container runs it, runs Dynamo's planner launcher (whose flags carry over), or
//! names no command. Any other command is not ours to write: it runs as written. Which
//! worker's mock engine measures the profile of a planner that takes one is decided here
//! too ([`profile_source`]).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use clap::{Args, Command, FromArgMatches};
use dynamo_crds::ComponentSpec;
use dynamo_crds::role::{PLANNER_PROGRAMS, launched_program};
use dynamo_planner::predict::PredictorConfig;

mod args;

pub use args::{
    GRAPH_ENV, LoadTargetArg, ModeArg, NAMESPACE_ENV, PROMETHEUS_ENV, PlannerArgs, PrometheusAccess,
};

use crate::argv::{self, Arity};
use crate::{EngineService, GraphWiring};

/// The subcommand of our binary that runs the planner.
pub const SUBCOMMAND: &str = "planner";

/// Where the planner reads the graph's replicas and writes new ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlannerTarget<'a> {
    /// A cluster graph: the DGD's name.
    Graph(&'a str),
    /// A local graph: the runner's admin API base URL.
    Admin(&'a str),
}

/// What the rendering decides for the planner; everything else comes from the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannerInputs<'a> {
    pub target: PlannerTarget<'a>,
    /// Prometheus' base URL; `None` leaves the service's `--prometheus`, else the planner's
    /// default (`PROMETHEUS_ENDPOINT`, then kube-prometheus-stack's Service).
    pub prometheus: Option<&'a str>,
    /// Where the planner's `/metrics` and `/healthz` listen.
    pub metrics_addr: SocketAddr,
    /// A profile that replaces the service's (`--profile`, `--prefill-profile`,
    /// `--decode-profile`): the local runner passes the mock engine's own.
    pub profile: Option<&'a Path>,
}

/// Why a planner service's command line cannot be written; each names what to change.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum PlannerWiringError {
    /// Not `dynamo planner` nor Dynamo's planner launcher: not an error of the graph, the
    /// command runs as written (as an engine command we do not know does).
    #[error(
        "spec.services.{service}: {program:?} is neither `dynamo planner` nor Dynamo's planner \
         launcher (python3 -m planner_sla | dynamo.planner); it runs as written"
    )]
    Custom { service: String, program: String },
    #[error("spec.services.{service}: {flag} {value:?}: {problem}")]
    BadValue {
        service: String,
        flag: String,
        value: String,
        problem: String,
    },
    #[error(
        "spec.services.{service}: Dynamo's planner flag {flag} has no counterpart in `dynamo \
         planner`; remove it or write the service's command as `dynamo planner` flags \
         (docs/planner.md)"
    )]
    UnknownFlag { service: String, flag: String },
    #[error("spec.services.{service}: `dynamo planner` refuses the service's flags: {message}")]
    Refused { service: String, message: String },
    #[error(
        "spec.services.{service}: `dynamo planner` plans throughput (its default --mode) from a \
         performance profile, and the graph has none: the service gives no --profile and no \
         worker runs the mock engine, whose own profile would be measured; give it --profile \
         FILE (the planner's profile format, docs/planner.md; from a DGDR's profiling, say) or \
         --mode load"
    )]
    NoProfile { service: String },
}

/// Whether a planner service takes a profile from the rendering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProfileNeed {
    /// It names its own, or plans on load whatever it is given.
    Unneeded,
    /// Dynamo's planner launcher: throughput with one, load without (its profiling
    /// results do not carry over).
    Optional,
    /// Ours in throughput mode: it cannot start without one.
    Required,
}

/// What `service`'s planner needs of a profile, from its command alone. Errors as
/// [`planner_args`] does ([`PlannerWiringError::Custom`] included).
pub fn profile_need(
    service: &str,
    spec: &ComponentSpec,
) -> Result<ProfileNeed, PlannerWiringError> {
    // The target and addresses do not change what it needs.
    let placeholder = PlannerInputs {
        target: PlannerTarget::Graph("graph"),
        prometheus: None,
        metrics_addr: SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        profile: None,
    };
    let (_, parsed, launcher) = render(service, spec, &placeholder)?;
    let own = parsed.profile.is_some()
        || parsed.prefill_profile.is_some()
        || parsed.decode_profile.is_some();
    Ok(match (own, launcher, parsed.mode) {
        (true, _, _) => ProfileNeed::Unneeded,
        (false, true, _) => ProfileNeed::Optional,
        (false, false, ModeArg::Throughput | ModeArg::ThroughputLoad) => ProfileNeed::Required,
        (false, false, ModeArg::Load) => ProfileNeed::Unneeded,
    })
}

/// The engine service whose mock engine measures `service`'s profile, for both
/// renderings: `Some` when the planner takes one ([`profile_need`]) and a worker runs the
/// mock engine ([`GraphWiring::profile_engine`]); `None` when it takes none or plans on
/// load without one. A planner that cannot start without one, with none to measure, is
/// refused ([`PlannerWiringError::NoProfile`]) rather than left to exit at start.
pub fn profile_source<'w>(
    service: &str,
    spec: &ComponentSpec,
    wiring: Option<&'w GraphWiring>,
) -> Result<Option<(&'w str, &'w EngineService)>, PlannerWiringError> {
    let need = profile_need(service, spec)?;
    if need == ProfileNeed::Unneeded {
        return Ok(None);
    }
    match wiring.and_then(GraphWiring::profile_engine) {
        Some(engine) => Ok(Some(engine)),
        None if need == ProfileNeed::Required => Err(PlannerWiringError::NoProfile {
            service: service.into(),
        }),
        None => Ok(None),
    }
}

/// The arguments after the `dynamo` binary, starting with "planner": the service's own
/// `dynamo planner` flags, or its Dynamo launcher's flags as ours (`DYNAMO_FLAGS`), then
/// the target, Prometheus, the metrics address and the profile from `inputs` (replacing
/// the service's), checked with the planner's own parser. [`PlannerWiringError::Custom`]
/// says the service runs a command of its own, which the caller runs as written.
pub fn planner_args(
    service: &str,
    spec: &ComponentSpec,
    inputs: &PlannerInputs,
) -> Result<Vec<String>, PlannerWiringError> {
    render(service, spec, inputs).map(|(args, _, _)| args)
}

/// [`planner_args`], the planner's parse of them, and whether the service runs Dynamo's
/// planner launcher.
fn render(
    service: &str,
    spec: &ComponentSpec,
    inputs: &PlannerInputs,
) -> Result<(Vec<String>, PlannerArgs, bool), PlannerWiringError> {
    let command = command_words(&spec.main_command());
    let words: Vec<&str> = command.iter().map(String::as_str).collect();
    let mut launcher = false;
    let user = match launched_program(&words) {
        None if words.is_empty() => Vec::new(),
        Some(crate::DYNAMO_BINARY) if words.get(1) == Some(&SUBCOMMAND) => command[2..].to_vec(),
        Some(program) if PLANNER_PROGRAMS.contains(&program) => {
            launcher = true;
            let module = words.iter().position(|w| *w == "-m").map_or(1, |m| m + 2);
            let mut ours = from_dynamo(service, &command[module..])?;
            // Its profiling results (NPZ) do not carry over: without a profile of ours,
            // scale on load, as Dynamo's planner does by default (optimization target
            // `throughput`: load scaling on, throughput scaling off; `planner_config.py`).
            if inputs.profile.is_none() {
                ours.splice(0..0, ["--mode".to_string(), "load".to_string()]);
            }
            ours
        }
        // A Python script, or any other program.
        program => {
            return Err(PlannerWiringError::Custom {
                service: service.into(),
                program: program.unwrap_or(words[0]).into(),
            });
        }
    };
    let mut args = user;
    for (flag, arity) in OWNED {
        args = argv::remove(&args, flag, *arity);
    }
    if inputs.profile.is_some() {
        for flag in PROFILE_FLAGS {
            args = argv::remove(&args, flag, Arity::One);
        }
    }
    if inputs.prometheus.is_some() {
        args = argv::remove(&args, PROMETHEUS_FLAG, Arity::One);
    }
    let mut out = vec![SUBCOMMAND.to_string()];
    out.extend(args);
    match inputs.target {
        PlannerTarget::Graph(name) => out.extend(["--graph".into(), name.into()]),
        PlannerTarget::Admin(url) => out.extend(["--admin-url".into(), url.into()]),
    }
    if let Some(url) = inputs.prometheus {
        out.extend([PROMETHEUS_FLAG.into(), url.into()]);
    }
    out.extend(["--metrics-addr".into(), inputs.metrics_addr.to_string()]);
    if let Some(path) = inputs.profile {
        out.extend(["--profile".into(), path.to_string_lossy().into_owned()]);
    }
    let parsed = parse(&out).map_err(|e| PlannerWiringError::Refused {
        service: service.into(),
        message: first_paragraph(&e.to_string()),
    })?;
    Ok((out, parsed, launcher))
}

/// Parses a planner command line (`planner` first, as [`planner_args`] writes it) with the
/// planner's own parser and `dynamo`'s logging flags, reading no environment variable:
/// the result depends on the words alone, whichever process parses them.
pub fn parse<S: AsRef<str>>(args: &[S]) -> Result<PlannerArgs, clap::Error> {
    let command =
        dynamo_server::LogArgs::augment_args(PlannerArgs::augment_args(Command::new(SUBCOMMAND)))
            .mut_args(|arg| arg.env(None));
    let matches = command.try_get_matches_from(args.iter().map(AsRef::as_ref))?;
    PlannerArgs::from_arg_matches(&matches)
}

/// Flags the rendering sets itself, so the user's are dropped: where the graph is, and
/// where the planner's metrics listen (the pod's port that Prometheus scrapes).
const OWNED: &[(&str, Arity)] = &[
    ("--graph", Arity::One),
    ("--admin-url", Arity::One),
    ("--metrics-addr", Arity::One),
    // A cluster graph is in the planner pod's own namespace.
    ("--namespace", Arity::One),
];
const PROFILE_FLAGS: [&str; 3] = ["--profile", "--prefill-profile", "--decode-profile"];
const PROMETHEUS_FLAG: &str = "--prometheus";

/// How one flag of Dynamo's planner carries over.
#[derive(Clone, Copy)]
enum Carry {
    /// A value flag of ours, its value checked as `Value` says.
    Value(&'static str, Value),
    /// A switch of ours.
    Switch(&'static str),
    /// No counterpart here: dropped with its value.
    Drop,
}

/// What a carried value must be.
#[derive(Clone, Copy)]
enum Value {
    /// Whole seconds in Dynamo; a duration here.
    Seconds,
    Milliseconds,
    Count,
    Predictor,
}

/// Dynamo's planner flags (`components/planner/src/dynamo/planner/utils/planner_argparse.py`,
/// `create_sla_planner_parser`; `--advisory` from its later `PlannerConfig.advisory`).
const DYNAMO_FLAGS: &[(&str, Carry)] = &[
    (
        "--adjustment-interval",
        Carry::Value("--interval", Value::Seconds),
    ),
    ("--ttft", Carry::Value("--ttft-ms", Value::Milliseconds)),
    ("--itl", Carry::Value("--itl-ms", Value::Milliseconds)),
    (
        "--max-gpu-budget",
        Carry::Value("--max-gpu-budget", Value::Count),
    ),
    (
        "--min-endpoint",
        Carry::Value("--min-endpoint", Value::Count),
    ),
    (
        "--prefill-engine-num-gpu",
        Carry::Value("--prefill-gpus", Value::Count),
    ),
    (
        "--decode-engine-num-gpu",
        Carry::Value("--decode-gpus", Value::Count),
    ),
    (
        "--load-predictor",
        Carry::Value("--predictor", Value::Predictor),
    ),
    ("--no-operation", Carry::Switch("--advisory")),
    ("--advisory", Carry::Switch("--advisory")),
    ("--no-correction", Carry::Switch("--no-correction")),
    // The connector: ours follows `--graph` / `--admin-url`.
    ("--environment", Carry::Drop),
    // The engine: the planner reads its replicas and metrics whatever it is.
    ("--backend", Carry::Drop),
    // Dynamo's runtime namespace, not a Kubernetes one.
    ("--namespace", Carry::Drop),
    ("--log-dir", Carry::Drop),
    // Profiling results as NPZ interpolation tables; ours is a JSON profile (`--profile`).
    ("--profile-results-dir", Carry::Drop),
    // Prophet's window; prophet has no counterpart here.
    ("--load-prediction-window-size", Carry::Drop),
    // Its metrics port; ours listens where the pod's `metrics` port is.
    ("--prometheus-port", Carry::Drop),
    // The graph's shape and the workload's lengths: read from the graph and Prometheus.
    ("--mode", Carry::Drop),
    ("--isl", Carry::Drop),
    ("--osl", Carry::Drop),
];

/// Dynamo's planner flags as ours, in the order written.
fn from_dynamo(service: &str, args: &[String]) -> Result<Vec<String>, PlannerWiringError> {
    let mut out = Vec::new();
    let mut words = args.iter();
    while let Some(word) = words.next() {
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
            _ => (word.as_str(), None),
        };
        let Some((_, carry)) = DYNAMO_FLAGS.iter().find(|(f, _)| *f == flag) else {
            return Err(PlannerWiringError::UnknownFlag {
                service: service.into(),
                flag: flag.into(),
            });
        };
        match *carry {
            Carry::Switch(ours) => {
                // Dynamo's `--no-operation` and `--advisory` are one switch here.
                if !out.iter().any(|w| w == ours) {
                    out.push(ours.into());
                }
            }
            Carry::Drop => {
                if inline.is_none() {
                    words.next();
                }
            }
            Carry::Value(ours, kind) => {
                let bad = |value: &str, problem: String| PlannerWiringError::BadValue {
                    service: service.into(),
                    flag: flag.into(),
                    value: value.into(),
                    problem,
                };
                let Some(value) = inline.or_else(|| words.next().cloned()) else {
                    return Err(bad("", "the flag takes a value".into()));
                };
                out.extend([
                    ours.into(),
                    carried(kind, &value).map_err(|p| bad(&value, p))?,
                ]);
            }
        }
    }
    Ok(out)
}

/// A Dynamo value as ours takes it, or what is wrong with it.
fn carried(kind: Value, value: &str) -> Result<String, String> {
    let number = || {
        value
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0)
    };
    match kind {
        Value::Seconds => number()
            .map(|s| format!("{s}s"))
            .ok_or_else(|| "not a positive number of seconds".into()),
        Value::Milliseconds => number()
            .map(|ms| ms.to_string())
            .ok_or_else(|| "not a positive number of milliseconds".into()),
        Value::Count => value
            .trim()
            .parse::<u32>()
            .map(|n| n.to_string())
            .map_err(|_| "not a whole number".into()),
        Value::Predictor => value
            .trim()
            .parse::<PredictorConfig>()
            .map(|_| value.trim().to_string())
            .map_err(|e| e.to_string()),
    }
}

/// The command's words; a shell's `-c` script of plain words (Dynamo's manifests write
/// `command: [/bin/sh, -c]`, `args: ["python3 -m planner_sla --flag=value ..."]`) is split
/// into them. A script with anything a shell would interpret stays as written.
fn command_words(command: &[String]) -> Vec<String> {
    let words: Vec<&str> = command.iter().map(String::as_str).collect();
    if let [shell, "-c", script] = words.as_slice()
        && matches!(shell.rsplit('/').next(), Some("sh" | "bash"))
        && !script.contains(|c: char| "\"'`$\\;&|<>(){}*?#~".contains(c))
    {
        return script.split_whitespace().map(str::to_owned).collect();
    }
    command.to_vec()
}

/// clap's message without its usage: the first paragraph, on one line (a missing
/// argument is named on the line after "required arguments were not provided:").
fn first_paragraph(message: &str) -> String {
    let text = message
        .lines()
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ");
    text.strip_prefix("error: ").unwrap_or(&text).to_string()
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_planner_command_line_may_ask_for_json_logs() {
        let words = ["planner", "--admin-url", "http://a", "--log-format", "json"];
        assert!(parse(&words).is_ok());
        let bad = ["planner", "--admin-url", "http://a", "--log-format", "xml"];
        assert!(
            parse(&bad)
                .unwrap_err()
                .to_string()
                .contains("--log-format")
        );
    }

    fn service(yaml: &str) -> ComponentSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn inputs<'a>(target: PlannerTarget<'a>) -> PlannerInputs<'a> {
        PlannerInputs {
            target,
            prometheus: None,
            metrics_addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 9090),
            profile: None,
        }
    }

    fn args(yaml: &str, inputs: &PlannerInputs) -> Result<Vec<String>, PlannerWiringError> {
        planner_args("Planner", &service(yaml), inputs)
    }

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn dynamos_launcher_flags_carry_over_and_the_rest_is_dropped() {
        // Dynamo's disagg_planner.yaml form: a shell script of plain words.
        let yaml = r#"
componentType: planner
extraPodSpec:
  mainContainer:
    command: [/bin/sh, -c]
    args: ["python3 -m planner_sla --environment=kubernetes --backend=vllm --adjustment-interval=60 --profile-results-dir=/data/profiling_results --ttft 200 --itl 20.5 --max-gpu-budget 16 --min-endpoint 2 --prefill-engine-num-gpu 2 --decode-engine-num-gpu 4 --load-predictor kalman --no-operation --no-correction --prometheus-port 9085 --namespace dynamo"]
"#;
        let out = args(yaml, &inputs(PlannerTarget::Graph("g"))).unwrap();
        assert_eq!(
            out,
            words(
                "planner --mode load --interval 60s --ttft-ms 200 --itl-ms 20.5 \
                 --max-gpu-budget 16 --min-endpoint 2 --prefill-gpus 2 --decode-gpus 4 --predictor kalman \
                 --advisory --no-correction --graph g --metrics-addr 0.0.0.0:9090"
            )
        );
        let parsed = parse(&out).unwrap();
        assert_eq!(parsed.mode, ModeArg::Load);
        assert_eq!(parsed.interval, Some(Duration::from_secs(60)));
        assert_eq!((parsed.ttft_ms, parsed.itl_ms), (200.0, 20.5));
        assert_eq!((parsed.prefill_gpus, parsed.decode_gpus), (2, 4));
        assert_eq!((parsed.max_gpu_budget, parsed.min_endpoint), (16, 2));
        assert!(parsed.advisory && parsed.no_correction);
        assert_eq!(parsed.graph.as_deref(), Some("g"));
        assert_eq!(parsed.admin_url, None);

        // The newer module, as an exec-form command.
        let yaml = "
extraPodSpec:
  mainContainer:
    command: [python, -m, dynamo.planner]
    args: [--advisory, --itl=30]
";
        let out = args(yaml, &inputs(PlannerTarget::Graph("g"))).unwrap();
        assert_eq!(
            out,
            words(
                "planner --mode load --advisory --itl-ms 30 --graph g \
                 --metrics-addr 0.0.0.0:9090"
            )
        );
        // With a profile (the local runner's mock engine's), throughput mode as Dynamo's SLA
        // planner.
        let profile = Path::new("/run/profile.json");
        let with_profile = PlannerInputs {
            profile: Some(profile),
            ..inputs(PlannerTarget::Graph("g"))
        };
        let out = args(yaml, &with_profile).unwrap();
        assert_eq!(parse(&out).unwrap().mode, ModeArg::Throughput);
    }

    #[test]
    fn our_own_flags_are_kept_and_the_rendering_owns_target_metrics_and_profile() {
        let yaml = "
componentType: planner
extraPodSpec:
  mainContainer:
    command: [/usr/local/bin/dynamo, planner]
    args: [--mode, load, --graph, other, --metrics-addr, '0.0.0.0:1', --profile, /p.json,
           --prometheus, 'http://mine:9090', --namespace, elsewhere]
";
        let at = inputs(PlannerTarget::Admin("http://127.0.0.1:7000"));
        let out = args(yaml, &at).unwrap();
        assert_eq!(
            out,
            words(
                "planner --mode load --profile /p.json --prometheus http://mine:9090 \
                 --admin-url http://127.0.0.1:7000 --metrics-addr 0.0.0.0:9090"
            )
        );
        let parsed = parse(&out).unwrap();
        assert_eq!(parsed.admin_url.as_deref(), Some("http://127.0.0.1:7000"));
        assert_eq!((parsed.graph, parsed.namespace), (None, None));

        let profile = Path::new("/run/mocker-profile.json");
        let at = PlannerInputs {
            prometheus: Some("http://127.0.0.1:9091"),
            profile: Some(profile),
            ..at
        };
        let out = args(yaml, &at).unwrap();
        assert_eq!(
            out,
            words(
                "planner --mode load --admin-url http://127.0.0.1:7000 \
                 --prometheus http://127.0.0.1:9091 --metrics-addr 0.0.0.0:9090 \
                 --profile /run/mocker-profile.json"
            )
        );
        assert_eq!(parse(&out).unwrap().profile.as_deref(), Some(profile));

        // No command at all: our planner with its defaults.
        let out = args("componentType: planner", &inputs(PlannerTarget::Graph("g"))).unwrap();
        assert_eq!(out, words("planner --graph g --metrics-addr 0.0.0.0:9090"));
    }

    #[test]
    fn bad_values_and_unknown_flags_name_the_flag_to_change() {
        let dynamo = |flags: &str| {
            let spec = serde_json::json!({"extraPodSpec": {"mainContainer": {
                "command": ["python3", "-m", "planner_sla"],
                "args": flags.split_whitespace().collect::<Vec<_>>(),
            }}});
            args(&spec.to_string(), &inputs(PlannerTarget::Graph("g"))).unwrap_err()
        };
        let e = dynamo("--ttft abc");
        assert_eq!(
            e,
            PlannerWiringError::BadValue {
                service: "Planner".into(),
                flag: "--ttft".into(),
                value: "abc".into(),
                problem: "not a positive number of milliseconds".into(),
            }
        );
        assert_eq!(
            e.to_string(),
            "spec.services.Planner: --ttft \"abc\": not a positive number of milliseconds"
        );
        assert!(matches!(
            dynamo("--adjustment-interval=-5"),
            PlannerWiringError::BadValue { .. }
        ));
        assert!(matches!(
            dynamo("--max-gpu-budget 1.5"),
            PlannerWiringError::BadValue { .. }
        ));
        let prophet = dynamo("--load-predictor prophet").to_string();
        assert!(prophet.contains("--load-predictor"), "{prophet}");
        assert!(matches!(
            dynamo("--ttft"),
            PlannerWiringError::BadValue { value, .. } if value.is_empty()
        ));
        assert_eq!(
            dynamo("--frobnicate 1"),
            PlannerWiringError::UnknownFlag {
                service: "Planner".into(),
                flag: "--frobnicate".into()
            }
        );

        // Our own flags go through the planner's own parser.
        let ours = args(
            "extraPodSpec: {mainContainer: {command: [dynamo, planner, --ttft-ms, abc]}}",
            &inputs(PlannerTarget::Graph("g")),
        )
        .unwrap_err();
        let PlannerWiringError::Refused { message, .. } = &ours else {
            panic!("{ours:?}");
        };
        assert!(message.contains("--ttft-ms"), "{message}");
        assert!(ours.to_string().starts_with("spec.services.Planner: "));
    }

    #[test]
    fn only_ours_in_throughput_mode_needs_a_profile_and_dynamos_takes_one() {
        let need = |yaml: &str| profile_need("Planner", &service(yaml));
        let ours = |args: &str| {
            let spec = serde_json::json!({"extraPodSpec": {"mainContainer": {
                "command": ["dynamo", "planner"],
                "args": args.split_whitespace().collect::<Vec<_>>(),
            }}});
            need(&spec.to_string())
        };
        assert_eq!(need("componentType: planner"), Ok(ProfileNeed::Required));
        assert_eq!(ours("--interval 10s"), Ok(ProfileNeed::Required));
        assert_eq!(ours("--mode throughput"), Ok(ProfileNeed::Required));
        assert_eq!(ours("--mode load"), Ok(ProfileNeed::Unneeded));
        for own in ["--profile /p", "--prefill-profile /p --decode-profile /d"] {
            assert_eq!(ours(own), Ok(ProfileNeed::Unneeded), "{own}");
        }
        let dynamos = "extraPodSpec: {mainContainer: {command: [python3, -m, planner_sla], \
                       args: [--adjustment-interval, '60', --mode, disagg]}}";
        assert_eq!(need(dynamos), Ok(ProfileNeed::Optional));
        // The errors of the rendering itself.
        assert!(matches!(
            ours("--ttft-ms abc"),
            Err(PlannerWiringError::Refused { .. })
        ));
        let custom = "extraPodSpec: {mainContainer: {command: [python3, my_planner.py]}}";
        assert!(matches!(
            need(custom),
            Err(PlannerWiringError::Custom { .. })
        ));
    }

    #[test]
    fn prometheus_access_flags_are_kept_and_checked() {
        let spec = |args: &str| {
            serde_json::json!({"extraPodSpec": {"mainContainer": {
                "command": ["dynamo", "planner"],
                "args": args.split_whitespace().collect::<Vec<_>>(),
            }}})
            .to_string()
        };
        let flags = "--mode load --prometheus https://thanos-querier.openshift-monitoring.svc:9091 \
                     --prometheus-ca-file /ca.crt --prometheus-bearer-token-file /token";
        let out = args(&spec(flags), &inputs(PlannerTarget::Graph("g"))).unwrap();
        let access = parse(&out).unwrap().prometheus_access;
        assert_eq!(access.ca_file.as_deref(), Some(Path::new("/ca.crt")));
        assert_eq!(
            access.bearer_token_file.as_deref(),
            Some(Path::new("/token"))
        );

        // One kind of credentials, and basic authentication's two halves together.
        for bad in [
            "--prometheus-bearer-token-file /t --prometheus-basic-auth-user u \
             --prometheus-basic-auth-password-file /p",
            "--prometheus-basic-auth-user u",
            "--prometheus-cert-file /c",
            "--prometheus-ca-file /ca --prometheus-insecure-skip-verify",
        ] {
            let e = args(&spec(bad), &inputs(PlannerTarget::Graph("g"))).unwrap_err();
            assert!(
                matches!(&e, PlannerWiringError::Refused { message, .. } if message.contains("--prometheus-")),
                "{bad}: {e:?}"
            );
        }
    }

    #[test]
    fn another_command_runs_as_written() {
        for command in [
            vec!["python3", "my_planner.py"],
            vec!["/bin/sh", "-c", "cd /w && python3 -m planner_sla"],
            vec!["dynamo", "run"],
        ] {
            let spec = serde_json::json!({"extraPodSpec": {"mainContainer": {"command": command}}});
            let yaml = spec.to_string();
            let e = args(&yaml, &inputs(PlannerTarget::Graph("g"))).unwrap_err();
            assert!(
                matches!(e, PlannerWiringError::Custom { .. }),
                "{command:?}: {e:?}"
            );
        }
    }
}
