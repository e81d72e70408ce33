//! One supervised child process: started, its output prefixed and forwarded, restarted
//! with back-off when it dies, stopped with SIGTERM (then SIGKILL after a grace period).
//!
//! Each child gets its own process group, so a Ctrl-C in the terminal reaches only the
//! runner, which then stops its children in order (picker first, engines last).

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::plan::CommandSpec;

/// Restart back-off: doubles from `FIRST_RESTART` up to `MAX_RESTART`; a child that ran
/// longer than `STABLE_RUN` starts over at `FIRST_RESTART`.
const FIRST_RESTART: Duration = Duration::from_millis(500);
const MAX_RESTART: Duration = Duration::from_secs(30);
const STABLE_RUN: Duration = Duration::from_secs(60);

/// A program resolved to a path, ready to start.
#[derive(Clone, Debug)]
pub struct Program {
    pub path: PathBuf,
    pub spec: CommandSpec,
}

/// A running (or restarting) child. Dropping the handle stops the child in the
/// background; `stop` also waits until it is gone.
pub struct Supervised {
    pid: Arc<AtomicU32>,
    restarts: Arc<AtomicU32>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Supervised {
    pub fn start(name: String, program: Program, grace: Duration) -> Self {
        let pid = Arc::new(AtomicU32::new(0));
        let restarts = Arc::new(AtomicU32::new(0));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(supervise(
            name,
            program,
            grace,
            pid.clone(),
            restarts.clone(),
            stopped,
        ));
        Self {
            pid,
            restarts,
            stop,
            task,
        }
    }

    /// The current process id, 0 between restarts.
    pub fn pid(&self) -> u32 {
        self.pid.load(Ordering::Relaxed)
    }

    pub fn restarts(&self) -> u32 {
        self.restarts.load(Ordering::Relaxed)
    }

    /// Stops the child (SIGTERM, then SIGKILL after the grace period) and waits for it.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn supervise(
    name: String,
    program: Program,
    grace: Duration,
    pid: Arc<AtomicU32>,
    restarts: Arc<AtomicU32>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut backoff = FIRST_RESTART;
    loop {
        let started = Instant::now();
        let mut child = match spawn(&name, &program) {
            Ok(child) => child,
            Err(err) => {
                eprintln!("{name}: cannot start {}: {err}", program.path.display());
                if wait_or_stop(&mut stopped, backoff).await {
                    return;
                }
                backoff = (backoff * 2).min(MAX_RESTART);
                continue;
            }
        };
        pid.store(child.id().unwrap_or(0), Ordering::Relaxed);
        let status = tokio::select! {
            status = child.wait() => status,
            () = stop_requested(&mut stopped) => {
                terminate(&name, &mut child, grace).await;
                pid.store(0, Ordering::Relaxed);
                return;
            }
        };
        pid.store(0, Ordering::Relaxed);
        if started.elapsed() > STABLE_RUN {
            backoff = FIRST_RESTART;
        }
        eprintln!(
            "{name}: exited ({}); restarting in {:.1} s",
            describe(status),
            backoff.as_secs_f64()
        );
        if wait_or_stop(&mut stopped, backoff).await {
            return;
        }
        restarts.fetch_add(1, Ordering::Relaxed);
        backoff = (backoff * 2).min(MAX_RESTART);
    }
}

fn spawn(name: &str, program: &Program) -> std::io::Result<Child> {
    let mut child = Command::new(&program.path)
        .args(&program.spec.args)
        .envs(program.spec.env.iter().map(|(k, v)| (k, v)))
        // Lines go to a pipe, then to our terminal with a prefix: no colour codes.
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()?;
    if let Some(out) = child.stdout.take() {
        tokio::spawn(forward_lines(name.to_owned(), out));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(forward_lines(name.to_owned(), err));
    }
    Ok(child)
}

/// Prints the child's lines with its name in front, so interleaved logs stay readable.
async fn forward_lines(name: String, stream: impl AsyncRead + Unpin) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        println!("{name:>14} | {line}");
    }
}

async fn terminate(name: &str, child: &mut Child, grace: Duration) {
    if let Some(id) = child.id().and_then(|id| Pid::from_raw(id as i32)) {
        // The child may have exited on its own a moment ago: nothing to signal then.
        let _ = kill_process(id, Signal::TERM);
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        eprintln!(
            "{name}: still running {} s after SIGTERM; killing it",
            grace.as_secs()
        );
        let _ = child.kill().await;
    }
}

/// Sleeps `pause`, returning early with `true` when a stop is requested.
async fn wait_or_stop(stopped: &mut watch::Receiver<bool>, pause: Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(pause) => false,
        () = stop_requested(stopped) => true,
    }
}

/// Resolves once `stop` was called (or the handle dropped: nobody is left to stop it).
async fn stop_requested(stopped: &mut watch::Receiver<bool>) {
    let _ = stopped.wait_for(|s| *s).await;
}

fn describe(status: std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("wait failed: {e}"),
    }
}
