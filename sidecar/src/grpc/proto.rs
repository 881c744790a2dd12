//! The code generated from `sidecar/proto` (messages, servers and clients),
//! in modules mirroring the proto packages so that cross-package references
//! (`dapr.proto.common.v1` from `dapr.proto.runtime.v1`) resolve.
//!
//! Clients are generated without a transport: build one over any tonic
//! channel, e.g. `DaprClient::new(Endpoint::from_shared(url)?.connect().await?)`.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// `dapr.proto.*`: Dapr's API (the subset served).
pub mod dapr {
    /// `dapr.proto.*`
    pub mod proto {
        /// `dapr.proto.common.*`
        pub mod common {
            /// `dapr.proto.common.v1`: state items, etags, configuration items.
            pub mod v1 {
                tonic::include_proto!("dapr.proto.common.v1");
            }
        }
        /// `dapr.proto.runtime.*`
        pub mod runtime {
            /// `dapr.proto.runtime.v1`: the `Dapr` service (the subset served).
            pub mod v1 {
                tonic::include_proto!("dapr.proto.runtime.v1");
            }
        }
    }
}

/// `rewire.*`: rewire's own APIs.
pub mod rewire {
    /// `rewire.lifecycle.*`
    pub mod lifecycle {
        /// `rewire.lifecycle.v1`: the `Lifecycle` service.
        pub mod v1 {
            tonic::include_proto!("rewire.lifecycle.v1");
        }
    }
}

/// `spec.proto.runtime.v1`: Layotto's `Runtime` and `Lifecycle` services.
pub mod spec {
    /// `spec.proto.*`
    pub mod proto {
        /// `spec.proto.runtime.*`
        pub mod runtime {
            /// `spec.proto.runtime.v1`: Layotto's API.
            pub mod v1 {
                tonic::include_proto!("spec.proto.runtime.v1");
            }
        }
    }
}
