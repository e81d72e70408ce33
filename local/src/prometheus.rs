//! The Prometheus a local graph with a planner gets (`DESIGN.md`, "Local runner"): the
//! planner reads the picker's `dynamo_frontend_*` series through Prometheus' query API on
//! a cluster, so it does locally too, from a real `prometheus` (Debian's package) that
//! scrapes what a cluster's PodMonitor scrapes: the picker and every replica's sidecar,
//! with the same `dynamo_graph` / `dynamo_component` labels
//! (charts/dynamo-platform/templates/podmonitor.yaml), and the planner itself.
//!
//! Everything lives in the run's state directory: the config, the target list that the
//! runner rewrites whenever its processes change, and the TSDB.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use super::plan::CommandSpec;

/// The program, looked up on PATH (after the runner's own binaries).
pub const PROGRAM: &str = "prometheus";

/// How often every target is scraped. The planner's throughput reads are
/// `increase(m[I])` over its interval I, and Prometheus extrapolates an increase from the
/// samples inside the window, at least two of them
/// (https://prometheus.io/docs/prometheus/latest/querying/functions/#increase). Local
/// graphs plan every few seconds so a planner reacts within 30 s, which needs a sample
/// every second; loopback scrapes of a handful of processes cost next to nothing.
const SCRAPE_INTERVAL: &str = "1s";

/// How long a run keeps samples: the planner looks back one interval, a person looking at
/// a demo a few hours; the state directory goes away with the run anyway.
const RETENTION: &str = "6h";

/// One process Prometheus scrapes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScrapeTarget {
    /// `host:port` of its `/metrics`.
    pub address: String,
    /// The graph's service it belongs to (`dynamo_component`).
    pub component: String,
    /// What it is (`dynamo_role`): `epp`, `planner`, or the engine role of a sidecar's
    /// replica (`aggregated`, `prefill`, `decode`).
    pub role: String,
}

/// The runner's Prometheus: where its files are and where it listens.
#[derive(Clone, Debug)]
pub struct LocalPrometheus {
    dir: PathBuf,
    port: u16,
    graph: String,
}

impl LocalPrometheus {
    /// Files under `state_dir/prometheus`, listening on loopback `port`.
    pub fn new(state_dir: &Path, port: u16, graph: &str) -> Self {
        Self {
            dir: state_dir.join("prometheus"),
            port,
            graph: graph.to_owned(),
        }
    }

    /// Its base URL, as the planner's `--prometheus` takes it.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn config_file(&self) -> PathBuf {
        self.dir.join("prometheus.yml")
    }

    pub fn targets_file(&self) -> PathBuf {
        self.dir.join("targets.json")
    }

    /// Writes the config and an empty target list, and returns the command that serves
    /// them. Prometheus is told nothing else, so a user's `/etc/prometheus` plays no part.
    pub fn prepare(&self) -> io::Result<CommandSpec> {
        std::fs::create_dir_all(&self.dir)?;
        std::fs::write(
            self.config_file(),
            serde_json::to_vec_pretty(&config(&self.targets_file()))?,
        )?;
        self.write_targets(&[])?;
        let arg = |flag: &str, value: &Path| format!("--{flag}={}", value.display());
        Ok(CommandSpec {
            program: PROGRAM.into(),
            args: vec![
                arg("config.file", &self.config_file()),
                arg("storage.tsdb.path", &self.dir.join("data")),
                format!("--storage.tsdb.retention.time={RETENTION}"),
                format!("--web.listen-address=127.0.0.1:{}", self.port),
                // Its startup lines would bury the graph's; problems still show.
                "--log.level=warn".into(),
            ],
            env: Vec::new(),
            dirs: Vec::new(),
        })
    }

    /// Replaces the target list in one step (a sibling file, then a rename), so
    /// Prometheus, which watches the file, never reads half of one.
    pub fn write_targets(&self, targets: &[ScrapeTarget]) -> io::Result<()> {
        let path = self.targets_file();
        let partial = path.with_extension("json.partial");
        std::fs::write(
            &partial,
            serde_json::to_vec_pretty(&target_groups(&self.graph, targets))?,
        )?;
        std::fs::rename(&partial, &path)
    }

    /// Whether it answers `/-/ready` (its TSDB is open and it serves queries).
    pub async fn ready(&self, client: &reqwest::Client) -> bool {
        client
            .get(format!("{}/-/ready", self.url()))
            .timeout(Duration::from_secs(1))
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
    }
}

/// The config (JSON is YAML, and it quotes paths for us): one job whose targets come from
/// the file the runner rewrites. Prometheus applies a changed file at once (it watches
/// it); the refresh interval only backs that up.
/// https://prometheus.io/docs/prometheus/latest/configuration/configuration/#file_sd_config
fn config(targets_file: &Path) -> Value {
    json!({
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "scrape_timeout": SCRAPE_INTERVAL,
            "evaluation_interval": SCRAPE_INTERVAL,
        },
        "scrape_configs": [{
            "job_name": "dynamo",
            "metrics_path": "/metrics",
            "file_sd_configs": [{
                "files": [targets_file.to_string_lossy()],
                "refresh_interval": "5s",
            }],
        }],
    })
}

/// The target list in file_sd's format: a group per target with its labels.
fn target_groups(graph: &str, targets: &[ScrapeTarget]) -> Value {
    targets
        .iter()
        .map(|t| {
            json!({
                "targets": [t.address],
                "labels": {
                    "dynamo_graph": graph,
                    "dynamo_component": t.component,
                    "dynamo_role": t.role,
                },
            })
        })
        .collect()
}

/// Why a graph with a planner cannot run here: no `prometheus` to start.
pub fn missing(planner: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "the graph's planner service {planner:?} reads its metrics from Prometheus, and no \
         `{PROGRAM}` is on PATH: install it (Debian and Ubuntu: `apt-get install prometheus`) \
         or run the graph without its planner (`--no-planner`; scale with POST /scale)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_scrapes_the_target_file_every_second() {
        let prometheus = LocalPrometheus::new(Path::new("/run/d"), 9999, "g");
        let config = config(&prometheus.targets_file());
        assert_eq!(config["global"]["scrape_interval"], "1s");
        assert_eq!(
            config["scrape_configs"][0]["file_sd_configs"][0]["files"][0],
            "/run/d/prometheus/targets.json"
        );
        assert_eq!(prometheus.url(), "http://127.0.0.1:9999");
    }

    #[test]
    fn targets_carry_the_graph_component_and_role() {
        let targets = [
            ScrapeTarget {
                address: "127.0.0.1:8000".into(),
                component: "epp".into(),
                role: "epp".into(),
            },
            ScrapeTarget {
                address: "127.0.0.1:41005".into(),
                component: "worker".into(),
                role: "aggregated".into(),
            },
        ];
        assert_eq!(
            target_groups("agg", &targets),
            json!([
                {"targets": ["127.0.0.1:8000"],
                 "labels": {"dynamo_graph": "agg", "dynamo_component": "epp", "dynamo_role": "epp"}},
                {"targets": ["127.0.0.1:41005"],
                 "labels": {"dynamo_graph": "agg", "dynamo_component": "worker", "dynamo_role": "aggregated"}},
            ])
        );
    }

    /// The real `promtool` accepts what the runner writes, the target file included.
    #[test]
    fn promtool_accepts_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let prometheus = LocalPrometheus::new(dir.path(), 9999, "g");
        let command = prometheus.prepare().unwrap();
        prometheus
            .write_targets(&[ScrapeTarget {
                address: "127.0.0.1:8000".into(),
                component: "epp".into(),
                role: "epp".into(),
            }])
            .unwrap();
        assert!(
            !prometheus
                .targets_file()
                .with_extension("json.partial")
                .exists()
        );
        assert!(command.args.contains(&format!(
            "--config.file={}",
            prometheus.config_file().display()
        )));
        let out = std::process::Command::new("promtool")
            .args(["check", "config"])
            .arg(prometheus.config_file())
            .output()
            .expect("promtool (Debian's prometheus package) is installed");
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
