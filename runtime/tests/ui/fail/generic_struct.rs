use rewire_runtime::Component;

#[derive(Component)]
#[component(kind = "greeter", type = "english")]
struct Greeter<T> {
    greeting: T,
}

#[derive(Component)]
#[component(kind = "greeter", type = "french")]
struct Borrowing<'a> {
    greeting: &'a str,
}

fn main() {}
