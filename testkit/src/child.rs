//! One child-process type under every launcher and every test that runs a
//! program: spawn with output to a log file, wait until it answers (or logs
//! that it is ready), stop or terminate, restart on the same arguments, and
//! the log (or its tail, for error messages).

use std::fs;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use tokio::time::{sleep, Instant};

/// How often [`ChildProcess::start`] asks whether the process answers.
const PROBE_EVERY: Duration = Duration::from_millis(50);
/// Pause between attempts of [`ChildProcess::restart`] while a port is held.
const RETRY_EVERY: Duration = Duration::from_millis(100);
/// Lines of the log quoted in errors.
const TAIL_LINES: usize = 5;
/// How long [`ChildProcess::terminate`] waits for the process to exit.
pub const TERMINATE_WITHIN: Duration = Duration::from_secs(30);

/// A program run as a child process, killed on drop.
pub struct ChildProcess {
    name: String,
    command: Box<dyn Fn() -> Command + Send + Sync>,
    log: PathBuf,
    child: Option<Child>,
}

impl ChildProcess {
    /// A process named `name` (for messages), started with the command
    /// `command` builds, writing stdout and stderr to `log` (appended to).
    /// Nothing runs until [`ChildProcess::start`].
    pub fn new(
        name: &str,
        log: PathBuf,
        command: impl Fn() -> Command + Send + Sync + 'static,
    ) -> Self {
        Self {
            name: name.to_string(),
            command: Box::new(command),
            log,
            child: None,
        }
    }

    /// Spawns the process and waits (at most `limit`) until `answers`
    /// returns true. On failure the process is stopped and the error
    /// quotes the end of its log.
    pub async fn start<F, Fut>(&mut self, limit: Duration, mut answers: F) -> Result<(), String>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        self.spawn()?;
        let deadline = Instant::now() + limit;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("exited with {status}: {}", self.log_tail()));
                }
            }
            if answers().await {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(format!("no answer within {limit:?}: {}", self.log_tail()));
            }
            sleep(PROBE_EVERY).await;
        }
    }

    /// Stops the process, then starts it again with the same command,
    /// retrying (for at most `limit`) while it fails, e.g. because its
    /// port is still held.
    pub async fn restart<F, Fut>(&mut self, limit: Duration, mut answers: F) -> Result<(), String>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        self.stop();
        let deadline = Instant::now() + limit;
        loop {
            match self.start(limit, &mut answers).await {
                Ok(()) => return Ok(()),
                Err(err) if Instant::now() > deadline => {
                    return Err(format!("{} restart failed: {err}", self.name))
                }
                Err(_) => sleep(RETRY_EVERY).await,
            }
        }
    }

    /// Spawns the process and blocks (at most `limit`) until its log
    /// contains `line`: for tests without an async runtime, and for
    /// processes that say when they are ready (`rewire run`). On failure
    /// the process is stopped and the error quotes the end of its log.
    pub fn start_until_logged(&mut self, limit: Duration, line: &str) -> Result<(), String> {
        self.spawn()?;
        let deadline = std::time::Instant::now() + limit;
        loop {
            if self.log().contains(line) {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("exited with {status}: {}", self.log_tail()));
                }
            }
            if std::time::Instant::now() > deadline {
                self.stop();
                return Err(format!("no `{line}` within {limit:?}:\n{}", self.log()));
            }
            std::thread::sleep(PROBE_EVERY);
        }
    }

    /// Sends SIGTERM (through `kill`) and waits for the process to exit,
    /// for [`TERMINATE_WITHIN`] at most (a process that ignores it fails
    /// the test instead of hanging it).
    pub fn terminate(&mut self) -> Result<ExitStatus, String> {
        self.terminate_within(TERMINATE_WITHIN)
    }

    /// Sends SIGTERM and waits at most `limit` for the process to exit;
    /// past it, kills the process and says so.
    pub fn terminate_within(&mut self, limit: Duration) -> Result<ExitStatus, String> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| format!("{} does not run", self.name))?;
        let killed = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .map_err(|e| format!("cannot run kill: {e}"))?;
        if !killed.success() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("kill -TERM {} failed: {killed}", child.id()));
        }
        let started = std::time::Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Ok(status),
                Ok(None) if started.elapsed() < limit => std::thread::sleep(PROBE_EVERY),
                Ok(None) | Err(_) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!("{} still ran {limit:?} after SIGTERM", self.name));
                }
            }
        }
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("log {}: {e}", self.log.display()))?;
        let err = log.try_clone().map_err(|e| format!("log: {e}"))?;
        let child = (self.command)()
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", self.name))?;
        self.child = Some(child);
        Ok(())
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process was started and not stopped.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the process and reaps it (a no-op if it does not run).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of the log, joined with ` | `.
    pub fn log_tail(&self) -> String {
        let text = self.log();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(TAIL_LINES)..].join(" | ")
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
