use rewire_runtime::{Component, ConfigStoreHandle};

#[derive(serde::Deserialize)]
struct Meta {}

#[derive(Component)]
#[component(kind = "greeter", type = "english")]
struct TwoMetadata {
    #[metadata]
    first: Meta,
    #[metadata]
    second: Meta,
}

#[derive(Component)]
#[component(kind = "greeter", type = "french")]
struct MetadataAndInject {
    #[metadata]
    #[inject]
    config: ConfigStoreHandle,
}

#[derive(Component)]
#[component(kind = "greeter", type = "german")]
struct MetadataWithArgs {
    #[metadata(rename = "x")]
    meta: Meta,
}

fn main() {}
