//! `#[derive(Component)]`: what it expands to, and its compile-time errors
//! (trybuild UI tests against `tests/ui`). One test binary.
// Test code: a failed setup step should panic where it happens.
#![allow(clippy::unwrap_used)]

mod derive_expand;
mod derive_origin;
mod derive_ui;
