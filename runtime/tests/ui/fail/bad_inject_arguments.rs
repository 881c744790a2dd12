use rewire_runtime::{Component, ConfigStoreHandle};

#[derive(Component)]
#[component(kind = "greeter", type = "english")]
struct Greeter {
    #[inject(nme = "apollo")]
    typo: ConfigStoreHandle,
    #[inject(name = "")]
    empty: ConfigStoreHandle,
    #[inject = "apollo"]
    name_value: ConfigStoreHandle,
    #[inject(name = apollo)]
    not_a_string: ConfigStoreHandle,
}

fn main() {}
