//! `rewire apply`: push one component's configuration to a running sidecar
//! through the Lifecycle API, as a control plane does.

use std::collections::HashMap;
use std::process::ExitCode;

use clap::Args;
use rewire::sidecar::auth::{ADMIN_TOKEN_HEADER, APP_TOKEN_HEADER};
use rewire::sidecar::grpc::proto::rewire::lifecycle::v1::lifecycle_client::LifecycleClient;
use rewire::sidecar::grpc::proto::rewire::lifecycle::v1::{ComponentConfig, DynamicConfiguration};
use tonic::metadata::MetadataValue;
use tonic::transport::Endpoint;
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
    /// A metadata field, `key=value`; repeat for several.
    #[arg(long = "metadata", short = 'm', value_parser = parse_field)]
    metadata: Vec<(String, String)>,
    /// Reject the push if the sidecar runs a newer generation than this.
    #[arg(long)]
    based_on_generation: Option<u64>,
    /// gRPC address of the sidecar.
    #[arg(long, default_value = rewire::sidecar::DEFAULT_GRPC_ADDR)]
    addr: std::net::SocketAddr,
}

fn parse_field(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("expected key=value, got `{text}`")),
    }
}

/// Sends the component's configuration; exits 1 on a rejection, printing
/// every reason.
pub async fn apply_command(args: ApplyArgs) -> ExitCode {
    let url = format!("http://{}", args.addr);
    let channel = match Endpoint::from_shared(url.clone()) {
        Ok(endpoint) => endpoint.connect().await,
        Err(err) => {
            eprintln!("error: bad address {url}: {err}");
            return ExitCode::FAILURE;
        }
    };
    let channel = match channel {
        Ok(channel) => channel,
        Err(err) => {
            eprintln!("error: cannot reach the sidecar at {url}: {err}");
            return ExitCode::FAILURE;
        }
    };
    let mut request = Request::new(DynamicConfiguration {
        component_config: Some(ComponentConfig {
            kind: args.kind.clone(),
            name: args.name.clone(),
            r#type: args.type_name.unwrap_or_default(),
            metadata: args.metadata.into_iter().collect::<HashMap<_, _>>(),
            ..ComponentConfig::default()
        }),
        based_on_generation: args.based_on_generation,
    });
    let token = std::env::var("REWIRE_ADMIN_TOKEN")
        .map(|t| (ADMIN_TOKEN_HEADER, t))
        .or_else(|_| std::env::var("DAPR_API_TOKEN").map(|t| (APP_TOKEN_HEADER, t)));
    if let Ok((header, token)) = token {
        match token.parse::<MetadataValue<_>>() {
            Ok(value) => {
                request.metadata_mut().insert(header, value);
            }
            Err(_) => {
                eprintln!("error: the token in the environment is not a valid header value");
                return ExitCode::FAILURE;
            }
        }
    }
    let answer = match LifecycleClient::new(channel)
        .apply_configuration(request)
        .await
    {
        Ok(answer) => answer.into_inner(),
        Err(status) => {
            eprintln!("error: {:?}: {}", status.code(), status.message());
            return ExitCode::FAILURE;
        }
    };
    let key = format!("{}/{}", args.kind, args.name);
    if answer.accepted {
        println!(
            "{key}: {} (generation {})",
            answer.outcome, answer.generation
        );
        let mut actions: Vec<_> = answer
            .actions
            .into_iter()
            .filter(|(_, a)| a != "unchanged")
            .collect();
        actions.sort();
        for (component, action) in actions {
            println!("  {component}: {action}");
        }
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "{key}: {} (generation {} keeps serving)",
            answer.outcome, answer.generation
        );
        for error in answer.errors {
            eprintln!("  {error}");
        }
        ExitCode::FAILURE
    }
}
