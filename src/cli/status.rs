//! `rewire status`: the running sidecar's status, from its HTTP API, as a
//! readable summary (or, with `--json`, the API's JSON as is).

use std::fmt::Write as _;
use std::process::ExitCode;

use serde_json::Value;

use super::print_json;
use super::remote::one_line;

/// How many of the last reloads the summary shows.
const RELOADS_SHOWN: usize = 5;

/// Prints the status of the sidecar at `http_addr`: a summary, or the
/// JSON the sidecar answered when `json` is set.
pub async fn status_command(
    http_addr: &str,
    json: bool,
    tls: &super::client_tls::ClientTlsArgs,
) -> ExitCode {
    let url = format!("{}://{http_addr}/v1.0/rewire/status", tls.scheme());
    let client = match http_client(tls) {
        Ok(client) => client,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let request = match request(&client, &url) {
        Ok(request) => request,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::FAILURE;
        }
    };
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) => {
            eprintln!(
                "error: cannot reach the sidecar at {url}: {}",
                super::remote::error_chain(&err)
            );
            return ExitCode::FAILURE;
        }
    };
    let status = response.status();
    // Not followed (the tokens would go where it points): a sidecar never
    // redirects its status.
    if status.is_redirection() {
        eprintln!("error: not a rewire sidecar at {http_addr}: it answered {status} (a redirect, not followed)");
        return ExitCode::FAILURE;
    }
    let body = super::remote::body_within(response, super::remote::STATUS_BODY_LIMIT).await;
    let body = body.and_then(|bytes| {
        serde_json::from_slice::<Value>(&bytes).map_err(|err| format!("not JSON: {err}"))
    });
    match body {
        Ok(body) if status.is_success() => {
            if json {
                print_json(&body);
            } else {
                super::print_stdout(&summary(&body));
            }
            ExitCode::SUCCESS
        }
        Ok(body) => {
            eprintln!("error: the sidecar answered {status}: {body}");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("error: the sidecar answered {status} with an unreadable body: {err}");
            ExitCode::FAILURE
        }
    }
}

/// An HTTP client, over TLS (rustls, ring) when `tls` asks for it, that
/// follows no redirect and goes through no proxy from the environment
/// (`HTTP_PROXY`, `ALL_PROXY`, which reqwest reads by default): the token
/// headers would go along. In plain text it reads no system certificate
/// ([`rewire_sidecar::plain_http`]): none found, or a bundle that does
/// not answer, must not fail or hold a status over `http://`.
fn http_client(tls: &super::client_tls::ClientTlsArgs) -> Result<reqwest::Client, String> {
    let builder = match tls.scheme() {
        "https" => reqwest::Client::builder().tls_backend_preconfigured(tls.rustls()?),
        _ => rewire_sidecar::plain_http::client_builder(),
    };
    builder
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(super::remote::CONNECT_TIMEOUT)
        .timeout(super::remote::STATUS_TIMEOUT)
        .build()
        .map_err(|err| format!("HTTP client: {err}"))
}

/// The status request, with the API and admin tokens from the environment
/// (a token variable that is not valid UTF-8 is an error naming it).
fn request(client: &reqwest::Client, url: &str) -> Result<reqwest::RequestBuilder, String> {
    use super::remote::token_var;
    let mut request = client.get(url);
    if let Some(token) = token_var("DAPR_API_TOKEN")?.or(token_var("REWIRE_API_TOKEN")?) {
        request = request.header("dapr-api-token", token);
    }
    // Status is admin data: with an admin token set, it needs that one.
    if let Some(token) = token_var("REWIRE_ADMIN_TOKEN")? {
        request = request.header("rewire-admin-token", token);
    }
    Ok(request)
}

/// The status as text: generation and app id, one line per component,
/// the last reloads and a pending retry.
pub(crate) fn summary(status: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "generation {}, app id {}",
        field(status, "generation"),
        field(status, "appId")
    );
    let components = list(status, "components");
    let _ = writeln!(out, "\ncomponents ({}):", components.len());
    for component in components {
        out.push_str(&component_line(component));
    }
    let reloads = list(status, "reloads");
    let skipped = reloads.len().saturating_sub(RELOADS_SHOWN);
    let _ = writeln!(out, "\nlast reloads (oldest first):");
    if reloads.is_empty() {
        out.push_str("  none\n");
    }
    for reload in &reloads[skipped..] {
        out.push_str(&reload_line(reload));
    }
    if let Some(retry) = status.get("pendingRetry").filter(|r| !r.is_null()) {
        let _ = writeln!(
            out,
            "\npending retry: {} reload, {} attempt(s), next at {} (unix ms)",
            field(retry, "trigger"),
            field(retry, "attempts"),
            field(retry, "next_at_unix_ms")
        );
    }
    out
}

/// `  kind/name  type  state[: reason]`.
fn component_line(component: &Value) -> String {
    let key = format!("{}/{}", field(component, "kind"), field(component, "name"));
    let mut line = format!(
        "  {key:<24} {:<16} {}",
        field(component, "type"),
        field(component, "state")
    );
    if let Some(reason) = component.get("reason").and_then(Value::as_str) {
        let _ = write!(line, ": {}", first_line(reason));
    }
    if let Some(breaker) = component.get("circuitBreaker") {
        let _ = write!(
            line,
            " (circuit breaker {}: {})",
            field(breaker, "policy"),
            field(breaker, "state")
        );
    }
    if let Some(breaker) = component.get("inboundCircuitBreaker") {
        let _ = write!(
            line,
            " (inbound circuit breaker {}: {})",
            field(breaker, "policy"),
            field(breaker, "state")
        );
    }
    line.push('\n');
    line
}

/// `  generation N  trigger  outcome[ (retry N)][: error's first line]`.
fn reload_line(reload: &Value) -> String {
    let mut line = format!(
        "  generation {:<4} {:<12} {}",
        field(reload, "generation"),
        field(reload, "trigger"),
        field(reload, "outcome")
    );
    if let Some(attempt) = reload
        .get("attempt")
        .and_then(Value::as_u64)
        .filter(|a| *a > 0)
    {
        let _ = write!(line, " (retry {attempt})");
    }
    if let Some(error) = reload.get("error").and_then(Value::as_str) {
        let _ = write!(line, ": {}", first_line(error));
    }
    line.push('\n');
    line
}

/// A field as text: strings unquoted (control characters escaped, see
/// [`one_line`]), anything missing as `?`.
fn field(value: &Value, name: &str) -> String {
    match value.get(name) {
        Some(Value::String(text)) => one_line(text),
        Some(Value::Null) | None => "?".to_string(),
        Some(other) => other.to_string(),
    }
}

/// A field's array, empty if missing.
fn list<'a>(value: &'a Value, name: &str) -> &'a [Value] {
    value
        .get(name)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The first line of a (possibly multi-line) message, its control
/// characters escaped (see [`one_line`](super::remote::one_line)).
fn first_line(text: &str) -> String {
    one_line(text.lines().next().unwrap_or(""))
}

#[cfg(test)]
mod tests {
    use super::{reload_line, summary};
    use serde_json::json;

    #[test]
    fn a_retried_reload_is_told_apart_from_fresh_input() {
        let fresh =
            json!({"generation": 2, "trigger": "watch", "outcome": "applied", "attempt": 0});
        let retried = json!({"generation": 2, "trigger": "watch", "outcome": "rolled_back",
                             "attempt": 2, "error": "probe/p: init failed: down"});
        assert_eq!(
            reload_line(&fresh),
            "  generation 2    watch        applied\n"
        );
        assert_eq!(
            reload_line(&retried),
            "  generation 2    watch        rolled_back (retry 2): probe/p: init failed: down\n"
        );
    }

    #[test]
    fn summary_lists_components_reloads_and_the_pending_retry() {
        let status = json!({
            "generation": 3,
            "appId": "shop",
            "components": [
                {"kind": "state", "name": "orders", "type": "memory", "state": "ready",
                 "metadata": {}, "componentRefs": [], "sources": {}},
                {"kind": "lock", "name": "locks", "type": "redis", "state": "not_ready",
                 "reason": "connection refused\nmore detail"}
            ],
            "reloads": [
                {"generation": 2, "trigger": "api", "outcome": "applied", "error": null},
                {"generation": 2, "trigger": "file", "outcome": "rejected",
                 "error": "state/orders: bad field\nstate/x: other"}
            ],
            "pendingRetry": {"trigger": "watch", "attempts": 2, "next_at_unix_ms": 1000}
        });
        let text = summary(&status);
        assert!(text.starts_with("generation 3, app id shop\n"), "{text}");
        assert!(text.contains("components (2):\n"), "{text}");
        assert!(
            text.contains("  state/orders             memory           ready\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "  lock/locks               redis            not_ready: connection refused\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("  generation 2    file         rejected: state/orders: bad field\n"),
            "{text}"
        );
        assert!(!text.contains("state/x: other"), "{text}");
        assert!(
            text.contains("pending retry: watch reload, 2 attempt(s), next at 1000 (unix ms)"),
            "{text}"
        );
    }

    /// A reason, name or reload error carrying terminal control sequences
    /// is shown with them escaped. Before: written raw, so a reason could
    /// set the terminal's clipboard (OSC 52) or rewrite the screen.
    #[test]
    fn control_characters_from_the_sidecar_are_escaped() {
        let status = json!({
            "generation": 1, "appId": "a\u{1b}[2J",
            "components": [{"kind": "state", "name": "s\r", "type": "memory",
                            "state": "not_ready",
                            "reason": "down \u{1b}]52;c;aGk=\u{7} again"}],
            "reloads": [{"generation": 1, "trigger": "api", "outcome": "rejected",
                         "error": "bad \u{1b}[31mred"}]
        });
        let text = summary(&status);
        assert!(!text.contains(['\u{1b}', '\u{7}', '\r']), "{text:?}");
        assert!(
            text.contains(r"not_ready: down \u{1b}]52;c;aGk=\u{7} again"),
            "{text}"
        );
        assert!(text.contains(r"app id a\u{1b}[2J"), "{text}");
        assert!(text.contains(r"state/s\r "), "{text}");
    }

    #[test]
    fn summary_says_when_there_were_no_reloads_and_omits_a_missing_retry() {
        let status = json!({"generation": 1, "appId": "a", "components": [], "reloads": []});
        let text = summary(&status);
        assert!(
            text.contains("last reloads (oldest first):\n  none\n"),
            "{text}"
        );
        assert!(!text.contains("pending retry"), "{text}");
    }
}
