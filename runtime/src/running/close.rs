//! Closing: one component, or a whole set in reverse start order.

use super::Components;
use crate::closing::close_one;
use crate::component::ComponentKey;

/// Closes the components of `levels` found in `components`, last level
/// first.
pub(crate) async fn close_in_reverse(levels: &[Vec<ComponentKey>], components: &mut Components) {
    for level in levels.iter().rev() {
        for key in level.iter().rev() {
            if let Some(r) = components.remove(key) {
                close_one(key, &r.assembled.instance, &r.assembled.shutdown).await;
            }
        }
    }
}
