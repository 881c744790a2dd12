//! A program run to completion with a deadline: [`Command::output`] waits
//! forever, and an interpreter that hangs at exit (Python's finalizers
//! waiting on a lock a killed daemon thread held) would hang the suite.

use std::io::Read;
use std::process::{Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// How often the child is asked whether it has ended.
const POLL_EVERY: Duration = Duration::from_millis(20);
/// How long the output pipes may stay open after the child ended.
const PIPES_CLOSE_WITHIN: Duration = Duration::from_secs(5);

/// Runs `command` to its end and returns what it wrote, as
/// [`Command::output`] does, or kills it once `limit` has passed and says
/// so, with what it wrote until then.
pub fn output_within(command: &mut Command, limit: Duration) -> Result<Output, String> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {command:?}: {e}"))?;
    let stdout = child.stdout.take().map(drain);
    let stderr = child.stderr.take().map(drain);
    let deadline = Instant::now() + limit;
    let status: Option<ExitStatus> = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => thread::sleep(POLL_EVERY),
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    // A grandchild still holding a pipe must not hold this up either.
    let collect = |reader: Option<mpsc::Receiver<Vec<u8>>>| {
        reader
            .and_then(|r| r.recv_timeout(PIPES_CLOSE_WITHIN).ok())
            .unwrap_or_default()
    };
    let (stdout, stderr) = (collect(stdout), collect(stderr));
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => Err(format!(
            "{command:?} did not end within {limit:?}; killed. stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        )),
    }
}

/// How long [`output`] lets a program run: a CLI command answers in
/// seconds; this only turns a hang into a failure.
pub const OUTPUT_WITHIN: Duration = Duration::from_secs(120);

/// How long a test lets `cargo build` of an example run: a cold build of
/// the embedded sidecar takes minutes on two cores; this only turns a
/// stuck build (a lock another cargo never releases) into a failure.
pub const BUILD_WITHIN: Duration = Duration::from_secs(30 * 60);

/// [`output_within`] [`OUTPUT_WITHIN`], failing the test (with what the
/// program wrote) when it cannot run or does not end.
pub fn output(command: &mut Command) -> Output {
    output_within(command, OUTPUT_WITHIN).unwrap_or_else(|e| panic!("{e}"))
}

/// Reads `pipe` to its end on a thread of its own (so a full pipe never
/// blocks the child); the bytes arrive on the receiver.
fn drain(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        let _ = sender.send(bytes);
    });
    receiver
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_that_ends_gives_its_output() {
        let out = output_within(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            Duration::from_secs(30),
        )
        .unwrap();
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[test]
    fn a_program_past_its_deadline_is_killed_with_what_it_wrote() {
        let started = Instant::now();
        let err = output_within(
            Command::new("sh").args(["-c", "echo before; exec sleep 60"]),
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(30), "not killed");
        assert!(
            err.contains("did not end within") && err.contains("before"),
            "{err}"
        );
    }
}
