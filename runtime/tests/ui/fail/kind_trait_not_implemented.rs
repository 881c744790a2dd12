use rewire_runtime::Component;

#[derive(Component)]
#[component(kind = "state", type = "forgetful")]
struct Forgetful {}

impl Component for Forgetful {}

fn main() {}
