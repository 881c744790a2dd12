use rewire_runtime::Component;

#[derive(Component)]
struct Greeter {
    greeting: String,
}

fn main() {}
