//! The code generated from etcd's v3 API protos, one module per proto
//! package so that cross-package references resolve.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// `etcdserverpb`: the KV, Watch, Lease, Cluster, Maintenance and Auth
/// services and their messages.
pub mod etcdserverpb {
    tonic::include_proto!("etcdserverpb");
}

/// `mvccpb`: key-values and watch events.
pub mod mvccpb {
    tonic::include_proto!("mvccpb");
}

/// `authpb`: users, roles and permissions.
pub mod authpb {
    tonic::include_proto!("authpb");
}

pub use etcdserverpb::*;
pub use mvccpb::{event::EventType, Event, KeyValue};
