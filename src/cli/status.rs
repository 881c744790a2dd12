//! `rewire status`: the running sidecar's status, from its HTTP API.

use std::net::SocketAddr;
use std::process::ExitCode;

use super::print_json;

/// Prints the status of the sidecar at `http_addr` as JSON.
pub async fn status_command(http_addr: SocketAddr) -> ExitCode {
    let url = format!("http://{http_addr}/v1.0/rewire/status");
    let mut request = reqwest::Client::new().get(&url);
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let Some(token) = var("DAPR_API_TOKEN").or_else(|| var("REWIRE_API_TOKEN")) {
        request = request.header("dapr-api-token", token);
    }
    // Status is admin data: with an admin token set, it needs that one.
    if let Some(token) = var("REWIRE_ADMIN_TOKEN") {
        request = request.header("rewire-admin-token", token);
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(err) => {
            eprintln!("error: cannot reach the sidecar at {url}: {err}");
            return ExitCode::FAILURE;
        }
    };
    let status = response.status();
    match response.json::<serde_json::Value>().await {
        Ok(body) if status.is_success() => {
            print_json(&body);
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
