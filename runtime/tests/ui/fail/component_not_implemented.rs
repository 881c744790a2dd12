use rewire_runtime::Component;

#[derive(Component)]
#[component(kind = "greeter", type = "english")]
struct Greeter {}

fn main() {}
