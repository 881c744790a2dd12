use rewire_runtime::Component;

/// Says it updates in place, but has no `InPlaceUpdate`.
#[derive(Component)]
#[component(kind = "greeter", type = "boastful", in_place)]
struct Boastful {}

impl Component for Boastful {}

fn main() {}
