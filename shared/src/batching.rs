//! How a subscription's pending events are cut into delivery requests (B1 to B6).
//!
//! Greedy and optimistic: events go out with whatever is at hand; a batch closes when the next
//! event would pass the count limit or the preferred size, never by waiting for more (B6).

use std::ops::Range;

use crate::subscription::BatchPolicy;

/// Bytes a request body takes for events of these sizes: `[` `]` and a comma between events.
pub fn body_bytes(sizes: &[usize]) -> usize {
    2 + sizes.iter().sum::<usize>() + sizes.len().saturating_sub(1)
}

/// Cuts events (given by their sizes in bytes, in order) into consecutive batches.
///
/// - B2: a batch never holds more than `max_events_per_batch` events.
/// - B3: a batch stays within the preferred size, except a single event larger than it, which
///   goes alone in its own batch.
/// - Every event is in exactly one batch, in order.
pub fn plan_batches(sizes: &[usize], policy: &BatchPolicy) -> Vec<Range<usize>> {
    let max_events = policy.max_events_per_batch.max(1) as usize;
    let preferred = policy.preferred_bytes();
    let mut batches = Vec::new();
    let mut start = 0;
    let mut bytes = 2; // "[" and "]"
    for (i, &size) in sizes.iter().enumerate() {
        let count = i - start;
        let added = if count == 0 { size } else { size + 1 };
        if count > 0 && (count >= max_events || bytes + added > preferred) {
            batches.push(start..i);
            start = i;
            bytes = 2 + size;
        } else {
            bytes += added;
        }
    }
    if start < sizes.len() {
        batches.push(start..sizes.len());
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(max: u32, kb: u32) -> BatchPolicy {
        BatchPolicy {
            max_events_per_batch: max,
            preferred_batch_size_in_kilobytes: kb,
        }
    }

    /// B1: by default every request carries exactly one event.
    #[test]
    fn default_is_one_event_per_request_b1() {
        let b = plan_batches(&[10, 20, 30], &BatchPolicy::default());
        assert_eq!(b, vec![0..1, 1..2, 2..3]);
    }

    /// B3: an event larger than the preferred size goes alone, and is not dropped.
    #[test]
    fn oversized_event_goes_alone_b3() {
        let b = plan_batches(&[100, 10 * 1024, 100], &policy(10, 4));
        assert_eq!(b, vec![0..1, 1..2, 2..3]);
    }

    /// B6: fewer events than the maximum make one smaller batch, not a wait.
    #[test]
    fn few_events_make_a_small_batch_b6() {
        assert_eq!(plan_batches(&[5, 5], &policy(100, 64)), vec![0..2]);
        assert!(plan_batches(&[], &policy(100, 64)).is_empty());
    }

    proptest! {
        /// B2, B3: every event in exactly one batch, in order; count and size bounds hold;
        /// a batch is closed only when the next event would not fit.
        #[test]
        fn batches_respect_count_and_size_b2_b3(
            sizes in proptest::collection::vec(1usize..6000, 0..200),
            max in 1u32..50,
            kb in 1u32..20,
        ) {
            let p = policy(max, kb);
            let batches = plan_batches(&sizes, &p);
            let mut next = 0;
            for (n, b) in batches.iter().enumerate() {
                prop_assert_eq!(b.start, next);
                prop_assert!(b.end > b.start);
                next = b.end;
                let len = b.end - b.start;
                prop_assert!(len <= max as usize);
                let bytes = body_bytes(&sizes[b.clone()]);
                prop_assert!(len == 1 || bytes <= p.preferred_bytes());
                // Greedy: the next event would have broken a bound.
                if n + 1 < batches.len() {
                    let grown = body_bytes(&sizes[b.start..b.end + 1]);
                    prop_assert!(len == max as usize || grown > p.preferred_bytes());
                }
            }
            prop_assert_eq!(next, sizes.len());
        }
    }
}
