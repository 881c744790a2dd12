use rewire_runtime::Component;

#[derive(Component)]
#[component(kind = "greeter", type = "english")]
enum Greeter {
    English,
}

fn main() {}
