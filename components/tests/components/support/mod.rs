//! Helpers of the components' test binary that need rewire types; the
//! launchers themselves are in `testkit`.

pub mod apollo_server;
#[cfg(feature = "etcd")]
pub mod etcd_server;
pub mod extreme;
pub mod logs;
#[cfg(feature = "etcd")]
pub mod story_load;
