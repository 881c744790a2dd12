// A built-in kind spelled another way would compile as a custom kind: the
// kind trait impl never used, and a configuration naming the type under
// the built-in kind told only "unknown type". The derive refuses it.
use rewire_runtime::Component;

#[derive(Component)]
#[component(kind = "state_store", type = "x")]
struct DaprStateStore {}

#[derive(Component)]
#[component(kind = "secretstores", type = "x")]
struct DaprSecretStores {}

#[derive(Component)]
#[component(kind = "configuration", type = "x")]
struct DaprConfiguration {}

#[derive(Component)]
#[component(kind = "State", type = "x")]
struct Capitalised {}

#[derive(Component)]
#[component(kind = "pubsubs", type = "x")]
struct Plural {}

fn main() {}
