//! What the commands that call a running sidecar (`apply`, `status`)
//! share: how long they wait for it, and how they tell why it failed.

use std::error::Error;
use std::ffi::OsString;
use std::time::Duration;

/// The longest wait for a connection (TCP, and TLS where asked for) to the
/// sidecar: an address nobody answers fails in seconds, not minutes.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest wait for the status answer, once connected.
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(30);

/// How often `apply` pings the sidecar while it waits for the answer.
pub const PING_EVERY: Duration = Duration::from_secs(2);

/// How soon a ping must be answered: a sidecar that does not (stopped, or
/// not a sidecar at all) is given up on. Generous: a sidecar whose workers
/// a component's init keeps busy answers late.
pub const PING_ANSWERED_WITHIN: Duration = Duration::from_secs(10);

/// The longest wait for an `apply` answer, sent as the call's
/// `grpc-timeout`: the sidecar answers by then ("queued", when its reload
/// is not done).
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(600);

/// The token in the environment variable `name`, read as the sidecar
/// reads it: `None` when unset or empty; an error naming the variable
/// when it is set to something that is not valid UTF-8 (taken for unset,
/// the call would go without the token the user set).
pub fn token_var(name: &str) -> Result<Option<String>, String> {
    token_of(name, std::env::var_os(name))
}

/// [`token_var`] of the value `value` the variable `name` has.
fn token_of(name: &str, value: Option<OsString>) -> Result<Option<String>, String> {
    match value.map(OsString::into_string) {
        None => Ok(None),
        Some(Ok(text)) => Ok(Some(text).filter(|text| !text.is_empty())),
        Some(Err(_)) => Err(format!(
            "the environment variable {name} is set but is not valid UTF-8: a token must be \
             text (unset it, or set it empty, for no token)"
        )),
    }
}

/// `text` with its control characters escaped (`\u{1b}`, `\r`), as
/// `validate` shows a configuration's problems: a name or reason from the
/// sidecar (pushed by anyone with the token, or quoting a backend) must
/// not drive the terminal (an OSC 52 sequence sets the clipboard) nor
/// split a line.
pub fn one_line(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    shown
}

/// `error` and each of its sources, `outer: inner: …`: the cause
/// (`Connection refused`, a TLS certificate error) that a transport
/// error's own text (`transport error`, `error sending request`) leaves
/// out. A source whose text its outer one already holds is not repeated.
pub fn error_chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token variable set to bytes that are not UTF-8 is an error naming
    /// it. Before: taken for unset, the call went without the token.
    #[test]
    fn a_token_variable_that_is_not_utf8_is_an_error_naming_it() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0xff, b'a']);
        let refused = token_of("REWIRE_ADMIN_TOKEN", Some(bad)).expect_err("refused");
        assert!(
            refused.contains("REWIRE_ADMIN_TOKEN") && refused.contains("not valid UTF-8"),
            "{refused}"
        );
        assert_eq!(
            token_of("T", Some("s3cret".into())),
            Ok(Some("s3cret".into()))
        );
        assert_eq!(token_of("T", Some(OsString::new())), Ok(None));
        assert_eq!(token_of("T", None), Ok(None));
    }

    #[derive(Debug)]
    struct Wrapped(&'static str, Option<Box<dyn Error + 'static>>);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Error for Wrapped {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.1.as_deref()
        }
    }

    #[test]
    fn every_cause_is_told_once() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let refused_text = refused.to_string();
        let connect = Wrapped("tcp connect error", Some(Box::new(refused)));
        let error = Wrapped("transport error", Some(Box::new(connect)));
        assert_eq!(
            error_chain(&error),
            format!("transport error: tcp connect error: {refused_text}")
        );
        let repeated = Wrapped(
            "error: bad certificate",
            Some(Box::new(Wrapped("bad certificate", None))),
        );
        assert_eq!(error_chain(&repeated), "error: bad certificate");
    }
}
