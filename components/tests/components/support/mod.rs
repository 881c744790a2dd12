//! Helpers of the components' test binary that need rewire types; the
//! launchers themselves are in `testkit`.

pub mod apollo_server;
pub mod etcd_server;
pub mod extreme;
pub mod file_opens;
pub mod logs;
pub mod state_requests;
pub mod story_load;
