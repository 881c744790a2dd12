//! [`ResultCode`]: how a request ended, as the request metrics label it.
//! A module of its own so that what records a result (the gRPC and HTTP
//! observers, the Lifecycle API's certificate check in `tls`) does not
//! depend on the metrics registry, which depends on `telemetry`.

use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};

/// How a request ended, as its metric shows it: an HTTP status (`200`)
/// or the name of a gRPC code (`NOT_FOUND`).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum ResultCode {
    /// An HTTP status code.
    Http(u16),
    /// A gRPC code's name.
    Grpc(&'static str),
}

impl EncodeLabelValue for ResultCode {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        match self {
            Self::Http(status) => EncodeLabelValue::encode(status, encoder),
            Self::Grpc(name) => EncodeLabelValue::encode(name, encoder),
        }
    }
}
