//! Caps a user sets on one subscription: requests in flight and events per second.
//!
//! Every webhook service is asked for them: a subscriber whose endpoint takes only so much load
//! wants gridrelay never to send more, however many events are waiting. They are upper bounds
//! on top of the adaptive per-endpoint limit (`concurrency`): delivery beyond them waits (in
//! the worker for a moment, on the queue for longer), is never dropped, and does not count as
//! an attempt. They hold across every worker (all Lambda instances), because the allowance is
//! kept in the delivery state store.
//!
//! The events-per-second cap is a schedule ([`book_events`]): each batch books its share of
//! the allowance and starts when the batches booked before it are through, so batches are
//! spaced evenly; a batch never holds more events than one second allows.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::ops::RangeInclusive;

use crate::limits::{LimitError, check_range};
use crate::subscription::BatchPolicy;

/// `maxConcurrentRequests`: a worker holds at most 1,000 requests in flight in total.
pub const MAX_CONCURRENT_REQUESTS: RangeInclusive<i64> = 1..=1000;
/// `maxEventsPerSecond`.
pub const MAX_EVENTS_PER_SECOND: RangeInclusive<i64> = 1..=100_000;

/// A subscription's caps; unset caps do not limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryCaps {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_requests: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_events_per_second: Option<u32>,
}

impl DeliveryCaps {
    /// Each cap checked against its range, naming the setting, the value and the range.
    pub fn from_settings(
        max_concurrent_requests: Option<i64>,
        max_events_per_second: Option<i64>,
    ) -> Result<Self, LimitError> {
        Ok(Self {
            max_concurrent_requests: max_concurrent_requests
                .map(|v| check_range("maxConcurrentRequests", v, &MAX_CONCURRENT_REQUESTS))
                .transpose()?,
            max_events_per_second: max_events_per_second
                .map(|v| check_range("maxEventsPerSecond", v, &MAX_EVENTS_PER_SECOND))
                .transpose()?,
        })
    }

    /// Whether neither cap is set.
    pub fn is_unset(&self) -> bool {
        *self == Self::default()
    }

    /// The batching a subscription delivers with under these caps: no batch holds more events
    /// than one second allows, so every batch fits in an empty second.
    pub fn batching(&self, policy: &BatchPolicy) -> BatchPolicy {
        match self.max_events_per_second {
            Some(rate) if rate < policy.max_events_per_batch => BatchPolicy {
                max_events_per_batch: rate,
                ..*policy
            },
            _ => *policy,
        }
    }
}

/// Where a subscription's events-per-second allowance stands after a booking, and when the
/// booked batch may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateBooking {
    /// When the batch may be sent: now, or later if earlier bookings take the time until then.
    pub start: DateTime<Utc>,
    /// Until when the subscription's allowance is booked, this batch included.
    pub booked_until: DateTime<Utc>,
}

/// Books `events` at `rate` events per second after what is booked until `booked_until`
/// (none: nothing is), at `now`: the batch starts when the earlier bookings are through (or
/// now), and takes `events / rate` seconds of the allowance. Batches are so spaced evenly (a
/// virtual schedule, as GCRA): whatever the bookings, the batches that start in any stretch of
/// time L carry at most `rate · L` events plus the last batch's. A booking is made once per
/// batch; a batch booked for later waits on the queue until its start and then goes without
/// booking again, so a backlog goes round the queue once, not once a second.
pub fn book_events(
    booked_until: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
    events: u32,
    rate: u32,
) -> RateBooking {
    let start = booked_until.map_or(now, |b| b.max(now));
    let micros = (u64::from(events) * 1_000_000).div_ceil(u64::from(rate.max(1)));
    let takes = chrono::Duration::microseconds(i64::try_from(micros).unwrap_or(i64::MAX));
    RateBooking {
        start,
        booked_until: start + takes,
    }
}

/// How early a batch held for its booked start is due on the queue: SQS delays are whole
/// seconds, so it comes back up to this much before its start, and the worker waits the rest.
pub const HELD_EARLY: chrono::Duration = chrono::Duration::seconds(1);

/// When a batch held for its booked `start` is due on the queue at `now`: [`HELD_EARLY`]
/// before it, unless that is already past (then at the start itself, so it cannot come back
/// at once and spin).
pub fn held_until(start: DateTime<Utc>, now: DateTime<Utc>) -> DateTime<Utc> {
    let early = start - HELD_EARLY;
    if early > now { early } else { start }
}

/// How the allowances are laid out in a store whose items each take a bounded number of writes
/// a second, as DynamoDB's do: one partition (so one item) takes at most 1,000 write units a
/// second, and a write costs one unit per KB of the item written, failed conditional writes
/// included. A single item per cap cannot reach the caps the command line accepts: a lease map
/// of 1,000 slots is about 41 KB (41 units a write, two writes a request: 12 requests a
/// second), and one booking item takes at most 1,000 bookings a second (1,000 events a second
/// for an unbatched subscription, against an accepted 100,000). So each cap is spread over
/// items of bounded size and load, [`slot_items`] and [`rate_items`]; [`CapCeilings`] says
/// what the layout reaches.
pub const ITEM_WRITE_UNITS_PER_SECOND: u32 = 1_000;

/// Leases kept in one slot item: 16 leases (up to 44 bytes each: an id of the item's number, a
/// dot and 32 characters, and an epoch in milliseconds) and the longest key keep the item under
/// 1 KB (about 890 bytes), one write unit.
pub const LEASES_PER_SLOT_ITEM: u32 = 16;

/// Bookings a second one rate item is planned for: half its ceiling, since a booking of an idle
/// allowance costs two writes (a refused `ADD`, then a `SET`).
pub const BOOKINGS_PER_RATE_ITEM: u32 = ITEM_WRITE_UNITS_PER_SECOND / 2;

/// The items a cap of `max` requests in flight is kept in: one per [`LEASES_PER_SLOT_ITEM`]
/// slots (1 to 63 for the accepted 1 to 1,000).
pub fn slot_items(max: u32) -> u32 {
    max.max(1).div_ceil(LEASES_PER_SLOT_ITEM)
}

/// The slots of item `item` (of [`slot_items`]`(max)`): the cap shared as evenly as it goes,
/// the first items taking one more; together exactly `max`.
pub fn slots_in_item(max: u32, item: u32) -> u32 {
    share(max.max(1), slot_items(max), item)
}

/// An events-per-second cap and the largest batch the subscription sends under it (its
/// batching under the caps, [`DeliveryCaps::batching`]): a booking books one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateAllowance {
    pub events_per_second: u32,
    pub events_per_batch: u32,
}

impl RateAllowance {
    /// The allowance of a subscription capped at `rate` that batches by `policy`.
    pub fn new(rate: u32, policy: &BatchPolicy) -> Self {
        let caps = DeliveryCaps {
            max_events_per_second: Some(rate),
            max_concurrent_requests: None,
        };
        Self {
            events_per_second: rate.max(1),
            events_per_batch: caps.batching(policy).max_events_per_batch.max(1),
        }
    }
}

/// The items an events-per-second allowance is kept in: enough that full batches at the rate
/// take at most [`BOOKINGS_PER_RATE_ITEM`] bookings a second of each (1 for up to 500 full
/// batches a second; 200 for 100,000 unbatched events a second). Each item holds a schedule of
/// its own at its share of the rate ([`rate_of_item`]), and a batch books one of them; the
/// events starting in any stretch of time L then stay within `rate · L` plus one batch per
/// item: at most 1/500 s of the rate more than one schedule would allow.
pub fn rate_items(allowance: RateAllowance) -> u32 {
    let per_item = u64::from(BOOKINGS_PER_RATE_ITEM) * u64::from(allowance.events_per_batch.max(1));
    let items = u64::from(allowance.events_per_second.max(1)).div_ceil(per_item);
    u32::try_from(items).unwrap_or(u32::MAX).max(1)
}

/// The rate of item `item` (of [`rate_items`]): the rate shared as evenly as it goes, each at
/// least one event a second; together exactly the rate.
pub fn rate_of_item(allowance: RateAllowance, item: u32) -> u32 {
    share(
        allowance.events_per_second.max(1),
        rate_items(allowance),
        item,
    )
}

fn share(total: u32, items: u32, item: u32) -> u32 {
    let items = items.max(1);
    total / items + u32::from(item < total % items)
}

/// What the layout reaches on a store whose items take [`ITEM_WRITE_UNITS_PER_SECOND`]: the
/// ceilings of one subscription's caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapCeilings {
    /// Requests a second the slots take (an acquire and a release, one unit each, per request).
    pub requests_per_second: u64,
    /// Events a second the bookings take when batches are full.
    pub events_per_second: u64,
}

impl CapCeilings {
    /// The ceilings of a cap of `max_concurrent` requests and `allowance`.
    pub fn of(max_concurrent: u32, allowance: RateAllowance) -> Self {
        Self {
            requests_per_second: u64::from(slot_items(max_concurrent))
                * u64::from(ITEM_WRITE_UNITS_PER_SECOND / 2),
            events_per_second: u64::from(rate_items(allowance))
                * u64::from(BOOKINGS_PER_RATE_ITEM)
                * u64::from(allowance.events_per_batch),
        }
    }

    /// The shortest request that still lets `max_concurrent` requests be in flight at once:
    /// the cap needs `max_concurrent / duration` requests a second.
    pub fn shortest_request_at_cap(&self, max_concurrent: u32) -> std::time::Duration {
        std::time::Duration::from_secs_f64(
            f64::from(max_concurrent) / self.requests_per_second as f64,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    #[test]
    fn caps_out_of_range_are_refused_naming_setting_value_and_range() {
        assert_eq!(
            DeliveryCaps::from_settings(None, None).unwrap(),
            DeliveryCaps::default()
        );
        assert!(DeliveryCaps::default().is_unset());
        let caps = DeliveryCaps::from_settings(Some(4), Some(250)).unwrap();
        assert_eq!(
            (caps.max_concurrent_requests, caps.max_events_per_second),
            (Some(4), Some(250))
        );
        let e = DeliveryCaps::from_settings(Some(0), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "maxConcurrentRequests is 0; allowed: 1 to 1000"
        );
        let e = DeliveryCaps::from_settings(None, Some(100_001)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "maxEventsPerSecond is 100001; allowed: 1 to 100000"
        );
        let e = DeliveryCaps::from_settings(None, Some(-5)).unwrap_err();
        assert_eq!(e.field, "maxEventsPerSecond");
    }

    #[test]
    fn unset_caps_are_not_written_and_old_records_read_as_unset() {
        assert_eq!(
            serde_json::to_value(DeliveryCaps::default()).unwrap(),
            serde_json::json!({})
        );
        let caps: DeliveryCaps =
            serde_json::from_value(serde_json::json!({"maxEventsPerSecond": 7})).unwrap();
        assert_eq!(caps.max_events_per_second, Some(7));
        assert_eq!(caps.max_concurrent_requests, None);
    }

    #[test]
    fn a_batch_never_holds_more_events_than_one_second_allows() {
        let policy = BatchPolicy::from_settings(Some(100), Some(512)).unwrap();
        let capped = DeliveryCaps::from_settings(None, Some(10)).unwrap();
        assert_eq!(capped.batching(&policy).max_events_per_batch, 10);
        assert_eq!(
            capped.batching(&policy).preferred_batch_size_in_kilobytes,
            512
        );
        let roomy = DeliveryCaps::from_settings(None, Some(1000)).unwrap();
        assert_eq!(roomy.batching(&policy), policy);
        assert_eq!(DeliveryCaps::default().batching(&policy), policy);
    }

    /// Item 5 of the hardening: every cap the command line accepts is within what its items
    /// take, and the ceilings quoted in docs/delivery.md are these.
    #[test]
    fn every_accepted_cap_is_within_the_ceiling_of_its_items() {
        for max in 1..=*MAX_CONCURRENT_REQUESTS.end() as u32 {
            let items = slot_items(max);
            assert!(items <= 63);
            let slots: u32 = (0..items).map(|i| slots_in_item(max, i)).sum();
            assert_eq!(slots, max, "the items hold exactly the cap");
            assert!(
                (0..items).all(|i| (1..=LEASES_PER_SLOT_ITEM).contains(&slots_in_item(max, i)))
            );
            // Every slot in flight with requests of 32 ms (as 16 leases an item, 500 requests a
            // second an item): the cap is reached by any request that long.
            let ceilings = CapCeilings::of(
                max,
                RateAllowance {
                    events_per_second: 1,
                    events_per_batch: 1,
                },
            );
            assert!(ceilings.shortest_request_at_cap(max) <= std::time::Duration::from_millis(32));
        }
        for batch in [1, 2, 10, 100, 5000] {
            for rate in (1..=100_000u32).step_by(97).chain([100_000]) {
                let a = RateAllowance {
                    events_per_second: rate,
                    events_per_batch: batch,
                };
                let items = rate_items(a);
                let total: u64 = (0..items).map(|i| u64::from(rate_of_item(a, i))).sum();
                assert_eq!(total, u64::from(rate));
                assert!((0..items).all(|i| rate_of_item(a, i) >= 1));
                assert!(
                    CapCeilings::of(1, a).events_per_second >= u64::from(rate),
                    "{rate}/s in batches of {batch}"
                );
                // Extra burst: one batch per item, at most 1/500 s of the rate (or one batch).
                assert!(
                    u64::from(items) * u64::from(batch)
                        <= (u64::from(rate) / 500).max(u64::from(batch)) + u64::from(batch)
                );
            }
        }
        // The figures docs/delivery.md quotes.
        let unbatched = RateAllowance {
            events_per_second: 100_000,
            events_per_batch: 1,
        };
        assert_eq!((slot_items(1_000), rate_items(unbatched)), (63, 200));
        assert_eq!(
            CapCeilings::of(1_000, unbatched).requests_per_second,
            31_500
        );
        // The single items before: 1,000 leases of 41 bytes are 41 write units a write, two
        // writes a request; one booking item, 1,000 bookings a second.
        assert_eq!(
            ITEM_WRITE_UNITS_PER_SECOND / (2 * (1_000 * 41u32).div_ceil(1024)),
            12
        );
    }

    #[test]
    fn a_subscription_s_allowance_books_its_capped_batches() {
        let unbatched = BatchPolicy::from_settings(None, None).unwrap();
        assert_eq!(RateAllowance::new(100_000, &unbatched).events_per_batch, 1);
        let batched = BatchPolicy::from_settings(Some(100), None).unwrap();
        assert_eq!(RateAllowance::new(10, &batched).events_per_batch, 10);
        assert_eq!(RateAllowance::new(1_000, &batched).events_per_batch, 100);
        assert_eq!(rate_items(RateAllowance::new(1_000, &batched)), 1);
    }

    fn t(ms: i64) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(1_800_000_000_000 + ms).unwrap()
    }

    #[test]
    fn bookings_space_batches_evenly_and_an_idle_allowance_starts_now() {
        // 10 a second: a batch of 4 takes 400 ms of it.
        let first = book_events(None, t(0), 4, 10);
        assert_eq!((first.start, first.booked_until), (t(0), t(400)));
        let second = book_events(Some(first.booked_until), t(100), 4, 10);
        assert_eq!((second.start, second.booked_until), (t(400), t(800)));
        // Idle since: what was booked is past, the next batch starts at once.
        let later = book_events(Some(second.booked_until), t(5_000), 1, 10);
        assert_eq!((later.start, later.booked_until), (t(5_000), t(5_100)));
        // Fractions round up: 1 event at 3 a second takes 333,334 µs.
        let third = book_events(None, t(0), 1, 3);
        assert_eq!(
            third.booked_until - third.start,
            chrono::Duration::microseconds(333_334)
        );
    }

    #[test]
    fn a_held_batch_is_due_a_second_early() {
        assert_eq!(held_until(t(5_000), t(0)), t(4_000));
        // Less than a second away: due at its start (the queue's delay rounds up to it).
        assert_eq!(held_until(t(500), t(0)), t(500));
    }

    proptest! {
        /// Whatever batches are booked, whenever: those that start in any stretch of time carry
        /// at most the rate's worth of it plus the last batch (which the cap's batching keeps at
        /// most one second's worth).
        #[test]
        fn batches_starting_in_any_stretch_carry_at_most_its_allowance(
            rate in 1u32..200,
            bookings in proptest::collection::vec((0i64..3_000, 1u32..200), 1..150),
        ) {
            let mut booked = None;
            let mut now = 0;
            let mut starts = Vec::new();
            for (gap, size) in bookings {
                now += gap;
                let size = size.min(rate);
                let b = book_events(booked, t(now), size, rate);
                prop_assert!(b.start >= t(now));
                booked = Some(b.booked_until);
                starts.push((b.start, size));
            }
            for &(from, _) in &starts {
                for span_ms in [1i64, 250, 1_000, 5_000] {
                    let to = from + chrono::Duration::milliseconds(span_ms);
                    let inside: Vec<u32> = starts
                        .iter()
                        .filter(|(s, _)| *s >= from && *s < to)
                        .map(|&(_, n)| n)
                        .collect();
                    let events: u64 = inside.iter().map(|&n| u64::from(n)).sum();
                    let last = u64::from(*inside.last().unwrap_or(&0));
                    let allowance = u64::from(rate) * span_ms as u64 / 1000;
                    prop_assert!(
                        events <= allowance + last,
                        "{events} events start within {span_ms} ms at {rate}/s"
                    );
                }
            }
        }
    }
}
