//! charts/dynamo-platform/files/monitoring/ (the chart's PrometheusRule and Grafana
//! dashboard ConfigMap render these files): the Prometheus rules pass the real `promtool`
//! (syntax and their unit tests), and the Grafana dashboard and the rules query only metrics the code base
//! exports: each family they may use is listed here by its constant in `dynamo_names`,
//! and the source file that registers it is checked to register it under that constant.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use dynamo_names::metrics::{frontend, planner};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the e2e crate sits in the workspace")
        .to_owned()
}

fn monitoring(file: &str) -> PathBuf {
    repo()
        .join("charts/dynamo-platform/files/monitoring")
        .join(file)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// A metric family the dashboard and rules may query.
struct Family {
    /// The family's name as registered, without the suffixes of its kind.
    name: &'static str,
    kind: Kind,
    /// Its constant in `dynamo_names::metrics`, as the registering source names it.
    constant: &'static str,
    /// The file that registers it, from the repository root.
    source: &'static str,
}

const EPP: &str = "epp/src/metrics.rs";
const PLANNER: &str = "planner-service/src/metrics.rs";

macro_rules! family {
    ($module:ident::$constant:ident, $kind:ident, $source:expr) => {
        Family {
            name: $module::$constant,
            kind: Kind::$kind,
            constant: concat!(stringify!($module), "::", stringify!($constant)),
            source: $source,
        }
    };
}

const FAMILIES: &[Family] = &[
    family!(frontend::REQUESTS, Counter, EPP),
    family!(frontend::INFLIGHT_REQUESTS, Gauge, EPP),
    family!(frontend::QUEUED_REQUESTS, Gauge, EPP),
    family!(frontend::TIME_TO_FIRST_TOKEN, Histogram, EPP),
    family!(frontend::INTER_TOKEN_LATENCY, Histogram, EPP),
    family!(frontend::INPUT_SEQUENCE_TOKENS, Histogram, EPP),
    family!(frontend::OUTPUT_SEQUENCE_TOKENS, Histogram, EPP),
    family!(frontend::WORKER_ACTIVE_PREFILL_TOKENS, Gauge, EPP),
    family!(frontend::WORKER_ACTIVE_DECODE_BLOCKS, Gauge, EPP),
    family!(frontend::PROMPT_BLOCKS, Counter, EPP),
    family!(frontend::MATCHED_BLOCKS, Counter, EPP),
    family!(frontend::KV_HIT_RATIO, Histogram, EPP),
    family!(frontend::ENGINE_KV_USAGE, Gauge, EPP),
    family!(frontend::ENGINE_KV_BLOCKS, Gauge, EPP),
    family!(planner::TARGET_TTFT, Gauge, PLANNER),
    family!(planner::TARGET_ITL, Gauge, PLANNER),
    family!(planner::REPLICAS, Gauge, PLANNER),
    family!(planner::DESIRED_REPLICAS, Gauge, PLANNER),
    family!(planner::DECISIONS, Counter, PLANNER),
    family!(planner::SCALE_WRITES, Counter, PLANNER),
    family!(planner::CAPPED, Gauge, PLANNER),
    family!(planner::PREDICTED_REQUESTS, Gauge, PLANNER),
    family!(planner::PREDICTED_ISL, Gauge, PLANNER),
    family!(planner::PREDICTED_OSL, Gauge, PLANNER),
    family!(planner::OBSERVED_TTFT, Gauge, PLANNER),
    family!(planner::OBSERVED_ITL, Gauge, PLANNER),
];

/// Prometheus' own series, which no code of ours exports.
const PROMETHEUS_SERIES: &[&str] = &["up"];

impl Family {
    /// The series names a query may use (prometheus-client's suffixes).
    fn series(&self) -> Vec<String> {
        let suffixes: &[&str] = match self.kind {
            Kind::Counter => &["_total"],
            Kind::Gauge => &[""],
            Kind::Histogram => &["_bucket", "_sum", "_count"],
        };
        suffixes
            .iter()
            .map(|s| format!("{}{s}", self.name))
            .collect()
    }
}

fn allowed() -> BTreeSet<String> {
    FAMILIES
        .iter()
        .flat_map(Family::series)
        .chain(PROMETHEUS_SERIES.iter().map(|s| s.to_string()))
        .collect()
}

/// PromQL functions, aggregations and keywords the configs use; an unknown word followed
/// by `(` fails the test, so a misspelt function cannot pass for a metric.
const FUNCTIONS: &[&str] = &[
    "sum",
    "avg",
    "max",
    "min",
    "count",
    "rate",
    "increase",
    "histogram_quantile",
    "vector",
    "scalar",
    "clamp_min",
    "absent",
];
const KEYWORDS: &[&str] = &["and", "or", "unless", "bool", "offset"];
/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Skips from an opening `open` at `i` to just after its matching `close`, passing
/// over quoted strings.
fn skip_group(chars: &[char], mut i: usize, open: char, close: char) -> usize {
    let mut depth = 0;
    while i < chars.len() {
        match chars[i] {
            '"' | '\'' | '`' => i = skip_string(chars, i) - 1,
            c if c == open => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    panic!(
        "unbalanced {open}{close} in {}",
        chars.iter().collect::<String>()
    );
}

/// Skips the quoted string starting at `i`, to just after its closing quote.
fn skip_string(chars: &[char], i: usize) -> usize {
    let quote = chars[i];
    let mut j = i + 1;
    while j < chars.len() && chars[j] != quote {
        if chars[j] == '\\' {
            j += 1;
        }
        j += 1;
    }
    j + 1
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The metric names a PromQL expression (with Grafana variables) selects.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            i = skip_string(&chars, i);
        } else if c == '{' {
            // Label matchers.
            i = skip_group(&chars, i, '{', '}');
        } else if c == '[' {
            // Ranges and subqueries: `[5m]`, `[$__rate_interval]`.
            i = skip_group(&chars, i, '[', ']');
        } else if c == '$' {
            // A Grafana variable: `$model`, `${model}`.
            i += 1;
            if chars.get(i) == Some(&'{') {
                i = skip_group(&chars, i, '{', '}');
            }
            while i < chars.len() && is_word(chars[i]) {
                i += 1;
            }
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            // Numbers and durations.
            while i < chars.len() && (is_word(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && is_word(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let call = chars.get(next) == Some(&'(');
            if LABEL_LISTS.contains(&word.as_str()) {
                if call {
                    i = skip_group(&chars, next, '(', ')');
                }
            } else if FUNCTIONS.contains(&word.as_str()) || KEYWORDS.contains(&word.as_str()) {
            } else if call {
                panic!(
                    "unknown PromQL function {word:?} in {expr:?}: add it to FUNCTIONS if it is one"
                );
            } else {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

fn promtool(args: &[&str]) {
    let dir = monitoring("");
    let output = Command::new("promtool")
        .args(args)
        .current_dir(&dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): install Prometheus' promtool (Debian/Ubuntu package \
                 `prometheus`, or the release tarball) on PATH; CI installs it"
            )
        });
    assert!(
        output.status.success(),
        "promtool {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_rules_pass_promtool_and_their_unit_tests() {
    promtool(&["check", "rules", "prometheus-rules.yaml"]);
    promtool(&["test", "rules", "prometheus-rules.test.yaml"]);
}

#[test]
fn every_listed_family_is_registered_by_its_source() {
    for family in FAMILIES {
        let source = read(&repo().join(family.source));
        let registers = format!("{},\n", family.constant);
        assert!(
            source.contains(&registers),
            "{} does not register {} ({})",
            family.source,
            family.constant,
            family.name
        );
    }
}

/// Every `expr:` of a rule file (one line, or a `|` / `>` block), and every `record:`.
fn rule_exprs(text: &str) -> (Vec<String>, BTreeSet<String>) {
    let lines: Vec<&str> = text.lines().collect();
    let (mut exprs, mut records) = (Vec::new(), BTreeSet::new());
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start().trim_start_matches("- ");
        let indent = line.len() - line.trim_start().len();
        if let Some(name) = trimmed.strip_prefix("record:") {
            records.insert(name.trim().to_owned());
        } else if let Some(value) = trimmed.strip_prefix("expr:") {
            let value = value.trim();
            if value.starts_with('|') || value.starts_with('>') {
                let mut block = String::new();
                while i + 1 < lines.len() {
                    let next = lines[i + 1];
                    let next_indent = next.len() - next.trim_start().len();
                    if !next.trim().is_empty() && next_indent <= indent {
                        break;
                    }
                    block.push_str(next.trim());
                    block.push(' ');
                    i += 1;
                }
                exprs.push(block);
            } else {
                exprs.push(value.to_owned());
            }
        }
        i += 1;
    }
    (exprs, records)
}

#[test]
fn the_rules_query_only_exported_metrics_and_their_own_records() {
    let (exprs, records) = rule_exprs(&read(&monitoring("prometheus-rules.yaml")));
    assert!(exprs.len() >= 16, "{} exprs found", exprs.len());
    assert!(records.contains("namespace:dynamo_epp_kv_hit_rate:ratio_rate5m"));
    let allowed = allowed();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "no metric in {expr:?}");
        for name in names {
            assert!(
                allowed.contains(&name) || records.contains(&name),
                "the rules query {name:?}, which nothing exports (in {expr:?})"
            );
        }
    }
}

#[test]
fn the_dashboard_queries_only_exported_metrics_through_its_datasource_variable() {
    let dashboard: Value = serde_json::from_str(&read(&monitoring("grafana-dashboard.json")))
        .expect("the dashboard is JSON");
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(variables, ["datasource", "model"]);
    let schema = dashboard["schemaVersion"].as_u64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");

    let allowed = allowed();
    let mut used = BTreeSet::new();
    let mut ids = BTreeSet::new();
    let panels = dashboard["panels"].as_array().expect("panels");
    for panel in panels {
        let title = panel["title"].as_str().expect("every panel has a title");
        assert!(
            ids.insert(panel["id"].as_u64().expect("panel id")),
            "duplicate id at {title:?}"
        );
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        for target in targets {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
            let expr = target["expr"].as_str().expect("expr");
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{title}: no metric in {expr:?}");
            for name in names {
                assert!(
                    allowed.contains(&name),
                    "{title}: {name:?} is not a metric the code base exports (in {expr:?})"
                );
                used.insert(name);
            }
        }
    }
    // What the planner's users look for is there.
    for name in [
        "dynamo_frontend_time_to_first_token_seconds_bucket",
        "dynamo_frontend_inter_token_latency_seconds_bucket",
        "dynamo_planner_replicas",
        "dynamo_planner_desired_replicas",
        "dynamo_planner_decisions_total",
        "dynamo_planner_predicted_requests",
        "dynamo_planner_observed_ttft_seconds",
        "dynamo_planner_observed_itl_seconds",
        "dynamo_frontend_worker_active_prefill_tokens",
        "dynamo_frontend_worker_active_decode_blocks",
    ] {
        assert!(used.contains(name), "the dashboard does not show {name}");
    }
}

#[test]
fn metric_names_skips_labels_functions_ranges_and_variables() {
    let names = metric_names(
        r#"histogram_quantile(0.95, sum by (model, le) (rate(a_bucket{model=~"$model", x="y{z}"}[$__rate_interval])))
           / on(namespace) group_left() max without (pod) (b) or vector(0.5) > bool 1e-3 unless c offset 5m"#,
    );
    assert_eq!(
        names,
        BTreeSet::from(["a_bucket".into(), "b".into(), "c".into()])
    );
}
