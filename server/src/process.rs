//! What every binary's `main` does around its servers: its logging, its arguments, its
//! shutdown.

use std::ffi::{OsStr, OsString};
use std::process::ExitCode;

use clap::{Command, Parser};

/// Resolves on Ctrl-C or SIGTERM (what Kubernetes sends before it kills a container).
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// [`shutdown_signal`], then a log line saying so: what the operator, the planner and the
/// local runner wait on.
pub async fn logged_shutdown_signal() {
    shutdown_signal().await;
    tracing::info!("shutting down");
}

/// How log lines are written.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (the `message`
    /// and the event's fields) and, inside spans, `span` and `spans`.
    Json,
}

/// Dynamo's switch for JSON lines: on when set to 1, true, on or yes, in any case
/// (`jsonl_logging_enabled` and `is_truthy` in Dynamo's `lib/runtime/src/config.rs`).
pub const DYNAMO_JSONL_ENV: &str = "DYN_LOGGING_JSONL";
/// Our variable of `--log-format`.
pub const LOG_FORMAT_ENV: &str = "DYNAMO_LOG_FORMAT";
/// The variables that choose the log format: a service's sidecar takes them from the
/// service's environment (the operator and `dynamo run`).
pub const LOG_FORMAT_ENVS: [&str; 2] = [LOG_FORMAT_ENV, DYNAMO_JSONL_ENV];

/// The logging flags of every binary, flattened into its arguments.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct LogArgs {
    /// Log line format: text, or json (one object per line) [default: text, or json when
    /// Dynamo's DYN_LOGGING_JSONL is 1/true/on/yes]. Levels come from RUST_LOG.
    #[arg(long, env = LOG_FORMAT_ENV, value_enum, global = true)]
    pub log_format: Option<LogFormat>,
}

impl LogArgs {
    /// `--log-format` (or `DYNAMO_LOG_FORMAT`), else what `DYN_LOGGING_JSONL` says.
    pub fn format(&self) -> LogFormat {
        self.format_given(std::env::var(DYNAMO_JSONL_ENV).ok().as_deref())
    }

    fn format_given(&self, dynamo_jsonl: Option<&str>) -> LogFormat {
        let truthy =
            |v: &str| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "on" | "yes");
        match (self.log_format, dynamo_jsonl) {
            (Some(format), _) => format,
            (None, Some(v)) if truthy(v) => LogFormat::Json,
            (None, _) => LogFormat::Text,
        }
    }
}

/// Logs to stderr in `args`' format, filtered by `RUST_LOG` (default `info`): stdout is
/// what a command makes (`dynamo profile`'s graph, `dynamo run`'s table), and Dynamo's
/// processes log to stderr too.
pub fn init_logging(args: &LogArgs) {
    let logs = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        );
    match args.format() {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().init(),
    }
}

/// The exit code of a `main` whose work ended with `result`. A fatal error is the last log
/// line in JSON mode, so that every line parses; else `error: ...` on stderr.
pub fn exit_code<E: std::fmt::Display>(log: &LogArgs, result: Result<(), E>) -> ExitCode {
    let Err(err) = result else {
        return ExitCode::SUCCESS;
    };
    match log.format() {
        LogFormat::Json => tracing::error!("{err:#}"),
        LogFormat::Text => eprintln!("error: {err:#}"),
    }
    ExitCode::FAILURE
}

/// Parses a binary's arguments, also taking Dynamo's names for our variables: each
/// `(ours, dynamo)` pair lets Dynamo's variable stand in for ours (see
/// [`with_env_aliases`]).
pub fn parse_args<T: Parser>(env_aliases: &[(&str, &str)]) -> T {
    let mut command = with_env_aliases(T::command(), env_aliases, |name| std::env::var_os(name));
    let matches = command.clone().get_matches();
    T::from_arg_matches(&matches)
        .map_err(|e| e.format(&mut command))
        .unwrap_or_else(|e| e.exit())
}

/// `command` with the argument that reads each pair's `ours` defaulting to `var(dynamo)`
/// when that is set and `var(ours)` is not: a flag wins, then our variable, then Dynamo's
/// (the first listed, when several name one argument), then the default. clap reads one
/// variable per argument; this is the second. Panics when no argument reads `ours`.
pub fn with_env_aliases(
    mut command: Command,
    env_aliases: &[(&str, &str)],
    var: impl Fn(&str) -> Option<OsString>,
) -> Command {
    let mut taken = Vec::new();
    for &(ours, dynamo) in env_aliases {
        let id = command
            .get_arguments()
            .find(|arg| arg.get_env() == Some(OsStr::new(ours)))
            .unwrap_or_else(|| panic!("no argument reads {ours} (Dynamo's {dynamo})"))
            .get_id()
            .clone();
        if var(ours).is_some() || taken.contains(&id) {
            continue;
        }
        if let Some(value) = var(dynamo) {
            command = command.mut_arg(&id, |arg| arg.default_value(value));
            taken.push(id);
        }
    }
    command
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

    use super::*;

    #[derive(Parser, Debug)]
    struct Probe {
        #[arg(
            long,
            alias = "kv-cache-block-size",
            env = "OURS_BLOCK_SIZE",
            default_value_t = 16
        )]
        block_size: usize,
        #[arg(long, env = "OURS_TEMPERATURE")]
        temperature: Option<f64>,
        #[command(flatten)]
        log: LogArgs,
    }

    fn probe(argv: &[&str], env: &[(&str, &str)]) -> Result<Probe, clap::Error> {
        let aliases = [
            ("OURS_BLOCK_SIZE", "THEIRS_BLOCK_SIZE"),
            ("OURS_BLOCK_SIZE", "THEIRS_OLD_BLOCK_SIZE"),
            ("OURS_TEMPERATURE", "THEIRS_TEMPERATURE"),
        ];
        let var = |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        };
        let matches = with_env_aliases(Probe::command(), &aliases, var)
            .try_get_matches_from(std::iter::once("probe").chain(argv.iter().copied()))?;
        Probe::from_arg_matches(&matches)
    }

    #[test]
    fn dynamos_variable_stands_in_for_ours_and_a_flag_or_ours_wins() {
        let p = probe(
            &[],
            &[("THEIRS_BLOCK_SIZE", "32"), ("THEIRS_TEMPERATURE", "0.5")],
        );
        let p = p.unwrap();
        assert_eq!((p.block_size, p.temperature), (32, Some(0.5)));
        let flag = probe(&["--block-size", "64"], &[("THEIRS_BLOCK_SIZE", "32")]);
        assert_eq!(flag.unwrap().block_size, 64);
        let alias = probe(&["--kv-cache-block-size", "8"], &[]).unwrap();
        assert_eq!(alias.block_size, 8);
        // Ours set: Dynamo's is not used (clap then reads ours from the real environment,
        // where the test leaves it unset, so the default shows).
        let ours = probe(
            &[],
            &[("OURS_BLOCK_SIZE", "48"), ("THEIRS_BLOCK_SIZE", "32")],
        );
        assert_eq!(ours.unwrap().block_size, 16);
        let first = probe(
            &[],
            &[("THEIRS_OLD_BLOCK_SIZE", "4"), ("THEIRS_BLOCK_SIZE", "32")],
        );
        assert_eq!(first.unwrap().block_size, 32, "the first alias listed wins");
        let none = probe(&[], &[]).unwrap();
        assert_eq!((none.block_size, none.temperature), (16, None));
    }

    #[test]
    fn a_bad_value_in_dynamos_variable_is_refused_with_the_flag() {
        let e = probe(&[], &[("THEIRS_BLOCK_SIZE", "big")]).unwrap_err();
        assert!(e.to_string().contains("--block-size"), "{e}");
    }

    #[test]
    #[should_panic(expected = "no argument reads OURS_NOTHING")]
    fn an_alias_of_no_argument_is_a_programming_error() {
        with_env_aliases(
            Probe::command(),
            &[("OURS_NOTHING", "THEIRS_NOTHING")],
            |_| None,
        );
    }

    #[test]
    fn the_log_format_is_the_flag_else_dynamos_jsonl_switch() {
        let format =
            |argv: &[&str], jsonl: Option<&str>| probe(argv, &[]).unwrap().log.format_given(jsonl);
        assert_eq!(format(&[], None), LogFormat::Text);
        for on in ["1", "true", "TRUE", "on", "yes"] {
            assert_eq!(format(&[], Some(on)), LogFormat::Json, "{on}");
        }
        for off in ["0", "false", "", "json"] {
            assert_eq!(format(&[], Some(off)), LogFormat::Text, "{off}");
        }
        assert_eq!(format(&["--log-format", "json"], None), LogFormat::Json);
        assert_eq!(
            format(&["--log-format", "text"], Some("1")),
            LogFormat::Text
        );
        let e = probe(&["--log-format", "xml"], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("--log-format") && e.contains("json"), "{e}");
    }
}
