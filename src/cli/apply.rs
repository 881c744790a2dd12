//! `rewire apply`: push one component's configuration to a running sidecar
//! through the Lifecycle API, as a control plane does (or, with
//! `--release`, hand it back to the file).
//!
//! The push amends (`AmendConfiguration`): the CLI has no flag for refs
//! nor a way to repeat the file's fields, so a whole declaration made of
//! its flags would wipe the component's secretRefs and every field not
//! repeated (`-m redisHost=…` on a store with `redisDB: 3` and a password
//! would talk to DB 0 without it). `--replace` pushes the whole
//! declaration (`ApplyConfiguration`). A sidecar older than
//! `AmendConfiguration` answers `UNIMPLEMENTED`: the CLI then stops, and
//! never falls back to a whole declaration the user did not ask for.

use std::collections::HashMap;
use std::process::ExitCode;

use clap::Args;
use rewire::sidecar::auth::{ADMIN_TOKEN_HEADER, APP_TOKEN_HEADER};
use rewire::sidecar::grpc::proto::rewire::lifecycle::v1::lifecycle_client::LifecycleClient;
use rewire::sidecar::grpc::proto::rewire::lifecycle::v1::{
    ApplyConfigurationResponse, ComponentConfig, DynamicConfiguration, ReleaseComponentRequest,
};
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::Request;

/// Arguments of `rewire apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The component's kind (`state`, `lock`, `config_store`, ...).
    #[arg(long)]
    kind: String,
    /// The component's name.
    #[arg(long)]
    name: String,
    /// The component's type (default: the running component's type).
    #[arg(long = "type")]
    type_name: Option<String>,
    /// A metadata field, `key=value`, replacing that field; repeat for
    /// several. The fields not given are kept (unless `--replace`).
    #[arg(long = "metadata", short = 'm', value_parser = parse_field)]
    metadata: Vec<(String, String)>,
    /// Push the whole declaration instead of amending: the component is
    /// then exactly `--type` and the `-m` fields given; its other metadata
    /// fields and its secretRefs, configurationRefs and componentRefs are
    /// gone. (A `--type` other than the one in force does this too.)
    #[arg(long)]
    replace: bool,
    /// Release the component instead: let go of what was pushed (or
    /// removed) through the Lifecycle API, so the file and the overlay say
    /// again what it is.
    #[arg(long, conflicts_with_all = ["type_name", "metadata", "replace"])]
    release: bool,
    /// Reject the push if the sidecar runs a newer generation than this.
    #[arg(long)]
    based_on_generation: Option<u64>,
    /// gRPC address of the sidecar, `host:port` (an IP address or a DNS
    /// name; over TLS, the name its certificate is checked against).
    #[arg(long, default_value = rewire::sidecar::DEFAULT_GRPC_ADDR, value_parser = super::address::parse)]
    addr: String,
    #[command(flatten)]
    tls: super::client_tls::ClientTlsArgs,
}

fn parse_field(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("expected key=value, got `{text}`")),
    }
}

/// Exit status of a push the sidecar has queued: not applied yet, but it
/// will still be applied or rejected (pushing again is not needed).
pub const EXIT_QUEUED: u8 = 3;

/// Exit status of a push sent to the sidecar whose outcome is unknown: its
/// answer never came (the connection broke or went silent after the
/// request left), or a status came that does not say the push was not
/// processed (`DEADLINE_EXCEEDED`, `CANCELLED`, `UNKNOWN`, `INTERNAL`,
/// `ABORTED`, an `UNAVAILABLE` not marked [`RELOAD_CUT_SHORT`], from the
/// sidecar or a proxy on the way): the sidecar runs each reload in its own
/// task, so the push may be in force or not.
pub const EXIT_UNKNOWN: u8 = 4;

/// Exit status of a push the sidecar refused `RESOURCE_EXHAUSTED` for its
/// full backlog of pending pushes (marked [`PUSH_BACKLOG_FULL`]): nothing was applied, and unlike a
/// rejection the same push may pass once the backlog drains.
pub const EXIT_BUSY: u8 = 5;

/// Exit status of a push the sidecar applied (a new generation) in which
/// an update failed after the commit (a staged in-place update that
/// panicked when applied, of the pushed component or of a dependent the
/// push re-resolved; or the reload panicked after its commit): that
/// component runs as before, or with part of the new configuration, so
/// the push is not wholly in force. Not 0: a script must not take the new
/// configuration for in force.
pub const EXIT_UPDATE_FAILED: u8 = 6;

/// Sends the component's configuration (or its release); exits 1 on a
/// rejection, printing every reason, [`EXIT_QUEUED`] when the sidecar
/// answered before the reload was done, [`EXIT_UNKNOWN`] when no answer
/// came to a request sent or a status that does not say whether it was
/// processed, [`EXIT_BUSY`] when the sidecar's backlog of
/// pushes was full, and [`EXIT_UPDATE_FAILED`] when it was applied but
/// an update failed after the commit.
pub async fn apply_command(args: ApplyArgs) -> ExitCode {
    if let Some(error) = repeated_field(&args.metadata) {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    let key = format!("{}/{}", args.kind, args.name);
    // Every failure is shown with its control characters escaped (it may
    // quote the sidecar, a proxy or a TLS peer), as the answers are.
    let failed = send(args).await.map_err(Failed::escaped);
    match failed {
        Ok(answer) => print_answer(&key, answer),
        Err(Failed::Refused(error)) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
        Err(Failed::Busy(error)) => {
            eprintln!(
                "error: {key}: the sidecar is busy ({error}): nothing applied; push again later \
                 (follow its backlog with `rewire status`)"
            );
            ExitCode::from(EXIT_BUSY)
        }
        Err(Failed::Unanswered(error)) => {
            eprintln!(
                "error: {key}: sent, but no answer came ({error}): it may or may not be in \
                 force; check `rewire status` before pushing again"
            );
            ExitCode::from(EXIT_UNKNOWN)
        }
        Err(Failed::Unknown(error)) => {
            eprintln!(
                "error: {key}: the call failed ({error}), which does not say whether the push \
                 was applied: it may or may not be in force; check `rewire status` before \
                 pushing again"
            );
            ExitCode::from(EXIT_UNKNOWN)
        }
    }
}

/// Why a push has no answer from the sidecar.
#[derive(Debug)]
enum Failed {
    /// Nothing was applied: not sent (no connection, a bad token, a
    /// sidecar that cannot amend), or refused with a status that says the
    /// push was not processed (see [`failed_by_status`]).
    Refused(String),
    /// Sent, then the call failed on this side (the connection broke, a
    /// ping or the call's deadline passed): the outcome is unknown.
    Unanswered(String),
    /// Refused `RESOURCE_EXHAUSTED` by the sidecar, marked
    /// [`PUSH_BACKLOG_FULL`] (its backlog of pending pushes is full): nothing was applied, and the same push may pass
    /// later.
    Busy(String),
    /// A status that does not say whether the push was processed (a
    /// deadline passed, an internal error, an `UNAVAILABLE` from a proxy):
    /// the outcome is unknown.
    Unknown(String),
}

impl Failed {
    /// The same failure, its text's control characters escaped (see
    /// [`one_line`](super::remote::one_line)).
    fn escaped(self) -> Self {
        use super::remote::one_line;
        match self {
            Failed::Refused(text) => Failed::Refused(one_line(&text)),
            Failed::Unanswered(text) => Failed::Unanswered(one_line(&text)),
            Failed::Busy(text) => Failed::Busy(one_line(&text)),
            Failed::Unknown(text) => Failed::Unknown(one_line(&text)),
        }
    }
}

/// The first metadata field given twice (`-m key=a -m key=b`), said: a
/// push carries one value per field, and keeping the last silently would
/// hide the slip. The values of a secret field
/// ([`is_secret_field`](rewire_runtime::is_secret_field)) are shown as
/// `[secret]`.
fn repeated_field(fields: &[(String, String)]) -> Option<String> {
    let mut seen = HashMap::new();
    for (key, value) in fields {
        if let Some(first) = seen.insert(key.as_str(), value.as_str()) {
            let shown = |value: &str| {
                if rewire_runtime::is_secret_field(key) {
                    "[secret]".to_string()
                } else {
                    value.escape_debug().to_string()
                }
            };
            return Some(format!(
                "metadata field `{}` given twice (`{}`, then `{}`): give each field once",
                key.escape_debug(),
                shown(first),
                shown(value)
            ));
        }
    }
    None
}

/// Sends the push or the release, with the token from the environment.
async fn send(args: ApplyArgs) -> Result<ApplyConfigurationResponse, Failed> {
    let token = env_token().map_err(Failed::Refused)?;
    let channel = connect(&args.addr, &args.tls)
        .await
        .map_err(Failed::Refused)?;
    let mut client = LifecycleClient::new(channel);
    let answer = if args.release {
        let request = ReleaseComponentRequest {
            kind: args.kind,
            name: args.name,
            based_on_generation: args.based_on_generation,
        };
        client
            .release_component(bounded(with_token(Request::new(request), &token)))
            .await
    } else {
        let request = DynamicConfiguration {
            component_config: Some(ComponentConfig {
                kind: args.kind,
                name: args.name,
                r#type: args.type_name.unwrap_or_default(),
                metadata: args.metadata.into_iter().collect::<HashMap<_, _>>(),
                ..ComponentConfig::default()
            }),
            based_on_generation: args.based_on_generation,
        };
        let request = bounded(with_token(Request::new(request), &token));
        if args.replace {
            client.apply_configuration(request).await
        } else {
            match client.amend_configuration(request).await {
                // A gRPC server's own answer to a method it does not have
                // (no message); an HTTP 404 from a proxy or a wrong port
                // is UNIMPLEMENTED too, with a message: said as it is.
                Err(status)
                    if status.code() == tonic::Code::Unimplemented
                        && status.message().is_empty() =>
                {
                    return Err(Failed::Refused(NO_AMEND.to_string()))
                }
                answer => answer,
            }
        }
    };
    answer.map(tonic::Response::into_inner).map_err(|status| {
        // A status made on this side (the connection broke, a deadline
        // passed) has its cause as a source, not in its message; one the
        // sidecar sent has none.
        match std::error::Error::source(&status) {
            // A connection made again for the call that failed (the one
            // connected first had dropped), or a stream the sidecar
            // refused unread: nothing was sent.
            Some(cause) if never_sent(cause) => Failed::Refused(said_with_cause(&status, cause)),
            Some(cause) => Failed::Unanswered(said_with_cause(&status, cause)),
            None => failed_by_status(&status),
        }
    })
}

/// A status that came as the answer (the sidecar's, or a proxy's on the
/// way): busy for a push refused for a full backlog (see [`Failed::Busy`]);
/// a refusal only for the codes that say the push was not processed
/// (`INVALID_ARGUMENT`, `UNAUTHENTICATED`, `PERMISSION_DENIED`,
/// `UNIMPLEMENTED`, `FAILED_PRECONDITION`, any other `RESOURCE_EXHAUSTED` —
/// a request over the sidecar's `max_request_bytes` is one, and pushing it
/// again can never pass, so a script retrying on busy would loop — and the
/// sidecar's `UNAVAILABLE` marked [`RELOAD_CUT_SHORT`]); any other
/// (`DEADLINE_EXCEEDED`, `INTERNAL`, an unmarked `UNAVAILABLE`, ...) leaves
/// the outcome unknown.
fn failed_by_status(status: &tonic::Status) -> Failed {
    use tonic::Code;
    // tonic percent-decodes `grpc-message`: whatever bytes the sidecar or
    // a proxy put there (an OSC 52 sequence) are escaped before shown.
    let said = super::remote::one_line(&format!("{:?}: {}", status.code(), status.message()));
    match status.code() {
        Code::ResourceExhausted if marked(status, PUSH_BACKLOG_FULL) => Failed::Busy(said),
        Code::InvalidArgument
        | Code::Unauthenticated
        | Code::PermissionDenied
        | Code::Unimplemented
        | Code::FailedPrecondition
        | Code::ResourceExhausted => Failed::Refused(said),
        Code::Unavailable if marked(status, RELOAD_CUT_SHORT) => Failed::Refused(said),
        _ => Failed::Unknown(said),
    }
}

/// `CODE: message: cause`, of a status made on this side, its control
/// characters escaped (the message and the cause may quote the peer).
fn said_with_cause(status: &tonic::Status, cause: &(dyn std::error::Error + 'static)) -> String {
    super::remote::one_line(&format!(
        "{:?}: {}: {}",
        status.code(),
        status.message(),
        super::remote::error_chain(cause)
    ))
}

/// `ErrorInfo` (reason, domain) the sidecar marks a push refused for its
/// full backlog with (its `lifecycle_wait::PUSH_BACKLOG_FULL`).
const PUSH_BACKLOG_FULL: (&str, &str) = ("PUSH_BACKLOG_FULL", "rewire");

/// `ErrorInfo` (reason, domain) the sidecar marks the `UNAVAILABLE` of a
/// push its shutdown cut short with (its `lifecycle_wait::RELOAD_CUT_SHORT`):
/// nothing of the push is in force.
const RELOAD_CUT_SHORT: (&str, &str) = ("RELOAD_CUT_SHORT", "rewire");

/// Whether `status` carries the `ErrorInfo` `mark` (reason, domain).
fn marked(status: &tonic::Status, mark: (&str, &str)) -> bool {
    use tonic_types::StatusExt;
    status
        .get_details_error_info()
        .is_some_and(|info| (info.reason.as_str(), info.domain.as_str()) == mark)
}

/// Whether `cause`, a call's failure made on this side, says the request
/// never reached the sidecar: a connection that could not be made (tonic
/// connects again for a call when the first connection dropped), or an
/// HTTP/2 stream the sidecar refused before reading it (`REFUSED_STREAM`).
fn never_sent(cause: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(cause);
    while let Some(error) = next {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::{AddrNotAvailable, ConnectionRefused, NotFound};
            if matches!(io.kind(), ConnectionRefused | AddrNotAvailable | NotFound) {
                return true;
            }
        }
        let text = error.to_string();
        if text.contains("tcp connect error")
            || text.contains("dns error")
            || text.contains("refused stream before processing")
        {
            return true;
        }
        next = error.source();
    }
    false
}

/// Why an amendment was not sent to a sidecar that predates
/// `AmendConfiguration`: nothing was applied, and the whole declaration
/// is left for the user to choose.
const NO_AMEND: &str = "the sidecar does not support amending (older than this CLI): push the \
                        whole declaration with --replace";

/// `request` with its deadline sent as `grpc-timeout`, so that the sidecar
/// answers ("queued", when the reload is not done) before this side stops
/// waiting.
fn bounded<T>(mut request: Request<T>) -> Request<T> {
    request.set_timeout(super::remote::APPLY_TIMEOUT);
    request
}

/// A channel to the sidecar at `addr`.
async fn connect(addr: &str, tls: &super::client_tls::ClientTlsArgs) -> Result<Channel, String> {
    let url = format!("{}://{addr}", tls.scheme());
    let mut endpoint =
        Endpoint::from_shared(url.clone()).map_err(|err| format!("bad address {url}: {err}"))?;
    if let Some(config) = tls.tonic()? {
        endpoint = endpoint
            .tls_config(config)
            .map_err(|err| format!("TLS for {url}: {}", super::remote::error_chain(&err)))?;
    }
    // The sidecar answers a Lifecycle call by its own push timeout (queued,
    // if the reload is not done by then), which this side does not know: a
    // live sidecar answers HTTP/2 pings at once, even while a reload runs,
    // so a peer that stops answering them (a stopped process, a port that
    // is not a sidecar) is given up on within seconds; the call's own bound
    // is a backstop far above any push timeout.
    let endpoint = endpoint
        .connect_timeout(super::remote::CONNECT_TIMEOUT)
        .http2_keep_alive_interval(super::remote::PING_EVERY)
        .keep_alive_timeout(super::remote::PING_ANSWERED_WITHIN)
        .keep_alive_while_idle(true)
        .timeout(super::remote::APPLY_TIMEOUT);
    // `connect_timeout` bounds the TCP connect alone, the TLS config the
    // handshake alone: this bounds the whole of it (name lookup included),
    // so the connection is given up on within `CONNECT_TIMEOUT`.
    match tokio::time::timeout(super::remote::CONNECT_TIMEOUT, endpoint.connect()).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(err)) => Err(format!(
            "cannot reach the sidecar at {url}: {}",
            super::remote::error_chain(&err)
        )),
        Err(_) => Err(format!(
            "cannot reach the sidecar at {url}: connection timed out: no {} within {}s",
            if tls.scheme() == "https" {
                "TCP connection and TLS handshake"
            } else {
                "TCP connection"
            },
            super::remote::CONNECT_TIMEOUT.as_secs()
        )),
    }
}

/// The admin token (else the app token) from the environment, as the
/// header it goes in, read as the sidecar reads them:
/// `REWIRE_ADMIN_TOKEN`, else `DAPR_API_TOKEN`, else `REWIRE_API_TOKEN`;
/// an empty variable is no token, one that is not valid UTF-8 (or not a
/// valid header value) an error naming it, before anything is sent.
fn env_token() -> Result<Option<Token>, String> {
    use super::remote::token_var;
    let admin = token_var("REWIRE_ADMIN_TOKEN")?.map(|t| (ADMIN_TOKEN_HEADER, t));
    let app = token_var("DAPR_API_TOKEN")?.or(token_var("REWIRE_API_TOKEN")?);
    let Some((header, token)) = admin.or_else(|| app.map(|t| (APP_TOKEN_HEADER, t))) else {
        return Ok(None);
    };
    let value = token
        .parse::<MetadataValue<_>>()
        .map_err(|_| "the token in the environment is not a valid header value".to_string())?;
    Ok(Some((header, value)))
}

/// A token and the header it goes in.
type Token = (&'static str, MetadataValue<tonic::metadata::Ascii>);

/// `request` with `token`, if any.
fn with_token<T>(mut request: Request<T>, token: &Option<Token>) -> Request<T> {
    if let Some((header, value)) = token {
        request.metadata_mut().insert(*header, value.clone());
    }
    request
}

/// What the sidecar's answer is, for the exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answered {
    /// Applied (or nothing to change).
    Done,
    /// Applied, but an update failed after the commit (see
    /// [`update_failed`]).
    UpdateFailed,
    /// Still waiting behind other reloads: it will be applied or rejected.
    Queued,
    /// Rejected or rolled back: nothing changed.
    Refused,
}

impl Answered {
    fn of(answer: &ApplyConfigurationResponse) -> Self {
        match (answer.accepted, answer.outcome.as_str()) {
            (true, _) if update_failed(answer) => Answered::UpdateFailed,
            (true, _) => Answered::Done,
            (false, "queued") => Answered::Queued,
            (false, _) => Answered::Refused,
        }
    }

    fn exit_code(self) -> u8 {
        match self {
            Answered::Done => 0,
            Answered::Refused => 1,
            Answered::Queued => EXIT_QUEUED,
            Answered::UpdateFailed => EXIT_UPDATE_FAILED,
        }
    }
}

/// Whether an ACK says an update failed after the commit: an action
/// `failed` (the pushed component's, or a dependent's the push
/// re-resolved: its staged update panicked when applied), or an error
/// that is not a note about a component that did not fail (the reload
/// panicked after its commit). A note about a marked component whose
/// best-effort retry failed (kept as it runs, `unchanged`), which an
/// older sidecar sent in the ACK's errors, does not make the push less in
/// force (see `ReloadRecord::failure_lines_among`).
fn update_failed(answer: &ApplyConfigurationResponse) -> bool {
    let acted: Vec<(&str, bool)> = answer
        .actions
        .iter()
        .map(|(key, action)| (key.as_str(), action == "failed"))
        .collect();
    let errors = answer.errors.iter().map(String::as_str);
    acted.iter().any(|(_, failed)| *failed)
        || !rewire_runtime::ReloadRecord::failure_lines_among(errors, &acted).is_empty()
}

/// Prints the sidecar's answer about `key`; exits 1 on a rejection,
/// [`EXIT_QUEUED`] when the push is queued, [`EXIT_UPDATE_FAILED`] when
/// an update failed after the commit.
/// Whatever the sidecar says (reasons, names, outcomes) is shown with its
/// control characters escaped.
fn print_answer(key: &str, answer: ApplyConfigurationResponse) -> ExitCode {
    use super::remote::one_line;
    use std::fmt::Write as _;
    let answered = Answered::of(&answer);
    let code = ExitCode::from(answered.exit_code());
    let mut out = String::new();
    if answered == Answered::Queued {
        let _ = writeln!(
            out,
            "{key}: queued, not applied yet (generation {} serving); the sidecar will still \
             apply or reject it: follow it with `rewire status` rather than pushing again",
            answer.generation
        );
        for reason in answer.errors {
            let _ = writeln!(out, "  {}", one_line(&reason));
        }
        super::print_stdout(&out);
        return code;
    }
    if answer.accepted {
        let _ = writeln!(
            out,
            "{key}: {} (generation {})",
            one_line(&answer.outcome),
            answer.generation
        );
        let mut actions: Vec<_> = answer
            .actions
            .into_iter()
            .filter(|(_, a)| a != "unchanged")
            .collect();
        actions.sort();
        for (component, action) in actions {
            let _ = writeln!(out, "  {}: {}", one_line(&component), one_line(&action));
        }
        super::print_stdout(&out);
        // Applied, but a component's update failed after the commit: it
        // runs as before (or with part of the new configuration), and
        // pushing again retries it.
        if answered == Answered::UpdateFailed {
            eprintln!(
                "error: {key}: generation {} applied, but a component's update failed after the \
                 commit: the new configuration is not wholly in force (check `rewire status`; \
                 pushing again retries it)",
                answer.generation
            );
        }
        for error in answer.errors {
            eprintln!("  {}", one_line(&error));
        }
        code
    } else {
        eprintln!(
            "{key}: {} (generation {} keeps serving)",
            one_line(&answer.outcome),
            answer.generation
        );
        for error in answer.errors {
            eprintln!("  {}", one_line(&error));
        }
        code
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error whose text is `text`, caused by `source`.
    #[derive(Debug)]
    struct Wrapped(&'static str, Option<std::io::Error>);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_ref().map(|e| e as _)
        }
    }

    #[test]
    fn a_connection_not_made_or_a_stream_refused_unread_was_never_sent() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(never_sent(&Wrapped("transport error", Some(refused))));
        assert!(never_sent(&Wrapped("tcp connect error", None)));
        assert!(never_sent(&Wrapped(
            "stream error received: refused stream before processing any application logic",
            None
        )));
        // A connection that broke, or an answer that never came: unknown.
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!never_sent(&Wrapped("connection error", Some(reset))));
        assert!(!never_sent(&Wrapped("keep-alive timed out", None)));
    }

    fn answer(accepted: bool, outcome: &str) -> ApplyConfigurationResponse {
        ApplyConfigurationResponse {
            accepted,
            outcome: outcome.to_string(),
            ..ApplyConfigurationResponse::default()
        }
    }

    #[test]
    fn a_metadata_field_given_twice_is_named() {
        let fields = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect()
        };
        assert_eq!(repeated_field(&fields(&[("a", "1"), ("b", "1")])), None);
        assert_eq!(
            repeated_field(&fields(&[("ttl", "1"), ("b", "2"), ("ttl", "3")])).as_deref(),
            Some("metadata field `ttl` given twice (`1`, then `3`): give each field once")
        );
    }

    #[test]
    fn a_secret_field_given_twice_is_named_without_its_values() {
        let fields: Vec<(String, String)> =
            [("redisPassword", "old-pw"), ("redisPassword", "new-pw")]
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect();
        let error = repeated_field(&fields).unwrap_or_default();
        assert_eq!(
            error,
            "metadata field `redisPassword` given twice (`[secret]`, then `[secret]`): give each field once"
        );
        assert!(
            !error.contains("old-pw") && !error.contains("new-pw"),
            "{error}"
        );
    }

    #[test]
    fn only_a_backlog_marked_refusal_is_busy() {
        use tonic_types::{ErrorDetails, StatusExt};
        let marked = |reason: &str, domain: &str| {
            let info = ErrorDetails::with_error_info(reason, domain, HashMap::new());
            tonic::Status::with_error_details(tonic::Code::ResourceExhausted, "64 pushes", info)
        };
        let busy = failed_by_status(&marked("PUSH_BACKLOG_FULL", "rewire"));
        assert!(matches!(busy, Failed::Busy(ref said) if said == "ResourceExhausted: 64 pushes"));
        // Over max_request_bytes (the sidecar's `ClearLimit`): never passes.
        let too_large = failed_by_status(&tonic::Status::resource_exhausted(
            "request message of 9000000 bytes is larger than the sidecar accepts (4194304 \
             bytes, max_request_bytes)",
        ));
        assert!(
            matches!(too_large, Failed::Refused(ref said) if said.contains("9000000 bytes")),
            "{too_large:?}"
        );
        for other in [
            marked("QUOTA", "rewire"),
            marked("PUSH_BACKLOG_FULL", "dapr.io"),
        ] {
            let refused = failed_by_status(&other);
            assert!(matches!(refused, Failed::Refused(_)), "{refused:?}");
        }
        let refused = failed_by_status(&tonic::Status::invalid_argument("no kind"));
        assert!(matches!(refused, Failed::Refused(_)), "{refused:?}");
    }

    #[test]
    fn only_a_status_saying_the_push_was_not_processed_is_a_refusal() {
        use tonic::Code;
        use tonic_types::{ErrorDetails, StatusExt};
        for code in [
            Code::InvalidArgument,
            Code::Unauthenticated,
            Code::PermissionDenied,
            Code::Unimplemented,
            Code::FailedPrecondition,
            Code::ResourceExhausted,
        ] {
            let failed = failed_by_status(&tonic::Status::new(code, "said"));
            assert!(matches!(failed, Failed::Refused(_)), "{code:?}: {failed:?}");
        }
        for code in [
            Code::DeadlineExceeded,
            Code::Cancelled,
            Code::Unknown,
            Code::Internal,
            Code::Aborted,
            Code::Unavailable,
        ] {
            let failed = failed_by_status(&tonic::Status::new(code, "said"));
            assert!(matches!(failed, Failed::Unknown(_)), "{code:?}: {failed:?}");
        }
        // The sidecar's own "cut short by shutdown": nothing in force.
        let info = ErrorDetails::with_error_info("RELOAD_CUT_SHORT", "rewire", HashMap::new());
        let cut_short =
            tonic::Status::with_error_details(Code::Unavailable, "reload stopped", info);
        let failed = failed_by_status(&cut_short);
        assert!(matches!(failed, Failed::Refused(_)), "{failed:?}");
    }

    /// The text of a failure, whatever its kind.
    fn failure_text(failed: &Failed) -> &str {
        match failed {
            Failed::Refused(t) | Failed::Unanswered(t) | Failed::Busy(t) | Failed::Unknown(t) => t,
        }
    }

    /// A status message carrying terminal control sequences (tonic
    /// percent-decodes `grpc-message`, so a sidecar or a proxy can send
    /// any byte) is shown escaped, whatever the code. Before: written raw,
    /// an OSC 52 sequence set the terminal's clipboard.
    #[test]
    fn control_characters_in_a_status_message_are_escaped() {
        use tonic::Code;
        let osc52 = "a\u{1b}]52;c;aGk=\u{7}\r\nb";
        for code in [
            Code::InvalidArgument,
            Code::Internal,
            Code::ResourceExhausted,
        ] {
            let failed = failed_by_status(&tonic::Status::new(code, osc52));
            let text = failure_text(&failed);
            assert!(!text.contains(['\u{1b}', '\u{7}', '\r', '\n']), "{text:?}");
            assert!(text.contains(r"a\u{1b}]52;c;aGk=\u{7}\r\nb"), "{text}");
        }
        let cause = Wrapped("connection reset \u{1b}[2J", None);
        let said = said_with_cause(&tonic::Status::unavailable("x\u{1b}"), &cause);
        assert!(!said.contains('\u{1b}'), "{said:?}");
        let escaped = Failed::Refused("TLS: \u{1b}]52;c;x\u{7}".into()).escaped();
        assert!(!failure_text(&escaped).contains('\u{1b}'), "{escaped:?}");
    }

    #[test]
    fn each_outcome_has_its_exit_code() {
        for (accepted, outcome, code) in [
            (true, "applied", 0),
            (true, "no_change", 0),
            (false, "rejected", 1),
            (false, "rolled_back", 1),
            (false, "queued", EXIT_QUEUED),
        ] {
            assert_eq!(
                Answered::of(&answer(accepted, outcome)).exit_code(),
                code,
                "{outcome}"
            );
        }
    }

    #[test]
    fn an_update_failed_after_the_commit_is_not_done() {
        let failed = ApplyConfigurationResponse {
            actions: [("state/orders".to_string(), "failed".to_string())].into(),
            errors: vec!["state/orders: update panicked".into()],
            ..answer(true, "applied")
        };
        assert_eq!(Answered::of(&failed), Answered::UpdateFailed);
        assert_eq!(Answered::of(&failed).exit_code(), EXIT_UPDATE_FAILED);
        let clean = ApplyConfigurationResponse {
            actions: [("state/orders".to_string(), "updated_in_place".to_string())].into(),
            ..answer(true, "applied")
        };
        assert_eq!(Answered::of(&clean), Answered::Done);
    }

    /// A dependent's update the push caused failed (its staged update
    /// panicked), or the reload panicked after its commit (a line naming
    /// no component): exit 6. Before (ac67227): exit 0, only the pushed
    /// component's action judged.
    #[test]
    fn any_update_failed_after_the_commit_fails_the_push() {
        let dependent = ApplyConfigurationResponse {
            errors: vec!["state/x: staged in-place update panicked when applied: boom".into()],
            actions: [
                (
                    "secret_store/vault".to_string(),
                    "updated_in_place".to_string(),
                ),
                ("state/x".to_string(), "failed".to_string()),
            ]
            .into(),
            ..answer(true, "applied")
        };
        assert_eq!(Answered::of(&dependent).exit_code(), EXIT_UPDATE_FAILED);
        let panicked = ApplyConfigurationResponse {
            errors: vec!["the reload panicked after its commit: boom".into()],
            actions: [("state/orders".to_string(), "updated_in_place".to_string())].into(),
            ..answer(true, "applied")
        };
        assert_eq!(Answered::of(&panicked).exit_code(), EXIT_UPDATE_FAILED);
    }

    /// A push applied whole exits 0, whatever note `errors` carries about
    /// another component that did not fail (a marked one whose retry
    /// failed, kept as it runs, `unchanged`: as an older sidecar sends
    /// it). Before ac67227: exit 6, "update failed after the commit", for
    /// a push in force.
    #[test]
    fn another_components_failure_does_not_fail_the_push() {
        let noted = ApplyConfigurationResponse {
            errors: vec![
                "state/x: init failed: down; it is not as declared".into(),
                "… and 2 more lines".into(),
            ],
            actions: [
                ("state/orders".to_string(), "updated_in_place".to_string()),
                ("state/x".to_string(), "unchanged".to_string()),
            ]
            .into(),
            ..answer(true, "applied")
        };
        assert_eq!(Answered::of(&noted), Answered::Done);
        assert_eq!(Answered::of(&noted).exit_code(), 0);
    }
}
