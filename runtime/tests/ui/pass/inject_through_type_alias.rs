//! `#[inject]` takes any type that implements the handle trait: aliases of
//! handles, and Options of aliases, included.

use rewire_runtime::prelude::*;

/// The orders store, under a name of the user's own.
type OrdersStore = StateStoreHandle;
/// An optional settings store, aliased whole.
type MaybeSettings = Option<ConfigStoreHandle>;

/// A cache in front of the orders store.
#[derive(Component)]
#[component(kind = "cache", type = "lru")]
struct Cache {
    #[inject]
    orders: OrdersStore,
    #[inject]
    settings: MaybeSettings,
    #[inject(name = "audit")]
    audit: Option<OrdersStore>,
}

impl Component for Cache {}

impl Cache {
    fn bound(&self) -> bool {
        self.orders.is_bound() && self.settings.is_some() && self.audit.is_some()
    }
}

fn main() {
    let _ = Cache::bound;
}
