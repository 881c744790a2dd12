use rewire_runtime::Component;

// A field that is neither `#[metadata]` nor `#[inject]` starts as
// `Default::default()`. (A `#[metadata]` type that is not `Deserialize` is
// reported by rustc too, but its list of candidate impls changes with the
// features enabled in the build, so it has no snapshot here.)
struct NotDefault {}

#[derive(Component)]
#[component(kind = "greeter", type = "english")]
struct Greeter {
    other: NotDefault,
}

impl Component for Greeter {}

fn main() {}
