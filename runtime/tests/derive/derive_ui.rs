//! Compile tests for `#[derive(Component)]`: what it accepts
//! (`tests/ui/pass`) and how it reports each user mistake
//! (`tests/ui/fail`, with the compiler output in `.stderr` snapshots).
//!
//! Refresh snapshots with `TRYBUILD=overwrite cargo test -p rewire-runtime
//! --test derive derive_ui`, then read every changed `.stderr`.

#[test]
fn derive_ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
