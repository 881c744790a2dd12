use rewire_runtime::Component;

#[derive(Component)]
#[component(kind = "greeter", type = "english", example = "{capacity: 1}")]
struct NotJson {}

#[derive(Component)]
#[component(kind = "greeter", type = "french", example = "[1, 2]")]
struct NotAnObject {}

fn main() {}
