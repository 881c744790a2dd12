//! The text a panic was raised with: a leaf, so that both the calls
//! into components ([`crate::guarded`]) and the panic report
//! ([`crate::redact`]) read it without depending on each other.

/// The text a panic was raised with.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}
