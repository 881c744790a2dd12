//! The wait before a watch subscribes again after its store let the
//! subscription go (the watched refs' and the overlay's).

/// How long a watch waits before subscribing again after its store let
/// the subscription go; doubled while subscriptions end without a change
/// (a store that ends every subscription at once is not asked in a tight
/// loop), up to [`RESUBSCRIBE_AT_MOST`].
pub(crate) const RESUBSCRIBE_AFTER: std::time::Duration = std::time::Duration::from_millis(100);
/// The longest wait before subscribing again.
const RESUBSCRIBE_AT_MOST: std::time::Duration = std::time::Duration::from_secs(30);

/// The waits before subscribing again, growing while subscriptions end
/// without delivering a change.
#[derive(Default)]
pub(crate) struct Resubscribe {
    ended: u32,
}

impl Resubscribe {
    /// The wait before the next subscribe, counting this end.
    pub(crate) fn next_wait(&mut self) -> std::time::Duration {
        let wait = RESUBSCRIBE_AFTER
            .saturating_mul(1 << self.ended.min(16))
            .min(RESUBSCRIBE_AT_MOST);
        self.ended = self.ended.saturating_add(1);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_before_subscribing_again_doubles_up_to_its_bound() {
        let mut resubscribe = Resubscribe::default();
        let waits: Vec<u64> = (0..12)
            .map(|_| resubscribe.next_wait().as_millis() as u64)
            .collect();
        assert_eq!(
            waits,
            [100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000, 30000, 30000]
        );
    }
}
