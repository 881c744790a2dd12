use rewire_runtime::Component;

struct NotDeserialize {}

struct NotDefault {}

#[derive(Component)]
#[component(kind = "greeter", type = "english")]
struct Greeter {
    #[metadata]
    meta: NotDeserialize,
    other: NotDefault,
}

impl Component for Greeter {}

fn main() {}
