//! Where a derived component was declared: two derives registering one
//! type are reported with both structs' paths.

use rewire_runtime::{Registry, ValidConfig};

mod first {
    /// Twice, here without a description.
    #[derive(rewire_runtime::Component)]
    #[component(kind = "derive-origin-kind", type = "twice")]
    pub struct Twice {}

    impl rewire_runtime::Component for Twice {}
}

mod second {
    #[derive(rewire_runtime::Component)]
    #[component(kind = "derive-origin-kind", type = "twice")]
    pub struct Twice {}

    impl rewire_runtime::Component for Twice {}
}

/// Before, the problem listed "(no description), (no description)" (or
/// the descriptions), with nothing saying which structs to look at.
#[test]
fn a_type_two_derives_register_names_both_structs() {
    let registry = Registry::collected();
    let mut origins = registry
        .submitted_twice_at("derive-origin-kind", "twice")
        .unwrap_or_else(|| panic!("not submitted twice"))
        .to_vec();
    origins.sort();
    assert_eq!(
        origins,
        [
            Some("derive::derive_origin::first::Twice"),
            Some("derive::derive_origin::second::Twice"),
        ]
    );
    let text = r#"{"components": {"derive-origin-kind": {"one": {"type": "twice"}}}}"#;
    let problems = match ValidConfig::from_slice(text.as_bytes(), &registry) {
        Ok(_) => panic!("a type registered twice was accepted"),
        Err(problems) => problems.to_string(),
    };
    for path in [
        "`derive::derive_origin::first::Twice` \"Twice, here without a description.\"",
        "`derive::derive_origin::second::Twice`",
    ] {
        assert!(problems.contains(path), "{path} not in: {problems}");
    }
}
