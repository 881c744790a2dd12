//! [`Backoff`]: exponential waits between failed attempts (the runtime's,
//! shared with its resiliency policies).

pub(crate) use rewire_runtime::Backoff;
