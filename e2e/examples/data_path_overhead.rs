//! What the data path adds to a request: the same streamed completions sent straight to
//! the engine, through the sidecar, and through the EPP's HTTP frontend (tokenize, pick,
//! proxy) and the sidecar, one at a time, in turn, with the mock engine
//! (`dynamo-mocker`) at a high speedup as the engine. Each runs as its own process, so
//! the sidecar's and the EPP's CPU time per request is read from `/proc`.
//!
//! ```text
//! cargo build --release -p dynamo-mocker -p dynamo-sidecar -p dynamo-epp
//! cargo run --release -p dynamo-e2e --example data_path_overhead
//! ```

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use clap::Parser;
use dynamo_mocker::replay::Percentiles;
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// The `dynamo-mocker` binary [default: beside this example's target directory].
    #[arg(long)]
    mocker: Option<PathBuf>,
    /// The `dynamo-sidecar` binary [default: beside this example's target directory].
    #[arg(long)]
    sidecar: Option<PathBuf>,
    /// The `dynamo-epp` binary [default: beside this example's target directory].
    #[arg(long)]
    epp: Option<PathBuf>,
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../.cache/models/qwen-mock"))]
    model_path: PathBuf,
    /// Measured requests per prompt size and path.
    #[arg(long, default_value_t = 300)]
    requests: usize,
    /// High enough that the engine's simulated time vanishes next to what is measured
    /// (its step loop still ticks in whole milliseconds).
    #[arg(long, default_value_t = 1_000_000.0)]
    speedup_ratio: f64,
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
}

/// Kills the child process when dropped.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // target/release/examples/data_path_overhead -> target/release/
    let bin_dir = std::env::current_exe()?
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mocker_bin = args.mocker.unwrap_or_else(|| bin_dir.join("dynamo-mocker"));
    let sidecar_bin = args
        .sidecar
        .unwrap_or_else(|| bin_dir.join("dynamo-sidecar"));
    let epp_bin = args.epp.unwrap_or_else(|| bin_dir.join("dynamo-epp"));
    let [
        engine_port,
        proxy_port,
        grpc_port,
        metrics_port,
        epp_port,
        ext_proc_port,
    ] = free_ports()?;

    let _engine = Process(
        Command::new(&mocker_bin)
            .args(["--host", "127.0.0.1", "--model-name", "qwen"])
            .args(["--port", &engine_port.to_string()])
            .args(["--kv-events-endpoint", "none"])
            .args(["--speedup-ratio", &args.speedup_ratio.to_string()])
            .arg("--model-path")
            .arg(&args.model_path)
            .spawn()?,
    );
    let sidecar = Process(
        Command::new(&sidecar_bin)
            .args(["--listen", &format!("127.0.0.1:{proxy_port}")])
            .args(["--engine-url", &format!("http://127.0.0.1:{engine_port}")])
            .args(["--engine-kv-events", "none", "--host", "127.0.0.1"])
            .args(["--grpc-port", &grpc_port.to_string()])
            .args(["--metrics-port", &metrics_port.to_string()])
            .env("RUST_LOG", "warn")
            .spawn()?,
    );
    // `kv` mode: every request is tokenized, hashed, matched and picked.
    let epp = Process(
        Command::new(&epp_bin)
            .args(["--host", "127.0.0.1", "--model-name", "qwen"])
            .arg("--model-path")
            .arg(&args.model_path)
            .args(["--http-port", &epp_port.to_string()])
            .args(["--ext-proc-port", &ext_proc_port.to_string()])
            .args(["--endpoints", &format!("127.0.0.1:{proxy_port}")])
            .args(["--kv-events-port", &grpc_port.to_string()])
            .args(["--router-mode", "kv"])
            .env("RUST_LOG", "warn")
            .spawn()?,
    );
    let client = reqwest::Client::builder().no_proxy().build()?;
    wait_ok(&client, &format!("http://127.0.0.1:{metrics_port}/ready")).await?;
    wait_ok(&client, &format!("http://127.0.0.1:{epp_port}/health")).await?;

    let paths = [
        (
            "direct",
            format!("http://127.0.0.1:{engine_port}/v1/completions"),
        ),
        (
            "sidecar",
            format!("http://127.0.0.1:{proxy_port}/v1/completions"),
        ),
        (
            "EPP + sidecar",
            format!("http://127.0.0.1:{epp_port}/v1/completions"),
        ),
    ];
    let ticks = clock_ticks_per_second()?;
    println!(
        "{} requests per case, streamed, max_tokens {}, mocker speedup {}",
        args.requests, args.max_tokens, args.speedup_ratio
    );
    println!(
        "| prompt | path | TTFT p50 | TTFT p99 | total p50 | total p99 | sidecar CPU / request | EPP CPU / request |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (label, prompt_len) in [("small (16 tokens)", 16), ("8k tokens", 8192)] {
        let mut samples = [Vec::new(), Vec::new(), Vec::new()];
        // CPU of (sidecar, EPP) spent during each path's requests.
        let mut cpu = [[Duration::ZERO; 2]; 3];
        for i in 0..args.requests + 20 {
            // A fresh prompt each time, so the engine prefills it (no prefix cache hit).
            let tokens: Vec<u32> = (0..prompt_len)
                .map(|t| (i * 7919 + t) as u32 % 150_000)
                .collect();
            let body = json!({
                "model": "qwen",
                "prompt": tokens,
                "max_tokens": args.max_tokens,
                "stream": true,
            });
            for (k, (_, url)) in paths.iter().enumerate() {
                let before = [
                    cpu_time(sidecar.0.id(), ticks)?,
                    cpu_time(epp.0.id(), ticks)?,
                ];
                let t = timed(&client, url, &body).await?;
                let after = [
                    cpu_time(sidecar.0.id(), ticks)?,
                    cpu_time(epp.0.id(), ticks)?,
                ];
                if i >= 20 {
                    samples[k].push(t);
                    for p in 0..2 {
                        cpu[k][p] += after[p] - before[p];
                    }
                }
            }
        }
        for (k, ((path, _), s)) in paths.iter().zip(&samples).enumerate() {
            let mut ttft: Vec<f64> = s.iter().map(|t| ms(t.0)).collect();
            let mut total: Vec<f64> = s.iter().map(|t| ms(t.1)).collect();
            let (ttft, total) = (Percentiles::of(&mut ttft), Percentiles::of(&mut total));
            let per_request = |d: Duration| format!("{:.3} ms", ms(d) / args.requests as f64);
            println!(
                "| {label} | {path} | {:.3} ms | {:.3} ms | {:.3} ms | {:.3} ms | {} | {} |",
                ttft.p50,
                ttft.p99,
                total.p50,
                total.p99,
                per_request(cpu[k][0]),
                per_request(cpu[k][1]),
            );
        }
    }
    Ok(())
}

/// Time to the first streamed chunk and to the end of the stream.
async fn timed(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> anyhow::Result<(Duration, Duration)> {
    let start = Instant::now();
    let mut response = client
        .post(url)
        .json(body)
        .send()
        .await?
        .error_for_status()?;
    let mut first = None;
    while let Some(chunk) = response.chunk().await? {
        if first.is_none() && !chunk.is_empty() {
            first = Some(start.elapsed());
        }
    }
    let total = start.elapsed();
    Ok((first.unwrap_or(total), total))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// User plus system CPU time of process `pid` (fields 14 and 15 of `/proc/PID/stat`).
fn cpu_time(pid: u32, ticks_per_second: u64) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name, which may contain spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    Ok(Duration::from_secs_f64(
        ticks as f64 / ticks_per_second as f64,
    ))
}

fn clock_ticks_per_second() -> anyhow::Result<u64> {
    let out = Command::new("getconf").arg("CLK_TCK").output()?;
    Ok(String::from_utf8(out.stdout)?.trim().parse()?)
}

fn free_ports() -> std::io::Result<[u16; 6]> {
    let mut ports = [0; 6];
    for port in &mut ports {
        *port = dynamo_server::free_port()?;
    }
    Ok(ports)
}

async fn wait_ok(client: &reqwest::Client, url: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{url} never answered 200");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
