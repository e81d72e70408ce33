//! `dynamo`: one binary, each subcommand from the library that owns it: the controllers
//! and the offline CRD and manifest commands (`dynamo-operator`), the local runner
//! (`dynamo-local`), the planner service (`dynamo-planner-service`) and the DGDR profiler
//! (`dynamo-profiler-cli`).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "dynamo",
    version,
    about = "Distributed LLM inference on Kubernetes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Every subcommand's (`dynamo operator --log-format json`, or before the subcommand).
    #[command(flatten)]
    log: dynamo_server::LogArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Write the CRD YAML (crds/manifests/, the Helm chart's crds/) and docs/api.md from the types.
    Crds {
        /// Repository root to write under.
        #[arg(long, default_value = ".")]
        root: PathBuf,
    },
    /// Check manifests against the CRD schemas and CEL rules, as the API server would.
    Validate {
        /// YAML files, each with one or more documents.
        #[arg(short = 'f', long = "file", required = true, num_args = 1..)]
        files: Vec<PathBuf>,
    },
    /// Run a DynamoGraphDeployment on this machine as processes (engines, sidecars, the
    /// endpoint picker with its OpenAI frontend).
    Run(dynamo_local::RunArgs),
    /// Run the Kubernetes controllers (DynamoGraphDeployment, scaling adapters).
    Operator(dynamo_operator::controller::OperatorArgs),
    /// Run the SLA planner: replicas from Prometheus' traffic and latencies, written to the
    /// graph's scaling adapters (or a local graph's admin API).
    Planner(dynamo_wiring::planner::PlannerArgs),
    /// Profile a DynamoGraphDeploymentRequest offline: the generated graph on stdout, the
    /// predictions and the Pareto table on stderr.
    Profile(dynamo_profiler_cli::ProfileArgs),
    /// Our vLLM KV connector to the sidecar's tiers (docs/vllm-connector.md).
    #[command(subcommand)]
    Connector(dynamo_wiring::connector::ConnectorCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    dynamo_server::init_logging(&cli.log);
    let result = match cli.command {
        Command::Crds { root } => dynamo_operator::crdgen::write_all(&root),
        Command::Validate { files } => dynamo_operator::validate::run(&files),
        Command::Run(args) => dynamo_local::run(args).map(|()| ExitCode::SUCCESS),
        Command::Operator(args) => {
            dynamo_operator::controller::run(args).map(|()| ExitCode::SUCCESS)
        }
        Command::Planner(args) => dynamo_planner_service::run(args).map(|()| ExitCode::SUCCESS),
        Command::Profile(args) => dynamo_profiler_cli::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Connector(command) => dynamo_wiring::connector::run(command)
            .map(|()| ExitCode::SUCCESS)
            .map_err(|e| anyhow::anyhow!("the connector's package: {e}")),
    };
    match result {
        Ok(code) => code,
        Err(err) => dynamo_server::exit_code(&cli.log, Err(err)),
    }
}
