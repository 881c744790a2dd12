//! The `rewire` command line, the Mermaid graph output and the error corpus
//! (validate, Lifecycle pushes, watched files). One test binary.
// Test code: a failed setup step should panic where it happens.
#![allow(clippy::unwrap_used)]

mod support;

mod cli;
mod cli_apply_status;
mod cli_shutdown;
mod cli_start_signal;
mod cli_status_redirect;
mod cli_tls;
mod corpus_lifecycle;
mod corpus_validate;
mod corpus_watched_file;
mod dapr_resources;
mod docs_compile;
mod embedded;
mod example_custom_component;
mod graph_mermaid;
mod host_library;
mod layotto_files;
mod tracing_otlp;
