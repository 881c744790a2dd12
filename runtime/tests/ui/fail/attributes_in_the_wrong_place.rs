use rewire_runtime::Component;

#[derive(Component)]
#[component(kind = "greeter", type = "english")]
#[inject]
struct Greeter {
    #[component(kind = "greeter")]
    greeting: String,
}

fn main() {}
