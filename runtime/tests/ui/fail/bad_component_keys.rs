use rewire_runtime::Component;

#[derive(Component)]
#[component(knd = "greeter", type = "english", colour = "blue")]
struct Typo {}

#[derive(Component)]
#[component(kind = greeter, type = 3, kind = "greeter", example)]
struct NotStrings {}

fn main() {}
