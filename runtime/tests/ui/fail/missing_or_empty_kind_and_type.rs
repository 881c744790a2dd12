use rewire_runtime::Component;

#[derive(Component)]
#[component(kind = "greeter")]
struct NoType {}

#[derive(Component)]
#[component(type = "english")]
struct NoKind {}

#[derive(Component)]
#[component(kind = "", type = "two words")]
struct Empty {}

fn main() {}
