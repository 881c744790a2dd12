use rewire_runtime::Component;

#[derive(Component)]
#[component(kind = "greeter", type = "english")]
struct Tuple(String);

#[derive(Component)]
#[component(kind = "greeter", type = "french")]
struct Unit;

fn main() {}
