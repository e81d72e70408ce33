//! Starts a serving graph for a live run and stops it afterwards: a shell command with
//! `{mode}` and `{port}` filled in (e.g. `dynamo run -f FILE --port {port}
//! --router-mode {mode}`), run in its own process group so that SIGTERM reaches every
//! process it starts.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use rustix::process::{Pid, Signal, kill_process_group, test_kill_process_group};

/// Between two health checks, and between two looks at a stopping process.
const POLL: Duration = Duration::from_millis(100);

/// How a launched command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Every process exited after SIGTERM, within the grace period.
    Terminated,
    /// Something outlived the grace period and got SIGKILL.
    Killed,
}

/// A launched command; dropping it without [`Launched::stop`] kills its group.
pub struct Launched {
    child: Child,
    pub command: String,
}

/// The command for one run: `{mode}` and `{port}` replaced.
pub fn expand(template: &str, mode: &str, port: u16) -> String {
    template
        .replace("{mode}", mode)
        .replace("{port}", &port.to_string())
}

impl Launched {
    /// Runs `command` with `sh -c` in a new process group; its output goes to our
    /// stderr, so stdout keeps only the results.
    pub fn start(command: String) -> anyhow::Result<Self> {
        let mut shell = Command::new("sh");
        shell.arg("-c").arg(&command);
        Self::spawn(shell, command)
    }

    /// Runs `program` as [`Launched::start`] runs a shell command; `command` names it in
    /// errors.
    pub fn spawn(mut program: Command, command: String) -> anyhow::Result<Self> {
        let child = program
            .stdin(Stdio::null())
            .stdout(std::io::stderr())
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting `{command}`"))?;
        Ok(Self { child, command })
    }

    /// The process started: the shell of [`Launched::start`], the program itself of
    /// [`Launched::spawn`].
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until `GET {base_url}/health` answers 200, failing if the command exits
    /// first or `timeout` passes.
    pub async fn wait_healthy(
        &mut self,
        http: &reqwest::Client,
        base_url: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let url = format!("{}/health", base_url.trim_end_matches('/'));
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                anyhow::bail!(
                    "`{}` exited ({status}) before {url} was healthy",
                    self.command
                );
            }
            let probe = http.get(&url).timeout(POLL * 10).send().await;
            if probe.is_ok_and(|r| r.status() == reqwest::StatusCode::OK) {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{url} was not healthy within {timeout:?} after `{}`",
                self.command
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGTERM to the group; waits until every process of it is gone, sending SIGKILL
    /// if some are still there after `grace`.
    pub async fn stop(mut self, grace: Duration) -> anyhow::Result<Stopped> {
        self.signal(Signal::TERM);
        let deadline = Instant::now() + grace;
        loop {
            // Reaping the shell first: a zombie still counts as a member of the group.
            if self.child.try_wait()?.is_some() && !self.group_alive() {
                return Ok(Stopped::Terminated);
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(POLL).await;
        }
        self.signal(Signal::KILL);
        self.child.wait()?;
        Ok(Stopped::Killed)
    }

    fn group(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32).expect("a child's pid is positive")
    }

    fn group_alive(&self) -> bool {
        test_kill_process_group(self.group()).is_ok()
    }

    fn signal(&self, signal: Signal) {
        // The group may be gone already (ESRCH): nothing left to stop.
        let _ = kill_process_group(self.group(), signal);
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) || self.group_alive() {
            self.signal(Signal::KILL);
            let _ = self.child.wait();
        }
    }
}
