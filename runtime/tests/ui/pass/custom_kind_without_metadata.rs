use rewire_runtime::Component;

#[derive(Component)]
#[component(kind = "greeter", type = "english")]
struct EnglishGreeter {
    greeting: String,
}

impl Component for EnglishGreeter {}

/// Explicit crate path, written as serde's `crate = "..."`.
#[derive(Component)]
#[component(kind = "greeter", type = "french", crate = "::rewire_runtime")]
struct FrenchGreeter {}

impl Component for FrenchGreeter {}

fn main() {
    let registry = rewire_runtime::Registry::collected();
    let english = registry.get("greeter", "english").map(|d| (d.description, d.example_metadata));
    assert_eq!(english, Some(("", "{}")));
    assert!(registry.get("greeter", "french").is_some());
    let _ = EnglishGreeter { greeting: String::new() }.greeting;
}
