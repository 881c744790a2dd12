//! How the APIs are served: addresses, tokens, limits.

use std::ffi::OsString;
use std::time::Duration;

use crate::auth::ApiToken;
use crate::tls::TlsSettings;

/// Default gRPC address (Dapr's).
pub const DEFAULT_GRPC_ADDR: &str = "127.0.0.1:50001";
/// Default HTTP address (Dapr's).
pub const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:3500";

/// How much longer than the longest unary call a replaced instance still
/// in use is kept (see [`ApiOptions::runtime_options`]): for the answer
/// to be written and the call's hold let go.
pub const DRAIN_MARGIN: Duration = Duration::from_secs(5);

/// The longest a timing option may be (about ten years, never in effect):
/// deadlines are computed from them, and one past what an instant holds
/// (`Duration::MAX` for "never") would panic in a connection's task.
pub const LONGEST_TIMING: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How the APIs are served.
#[derive(Debug, Clone)]
pub struct ApiOptions {
    /// Required on every app-facing call when set (`dapr-api-token`).
    pub app_token: Option<ApiToken>,
    /// Required on every Lifecycle call when set (in `rewire-admin-token`
    /// or `dapr-api-token`); when unset, the app token guards the Lifecycle
    /// API too.
    pub admin_token: Option<ApiToken>,
    /// Largest request body accepted, in bytes.
    pub max_request_bytes: usize,
    /// Request bytes one listener holds, across all its connections and
    /// streams, at most: bodies being read, and gRPC requests by what they
    /// hold decoded while their calls run (at least one largest body read
    /// and decoded, twice `max_request_bytes`); a request that would pass
    /// it is refused (`RESOURCE_EXHAUSTED`, retry), so clients parking
    /// bodies cannot hold connections × streams × `max_request_bytes`.
    pub max_request_bytes_in_flight: usize,
    /// Largest answer built for a client, in bytes: bulk state and
    /// configuration answers over it are refused (`RESOURCE_EXHAUSTED`,
    /// HTTP 413), and a subscriber may have at most this many bytes queued.
    pub max_response_bytes: usize,
    /// Reply bytes one listener holds for clients that have not taken
    /// them yet (a client granting no HTTP/2 window, or not reading),
    /// across all its connections: the answer of a repeatable read (a
    /// state value, a secret, configuration) that would pass it is
    /// dropped and refused (`RESOURCE_EXHAUSTED`, HTTP 429
    /// `ERR_TOO_MANY_REQUESTS`, retry) unless its connection holds
    /// nothing, so a client that reads is served whatever others hold:
    /// the bound is this plus one answer per connection. A gRPC read
    /// answered by tonic's codec (the fast path declined it) is charged
    /// as it is produced, and refused in its trailers. Answers of calls
    /// that changed state are counted but always sent. Streamed replies
    /// (files, subscriptions) are bounded by their own queues instead.
    pub max_response_bytes_in_flight: usize,
    /// The same bound for each connection (refused past it unless the
    /// connection holds nothing): a client that does not read holds about
    /// this much at most, whatever streams it opens and however it asks
    /// (a `grpc-encoding`, extra messages). The default takes 32
    /// concurrent answers of the largest value `max_request_bytes` lets a
    /// client save (an SDK's fan-out on one channel).
    pub max_response_bytes_in_flight_per_connection: usize,
    /// Longest a unary call of the Dapr API may take.
    pub request_timeout: Duration,
    /// Connections open at once per listener (gRPC, HTTP), at most; beyond
    /// it, new clients wait in the kernel's backlog.
    pub max_connections: usize,
    /// A connection with no request in flight for this long is closed,
    /// whatever bytes move (keepalive pings, a request head trickled in),
    /// and so is one whose requests move no byte for this long (gRPC
    /// connections are pinged at a third of it, so a live client's quiet
    /// subscription stays open). Keep it above `request_timeout`: an
    /// HTTP/1 call in flight moves no byte either.
    pub idle_timeout: Duration,
    /// After shutdown starts, how long calls in flight may finish before
    /// every connection is cut.
    pub shutdown_grace: Duration,
    /// Longest a Lifecycle call may take (raised to the runtime's init
    /// timeout plus 15 s when shorter): a push is answered before it, or
    /// before the caller's own deadline when sooner, with its outcome or
    /// `queued` (not applied yet).
    pub push_timeout: Duration,
    /// Pub/sub topic streams open at once on the gRPC server (Dapr's
    /// `SubscribeTopicEventsAlpha1` and Layotto's `SubscribeTopicEvents`
    /// together; each holds a broker subscription, with Redis a
    /// connection of its own); one more is refused `RESOURCE_EXHAUSTED`.
    pub max_topic_streams: usize,
    /// File uploads running at once (the HTTP file `PUT` and Layotto's
    /// `PutFile` together; each holds its store's write, with the `local`
    /// store two open files, for as long as its client keeps sending); one
    /// more is refused (HTTP 429 `ERR_TOO_MANY_REQUESTS`, gRPC
    /// `RESOURCE_EXHAUSTED`), its place given back when an upload ends.
    pub max_uploads: usize,
    /// File downloads running at once (the HTTP file `GET` and Layotto's
    /// `GetFile` together; each holds its store's reader, with the `local`
    /// store an open file, and a few chunks for as long as its client
    /// takes one every 30 s); one more is refused (HTTP 429
    /// `ERR_TOO_MANY_REQUESTS`, gRPC `RESOURCE_EXHAUSTED`), its place
    /// given back when a download ends.
    pub max_downloads: usize,
    /// TLS on the listeners (default: none, plain text).
    pub tls: TlsSettings,
    /// The app (`--app-port`), to which configuration updates of HTTP
    /// subscriptions are posted; none: `ERR_APP_CHANNEL_NIL`. The metadata
    /// APIs list the subscriptions [`serve_app`](crate::app::serve_app)
    /// takes over a clone of it.
    pub app_channel: Option<crate::app::AppChannel>,
    /// Sent to the app on every call when set (Dapr's `APP_API_TOKEN`, as
    /// `dapr-api-token`); the app channel is given it with
    /// [`AppChannel::with_app_token`](crate::app::AppChannel::with_app_token).
    pub app_api_token: Option<rewire_runtime::SecretString>,
}

impl Default for ApiOptions {
    fn default() -> Self {
        Self {
            app_token: None,
            admin_token: None,
            max_request_bytes: 4 * 1024 * 1024,
            max_request_bytes_in_flight: 64 * 1024 * 1024,
            max_response_bytes: 4 * 1024 * 1024,
            max_response_bytes_in_flight: 512 * 1024 * 1024,
            max_response_bytes_in_flight_per_connection: 128 * 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            push_timeout: Duration::from_secs(45),
            max_connections: 1024,
            idle_timeout: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(5),
            max_topic_streams: 1024,
            max_uploads: 256,
            max_downloads: 256,
            tls: TlsSettings::default(),
            app_channel: None,
            app_api_token: None,
        }
    }
}

impl ApiOptions {
    /// The budget of request bytes of one listener: at least one largest
    /// body and its framing, read and decoded (while tonic's codec decodes
    /// a message, its bytes are still charged as read).
    pub(crate) fn body_budget(&self) -> std::sync::Arc<crate::connection::BodyBudget> {
        let one_body = self
            .max_request_bytes
            .saturating_mul(2)
            .saturating_add(64 * 1024);
        crate::connection::BodyBudget::new(self.max_request_bytes_in_flight.max(one_body))
    }

    /// The reply budgets of one listener's connections.
    pub(crate) fn reply_limits(&self) -> crate::reply_budget::ReplyLimits {
        crate::reply_budget::ReplyLimits::new(
            self.max_response_bytes_in_flight_per_connection,
            self.max_response_bytes_in_flight,
        )
    }

    /// The runtime's options for serving these APIs: a replaced instance
    /// still in use is kept (see
    /// [`rewire_runtime::RuntimeOptions::drain_grace`]) as long
    /// as a unary call may last, and [`DRAIN_MARGIN`] more, so a call that
    /// loaded it before a reload — a slow backend, a resiliency policy's
    /// retries — finishes on it instead of meeting it closed (the
    /// runtime's own default, 10 s, is shorter than `request_timeout`).
    /// A streamed file transfer, bounded by its progress rather than a
    /// deadline, may still outlast it.
    pub fn runtime_options(&self) -> rewire_runtime::RuntimeOptions {
        let defaults = rewire_runtime::RuntimeOptions::default();
        rewire_runtime::RuntimeOptions {
            drain_grace: defaults
                .drain_grace
                .max(self.request_timeout.saturating_add(DRAIN_MARGIN)),
            ..defaults
        }
    }

    /// Refuses a token no caller could present (a line feed or another
    /// control character in it), naming the field, never the value: the
    /// check [`from_env`](Self::from_env) makes of the variables, for
    /// options an embedding program builds itself.
    pub fn check_tokens(&self) -> Result<(), String> {
        let tokens = [
            ("ApiOptions::app_token", &self.app_token),
            ("ApiOptions::admin_token", &self.admin_token),
        ];
        for (field, token) in tokens {
            if let Some(token) = token {
                token.check_presentable(|value| check_expected_token(field, value))?;
            }
        }
        Ok(())
    }

    /// Refuses timing options the servers cannot use, naming the field:
    /// a `request_timeout` or `idle_timeout` of zero (every call, or every
    /// connection, would end at once, and gRPC would ping without pause),
    /// and any of `request_timeout`, `idle_timeout`, `shutdown_grace` and
    /// `push_timeout` longer than [`LONGEST_TIMING`].
    pub fn check_timings(&self) -> Result<(), String> {
        let timings = [
            ("request_timeout", self.request_timeout, true),
            ("idle_timeout", self.idle_timeout, true),
            ("shutdown_grace", self.shutdown_grace, false),
            ("push_timeout", self.push_timeout, false),
        ];
        for (field, value, positive) in timings {
            if positive && value.is_zero() {
                return Err(format!("ApiOptions::{field} is zero: it must be positive"));
            }
            if value > LONGEST_TIMING {
                return Err(format!(
                    "ApiOptions::{field} is {value:?}, longer than the longest accepted \
                     ({LONGEST_TIMING:?}, about ten years)"
                ));
            }
        }
        Ok(())
    }

    /// Defaults, with tokens from `DAPR_API_TOKEN` (or `REWIRE_API_TOKEN`),
    /// `REWIRE_ADMIN_TOKEN` and `APP_API_TOKEN` (sent to the app); empty
    /// variables count as unset. A token variable set to something that
    /// is not valid UTF-8 is an error naming it: taken for unset, it would
    /// leave the API it guards open (or, for `APP_API_TOKEN`, the app
    /// unable to tell the sidecar's calls apart). So is an `APP_API_TOKEN`
    /// that cannot be sent as a header (a control character, a line feed).
    pub fn from_env() -> Result<Self, String> {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// [`from_env`](Self::from_env), each variable read with `lookup`.
    fn from_vars(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Self, String> {
        let var = |name: &str| -> Result<Option<String>, String> {
            match lookup(name).map(OsString::into_string) {
                None => Ok(None),
                Some(Ok(text)) => Ok(Some(text).filter(|text| !text.is_empty())),
                Some(Err(_)) => Err(format!(
                    "the environment variable {name} is set but is not valid UTF-8: a token \
                     must be text (unset it, or set it empty, for no token)"
                )),
            }
        };
        // Every token variable is read, so a bad one is never skipped.
        let dapr = var("DAPR_API_TOKEN")?;
        let rewire = var("REWIRE_API_TOKEN")?;
        let admin = var("REWIRE_ADMIN_TOKEN")?;
        let to_app = var("APP_API_TOKEN")?;
        if let Some(token) = &to_app {
            check_app_token(token)?;
        }
        for (name, token) in [
            ("DAPR_API_TOKEN", &dapr),
            ("REWIRE_API_TOKEN", &rewire),
            ("REWIRE_ADMIN_TOKEN", &admin),
        ] {
            if let Some(token) = token {
                check_expected_token(&format!("the environment variable {name}"), token)?;
            }
        }
        Ok(Self {
            app_token: dapr.or(rewire).map(ApiToken::new),
            admin_token: admin.map(ApiToken::new),
            app_api_token: to_app.map(rewire_runtime::SecretString::new),
            ..Self::default()
        })
    }
}

/// Refuses an `APP_API_TOKEN` that cannot be sent to the app as the
/// `dapr-api-token` header or gRPC metadata (a control character, such as
/// a line feed kept from the file it was read from): taken, the sidecar
/// started healthy but never called the app (no subscription delivered,
/// no configuration update). The error names the variable, never the
/// value. Bytes past ASCII are sent as they are, as Dapr does.
fn check_app_token(token: &str) -> Result<(), String> {
    let header = reqwest::header::HeaderValue::from_str(token).is_ok();
    let metadata = tonic::metadata::AsciiMetadataValue::try_from(token.as_bytes()).is_ok();
    if header && metadata {
        return Ok(());
    }
    Err(
        "the environment variable APP_API_TOKEN is not a valid header value: it must not \
         hold control characters such as a line feed (it is sent to the app as \
         dapr-api-token)"
            .to_string(),
    )
}

/// Refuses a token the sidecar expects (`name` the variable or field it
/// was read from) that no header or gRPC metadata can carry: one holding
/// a control character other than a tab (a line feed kept from a mounted
/// secret file). Taken, the sidecar started healthy and refused every
/// call as unauthenticated. What a header value may hold is accepted,
/// bytes past ASCII and spaces around it included (HTTP/1 parsers strip
/// such spaces, h2 keeps them, so gRPC callers can present them). The
/// error names the variable, never the value.
fn check_expected_token(name: &str, token: &str) -> Result<(), String> {
    if reqwest::header::HeaderValue::from_str(token).is_ok() {
        return Ok(());
    }
    Err(format!(
        "{name} cannot be presented as a header value: it must not hold control \
         characters such as a line feed (callers send it as a header)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A token the sidecar expects with a line feed kept from its file, or
    /// another control character, is refused at start, naming the variable
    /// and not the value; what a header can carry (a tab, spaces around
    /// it, which gRPC keeps, bytes past ASCII) is taken. Before: taken, and
    /// every call was refused as unauthenticated while the sidecar
    /// reported healthy.
    #[test]
    fn an_expected_token_no_header_can_carry_is_refused_naming_its_variable() {
        for name in ["DAPR_API_TOKEN", "REWIRE_API_TOKEN", "REWIRE_ADMIN_TOKEN"] {
            for bad in ["s3cret\n", "s3\x01cret", "s3cret\x7f"] {
                let lookup = |asked: &str| (asked == name).then(|| OsString::from(bad));
                let refused = ApiOptions::from_vars(lookup).expect_err("refused");
                assert!(refused.contains(name), "{refused}");
                assert!(!refused.contains("s3"), "the value is not shown: {refused}");
            }
            for good in ["s3 cr\u{e9}t", " s3cret", "s3\tcret", "s3cret\u{85}"] {
                let lookup = |asked: &str| (asked == name).then(|| OsString::from(good));
                assert!(ApiOptions::from_vars(lookup).is_ok(), "{name}: {good:?}");
            }
        }
    }

    /// Tokens an embedding program sets in the options are checked as the
    /// variables are, naming the field, never the value. Before: taken.
    #[test]
    fn option_tokens_no_header_can_carry_are_refused_naming_the_field() {
        for (field, options) in [
            (
                "ApiOptions::app_token",
                ApiOptions {
                    app_token: Some(ApiToken::new("s3cret\n")),
                    ..ApiOptions::default()
                },
            ),
            (
                "ApiOptions::admin_token",
                ApiOptions {
                    admin_token: Some(ApiToken::new("s3\rcret")),
                    ..ApiOptions::default()
                },
            ),
        ] {
            let refused = options.check_tokens().expect_err(field);
            assert!(refused.contains(field), "{refused}");
            assert!(!refused.contains("s3"), "the value is not shown: {refused}");
        }
        let fine = ApiOptions {
            app_token: Some(ApiToken::new(" s3cret")),
            ..ApiOptions::default()
        };
        assert_eq!(fine.check_tokens(), Ok(()));
    }

    /// A token variable set to bytes that are not UTF-8 is refused, naming
    /// it, whichever it is. Before: taken for unset, so the API it guards
    /// was open.
    #[test]
    fn a_token_variable_that_is_not_utf8_is_refused_naming_it() {
        use std::os::unix::ffi::OsStringExt;
        for bad in [
            "DAPR_API_TOKEN",
            "REWIRE_API_TOKEN",
            "REWIRE_ADMIN_TOKEN",
            "APP_API_TOKEN",
        ] {
            let lookup = |name: &str| match name {
                name if name == bad => Some(OsString::from_vec(vec![0xff, b'a'])),
                "DAPR_API_TOKEN" => Some(OsString::from("app")),
                _ => None,
            };
            let refused = ApiOptions::from_vars(lookup).expect_err("refused");
            assert!(
                refused.contains(bad) && refused.contains("not valid UTF-8"),
                "{refused}"
            );
        }
        let taken = ApiOptions::from_vars(|name| match name {
            "REWIRE_API_TOKEN" => Some(OsString::from("app")),
            "REWIRE_ADMIN_TOKEN" => Some(OsString::new()),
            "APP_API_TOKEN" => Some(OsString::from("to-app")),
            _ => None,
        })
        .expect("text tokens");
        assert!(taken.app_token.is_some() && taken.admin_token.is_none());
        let to_app = taken.app_api_token.as_ref().map(|t| t.expose());
        assert_eq!(to_app, Some("to-app"));
    }

    /// An `APP_API_TOKEN` that cannot be a header value is refused at
    /// start, naming it and not saying it. Before: rewire started healthy
    /// and never called the app (no subscription delivered, configuration
    /// subscriptions answered `ERR_APP_CHANNEL_NIL`). Bytes past ASCII
    /// are taken, sent as they are (as Dapr).
    #[test]
    fn an_app_token_that_cannot_be_a_header_value_is_refused_without_its_value() {
        for bad in ["a\nb", "s3cret\n", "a\rb", "a\0b", "a\u{7f}b"] {
            let refused = ApiOptions::from_vars(|name| {
                (name == "APP_API_TOKEN").then(|| OsString::from(bad))
            })
            .expect_err("refused");
            assert!(
                refused.contains("APP_API_TOKEN") && refused.contains("not a valid header value"),
                "{refused}"
            );
            let value = bad.trim_end_matches('\n');
            assert!(!refused.contains(value), "the value was said: {refused}");
        }
        for good in ["tökén", "a\tb", "a b"] {
            let taken = ApiOptions::from_vars(|name| {
                (name == "APP_API_TOKEN").then(|| OsString::from(good))
            })
            .unwrap_or_else(|e| panic!("{good:?} refused: {e}"));
            let to_app = taken.app_api_token.as_ref().map(|t| t.expose());
            assert_eq!(to_app, Some(good));
        }
    }

    /// Zero and overflowing timings are refused naming the field; before,
    /// `idle_timeout: Duration::MAX` panicked in every connection's task.
    #[test]
    fn unusable_timings_are_refused_naming_the_field() {
        assert_eq!(ApiOptions::default().check_timings(), Ok(()));
        let longest = ApiOptions {
            request_timeout: LONGEST_TIMING,
            idle_timeout: LONGEST_TIMING,
            shutdown_grace: Duration::ZERO,
            push_timeout: Duration::ZERO,
            ..ApiOptions::default()
        };
        assert_eq!(longest.check_timings(), Ok(()));
        type Set = fn(&mut ApiOptions, Duration);
        // Each field, and whether zero is refused (a zero grace cuts at
        // once; a zero push timeout is raised to the init timeout's).
        let fields: [(&str, Set, bool); 4] = [
            ("request_timeout", |o, d| o.request_timeout = d, true),
            ("idle_timeout", |o, d| o.idle_timeout = d, true),
            ("shutdown_grace", |o, d| o.shutdown_grace = d, false),
            ("push_timeout", |o, d| o.push_timeout = d, false),
        ];
        for (field, set, zero_refused) in fields {
            let mut options = ApiOptions::default();
            set(&mut options, Duration::MAX);
            let refused = options.check_timings().expect_err(field);
            assert!(
                refused.contains(field) && refused.contains("longer"),
                "{refused}"
            );
            set(&mut options, Duration::ZERO);
            let zero = options.check_timings();
            if zero_refused {
                let refused = zero.expect_err(field);
                assert!(
                    refused.contains(field) && refused.contains("zero"),
                    "{refused}"
                );
            } else {
                assert_eq!(zero, Ok(()), "{field}");
            }
        }
    }

    #[test]
    fn a_replaced_instance_is_kept_for_the_longest_unary_call() {
        let mut options = ApiOptions::default();
        let grace = |options: &ApiOptions| options.runtime_options().drain_grace;
        assert_eq!(grace(&options), Duration::from_secs(35));
        options.request_timeout = Duration::from_secs(90);
        assert_eq!(grace(&options), Duration::from_secs(95));
        // Never below the runtime's own.
        options.request_timeout = Duration::from_secs(1);
        assert_eq!(
            grace(&options),
            rewire_runtime::RuntimeOptions::default().drain_grace
        );
    }
}
