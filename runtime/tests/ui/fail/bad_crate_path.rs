use rewire_runtime::Component;

#[derive(Component)]
#[component(kind = "greeter", type = "english", crate = "not a path")]
struct Greeter {}

fn main() {}
