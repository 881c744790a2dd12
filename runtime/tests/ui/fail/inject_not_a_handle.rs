use rewire_runtime::{Component, ConfigStoreHandle};

#[derive(Component)]
#[component(kind = "greeter", type = "english")]
struct Greeter {
    #[inject]
    cache: String,
    #[inject]
    maybe: Option<String>,
    #[inject]
    many: Vec<ConfigStoreHandle>,
}

impl rewire_runtime::Component for Greeter {}

fn main() {}
