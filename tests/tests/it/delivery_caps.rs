//! End-to-end: a subscription's caps (`--max-concurrent-requests`, `--max-events-per-second`)
//! through the local runner's real handlers against the AWS API, with real subscribers; and the
//! DynamoDB store of the caps' allowances, checked against the same contract as the in-memory
//! one.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::Utc;
use gridrelay_adapters::aws::DynamoDeliveryStateStore;
use gridrelay_e2e::{Reply, Subscriber, TestSystem, events, eventually, subscription};
use gridrelay_ports::DeliveryCapStore;
use gridrelay_ports::memory::MemoryDeliveryCapStore;
use gridrelay_shared::caps::RateAllowance;
use gridrelay_shared::subscription::SubscriptionRequest;

const WAIT: Duration = Duration::from_secs(60);

/// 10 events a second in batches of up to 10: one schedule.
const TEN_A_SECOND: RateAllowance = RateAllowance {
    events_per_second: 10,
    events_per_batch: 10,
};

/// What every store of the caps' allowances keeps to: bookings follow one another (each starts
/// when the one before is through, or now), also under a race of 20 bookers; slots never pass
/// their cap, also under a race of 20 takers; a slot given back is free again, and one whose
/// lease ended (its holder died) is taken over.
async fn keeps_the_cap_contract(store: &dyn DeliveryCapStore, subscription: &str) {
    use chrono::DurationRound;
    // The in-memory store keeps what it is given; DynamoDB keeps microseconds.
    let now = Utc::now()
        .duration_trunc(chrono::Duration::milliseconds(1))
        .expect("a time");
    let ms = chrono::Duration::milliseconds;
    // 10 a second: 4 events take 400 ms.
    assert_eq!(
        store
            .book_events(subscription, 4, TEN_A_SECOND, now)
            .await
            .unwrap(),
        now
    );
    assert_eq!(
        store
            .book_events(subscription, 4, TEN_A_SECOND, now + ms(100))
            .await
            .unwrap(),
        now + ms(400)
    );
    // Idle since: the next starts when asked.
    let later = now + ms(10_000);
    assert_eq!(
        store
            .book_events(subscription, 1, TEN_A_SECOND, later)
            .await
            .unwrap(),
        later
    );
    let booking = format!("{subscription}-bookings");
    let bookers = (0..20).map(|_| store.book_events(&booking, 1, TEN_A_SECOND, now));
    let mut starts: Vec<_> = futures::future::join_all(bookers)
        .await
        .into_iter()
        .map(|r| r.expect("booked"))
        .collect();
    starts.sort();
    let expected: Vec<_> = (0..20).map(|i| now + ms(100 * i)).collect();
    assert_eq!(starts, expected, "twenty bookings, 100 ms apart");

    // Giving back a slot never taken changes nothing.
    store
        .release_slot(subscription, "no-such-lease")
        .await
        .unwrap();
    let now = Utc::now();
    let ends = now + chrono::Duration::seconds(10);
    let a = store
        .acquire_slot(subscription, 2, now, ends)
        .await
        .unwrap();
    let b = store
        .acquire_slot(subscription, 2, now, ends)
        .await
        .unwrap();
    assert!(a.is_some() && b.is_some() && a != b);
    assert_eq!(
        store
            .acquire_slot(subscription, 2, now, ends)
            .await
            .unwrap(),
        None
    );
    store.release_slot(subscription, &a.unwrap()).await.unwrap();
    let c = store
        .acquire_slot(subscription, 2, now, ends)
        .await
        .unwrap();
    assert!(c.is_some(), "a slot given back is free");
    // b's and c's holders died: once their leases end, their slots are taken over.
    let later = ends + chrono::Duration::seconds(1);
    let later_ends = later + chrono::Duration::seconds(10);
    for _ in 0..2 {
        assert!(
            store
                .acquire_slot(subscription, 2, later, later_ends)
                .await
                .unwrap()
                .is_some()
        );
    }
    assert_eq!(
        store
            .acquire_slot(subscription, 2, later, later_ends)
            .await
            .unwrap(),
        None
    );

    // Twenty at once for five slots: five get one.
    let race = format!("{subscription}-race");
    let takers = (0..20).map(|_| store.acquire_slot(&race, 5, now, ends));
    let won = futures::future::join_all(takers)
        .await
        .into_iter()
        .filter(|r| matches!(r, Ok(Some(_))))
        .count();
    assert_eq!(won, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dynamodb_cap_store_keeps_the_contract_of_the_in_memory_one() {
    keeps_the_cap_contract(&MemoryDeliveryCapStore::default(), "orders/audit/1").await;
    let sys = TestSystem::start(0.01).await;
    let store = DynamoDeliveryStateStore::from_sdk(&sys.sdk, &sys.names.delivery_state_table);
    keeps_the_cap_contract(&store, "orders/audit/1").await;
    sys.shutdown().await;
}

/// The size DynamoDB bills an item at (its documented rules: names and strings in UTF-8 bytes,
/// a number one byte per two significant digits plus one, a map 3 bytes plus 1 per entry).
fn billed_bytes(item: &HashMap<String, AttributeValue>) -> usize {
    fn value(v: &AttributeValue) -> usize {
        match v {
            AttributeValue::S(s) => s.len(),
            AttributeValue::N(n) => {
                let digits = n.trim_start_matches('-').replace('.', "");
                digits.trim_start_matches('0').len().div_ceil(2) + 1
            }
            AttributeValue::M(m) => {
                3 + m.iter().map(|(k, v)| 1 + k.len() + value(v)).sum::<usize>()
            }
            other => panic!("an attribute the cap store does not write: {other:?}"),
        }
    }
    item.iter().map(|(k, v)| k.len() + value(v)).sum()
}

/// A subscription's cap items, by key.
async fn cap_items(
    sys: &TestSystem,
    prefix: &str,
) -> HashMap<String, HashMap<String, AttributeValue>> {
    let dynamo = aws_sdk_dynamodb::Client::new(&sys.sdk);
    let mut items = HashMap::new();
    let mut start = None;
    loop {
        let page = dynamo
            .scan()
            .table_name(&sys.names.delivery_state_table)
            .set_exclusive_start_key(start)
            .send()
            .await
            .expect("scan");
        for item in page.items.unwrap_or_default() {
            let pk = item["pk"].as_s().expect("pk").clone();
            if pk == prefix || pk.starts_with(&format!("{prefix}#")) {
                items.insert(pk, item);
            }
        }
        start = page.last_evaluated_key;
        if start.is_none() {
            return items;
        }
    }
}

/// Item 5 of the hardening: the largest cap the command line accepts, 1,000 requests in flight,
/// is kept in items of one write unit each (DynamoDB takes 1,000 units a second an item, so a
/// lease map of 1,000 slots, ~41 KB, allowed 12 requests a second); all 1,000 slots are taken,
/// wherever they are, the 1,001st is refused, and a slot given back is found again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_request_cap_is_reached_in_items_of_one_write_unit() {
    let sys = TestSystem::start(0.01).await;
    let store = DynamoDeliveryStateStore::from_sdk(&sys.sdk, &sys.names.delivery_state_table);
    let subscription = format!("{}/{}/{}", "t".repeat(50), "s".repeat(64), "0".repeat(32));
    let now = Utc::now();
    let ends = now + chrono::Duration::seconds(60);
    let mut leases = Vec::new();
    for _ in 0..50 {
        let takers = (0..20).map(|_| store.acquire_slot(&subscription, 1_000, now, ends));
        for taken in futures::future::join_all(takers).await {
            leases.extend(taken.expect("the store answers"));
        }
    }
    assert_eq!(leases.len(), 1_000, "every slot of the cap is reached");
    assert_eq!(
        leases.iter().collect::<BTreeSet<_>>().len(),
        1_000,
        "leases are distinct"
    );
    assert_eq!(
        store
            .acquire_slot(&subscription, 1_000, now, ends)
            .await
            .unwrap(),
        None,
        "the 1,001st is refused"
    );
    let items = cap_items(&sys, &format!("slots#{subscription}")).await;
    assert_eq!(items.len(), 63, "1,000 slots in items of 16");
    for (pk, item) in &items {
        let bytes = billed_bytes(item);
        assert!(
            bytes <= 1024,
            "{pk} is {bytes} bytes: more than one write unit"
        );
    }
    store
        .release_slot(&subscription, &leases[617])
        .await
        .unwrap();
    assert!(
        store
            .acquire_slot(&subscription, 1_000, now, ends)
            .await
            .unwrap()
            .is_some(),
        "the slot given back is found among 63 items"
    );
    sys.shutdown().await;
}

/// Item 5 of the hardening: the largest rate the command line accepts, 100,000 events a second
/// unbatched, needs 100,000 bookings a second; one item takes at most 1,000 writes a second, so
/// the allowance is kept in 200 items of 500 a second each. Bookings spread over them, each
/// item under one write unit, and the events that start in any stretch stay within the rate's
/// worth plus one batch per item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_largest_rate_cap_is_booked_over_items_that_each_take_their_share() {
    let sys = TestSystem::start(0.01).await;
    let store = DynamoDeliveryStateStore::from_sdk(&sys.sdk, &sys.names.delivery_state_table);
    let subscription = "orders/fast/1";
    let allowance = RateAllowance {
        events_per_second: 100_000,
        events_per_batch: 1,
    };
    let now = Utc::now();
    let mut starts = Vec::new();
    for _ in 0..40 {
        let bookers = (0..20).map(|_| store.book_events(subscription, 1, allowance, now));
        for start in futures::future::join_all(bookers).await {
            starts.push(start.expect("booked"));
        }
    }
    let items = cap_items(&sys, &format!("rate#{subscription}")).await;
    assert!(
        (100..=200).contains(&items.len()),
        "800 bookings spread over {} of the 200 items",
        items.len()
    );
    for (pk, item) in &items {
        assert!(billed_bytes(item) <= 1024, "{pk} is over one write unit");
    }
    for span_ms in [1i64, 2, 5, 10, 20] {
        let started = starts
            .iter()
            .filter(|s| **s < now + chrono::Duration::milliseconds(span_ms))
            .count() as i64;
        assert!(
            started <= 100 * span_ms + 200,
            "{started} events start within {span_ms} ms at 100,000 a second over 200 items"
        );
    }
    sys.shutdown().await;
}

/// `--max-concurrent-requests 2`: a subscriber answering in 100 ms never has more than 2 of
/// the subscription's requests at once, while its uncapped neighbour on the same topic gets
/// more; every event is delivered once, by its first attempt (waiting is not an attempt).
///
/// Invocations get 10 s here, not the test systems' 3 s: a batch waits up to `CAP_WAIT` (2 s)
/// for a slot, and an invocation stopped at its deadline on a loaded emulator (as `make test`
/// runs six tests at once) leaves its delivered messages to come back, a duplicate that G1
/// allows but this test is not about. CI's run of 294425a saw one (30 requests, `e-29` not
/// among them yet, an event twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_concurrent_requests_holds_for_a_slow_subscriber_end_to_end() {
    let sys = TestSystem::start_with(0.01, |c| {
        c.function_timeout = Duration::from_secs(10);
        c.visibility_timeout = Duration::from_secs(11);
    })
    .await;
    let topic = sys.topic("orders").await;
    let slow = Reply::Hang(Duration::from_millis(100));
    let capped = Subscriber::start(vec![], slow).await;
    let free = Subscriber::start(vec![], slow).await;
    sys.subscribe(SubscriptionRequest {
        max_concurrent_requests: Some(2),
        ..subscription("orders", "capped", &capped.url)
    })
    .await;
    sys.subscribe(subscription("orders", "free", &free.url))
        .await;

    sys.publish(&topic, &events("e", 30)).await;
    let distinct = |s: &Subscriber| {
        let ids: BTreeSet<String> = s.received().iter().flat_map(|r| r.ids()).collect();
        ids.len()
    };
    eventually(WAIT, "30 events at each subscriber", || async {
        (distinct(&capped) >= 30 && distinct(&free) >= 30).then_some(())
    })
    .await;
    let stats = sys.system.stats();
    assert_eq!(stats.stopped_invocations, 0, "{stats:?}");

    assert_eq!(capped.most_in_flight(), 2);
    assert!(
        free.most_in_flight() > 2,
        "uncapped: {} at once",
        free.most_in_flight()
    );
    let requests = capped.received();
    let ids: BTreeSet<String> = requests.iter().flat_map(|r| r.ids()).collect();
    assert_eq!(ids, (0..30).map(|i| format!("e-{i}")).collect());
    assert_eq!(requests.len(), 30, "one request per event");
    assert!(
        requests
            .iter()
            .all(|r| r.header("aeg-delivery-count") == Some("0"))
    );
    sys.shutdown().await;
}

/// `--max-events-per-second 10` with batches of at most 4: 40 events published at once reach
/// the subscriber spaced by the schedule (a batch of 4 every 400 ms: ten batches over 3.6 s,
/// at least 3 s apart from first to last however late the first one is sent; unpaced, they
/// would all arrive within a few hundred milliseconds),
/// never more than 10 plus two batches received in any second, each by its first attempt;
/// those the invocation could not wait for went round the queue (`throttled`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_events_per_second_paces_delivery_end_to_end() {
    let sys = TestSystem::start(0.01).await;
    let topic = sys.topic("orders").await;
    let sub = Subscriber::start(vec![], Reply::Status(200)).await;
    sys.subscribe(SubscriptionRequest {
        max_events_per_second: Some(10),
        max_events_per_batch: Some(4),
        ..subscription("orders", "paced", &sub.url)
    })
    .await;

    sys.publish(&topic, &events("e", 40)).await;
    eventually(WAIT, "40 events at the subscriber", || async {
        (sub.event_count() >= 40).then_some(())
    })
    .await;

    let requests = sub.received();
    let ids: BTreeSet<String> = requests.iter().flat_map(|r| r.ids()).collect();
    assert_eq!(ids.len(), 40);
    assert_eq!(sub.event_count(), 40, "each event once");
    assert!(
        requests
            .iter()
            .all(|r| r.events.len() <= 4 && r.header("aeg-delivery-count") == Some("0"))
    );
    let first = requests[0].at;
    let span = requests[requests.len() - 1].at - first;
    assert!(
        span >= Duration::from_millis(3_000),
        "all 40 within {span:?}"
    );
    for r in &requests {
        let in_second: usize = requests
            .iter()
            .filter(|o| o.at >= r.at && o.at - r.at < Duration::from_secs(1))
            .map(|o| o.events.len())
            .sum();
        // Ten a second by the schedule, plus a batch the window may catch at its end, plus one
        // more for arrival jitter (a late batch received beside the next, on time): the
        // subscriber sees receipt times, on 2 cores shared with the other tests.
        assert!(in_second <= 18, "{in_second} events within a second");
    }
    let stats = sys.system.stats();
    assert!(stats.deliver.throttled > 0, "{:?}", stats.deliver);
    sys.shutdown().await;
}

/// The runner's concurrent deliver invocations run on instances of their own, each with its own
/// request limits, as Lambda's instances have: at one request in flight per instance, two
/// invocations at once have two requests out at a slow subscriber, never more (with one set of
/// limits shared between them, as before, it was one). Every event arrives once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_concurrent_invocation_has_request_limits_of_its_own() {
    let sys = TestSystem::start_with(0.01, |c| {
        c.concurrency = 2;
        c.delivery_concurrency =
            gridrelay_local::ConcurrencySettings::new(1, Some(1)).expect("valid limits");
    })
    .await;
    let topic = sys.topic("orders").await;
    let slow = Subscriber::start(vec![], Reply::Hang(Duration::from_millis(100))).await;
    sys.subscribe(subscription("orders", "slow", &slow.url))
        .await;

    // Twenty messages at once (one event each): a receive takes ten at most, so both
    // invocations have some, each sending one request at a time for about a second.
    let one_each: Vec<_> = (0..20).map(|i| events(&format!("e{i}"), 1)).collect();
    futures::future::join_all(one_each.iter().map(|e| sys.publish(&topic, e))).await;
    eventually(WAIT, "20 events at the subscriber", || async {
        (slow.event_count() >= 20).then_some(())
    })
    .await;

    assert_eq!(slow.most_in_flight(), 2, "two instances, one request each");
    let ids: BTreeSet<String> = slow.received().iter().flat_map(|r| r.ids()).collect();
    assert_eq!(ids, (0..20).map(|i| format!("e{i}-0")).collect());
    assert_eq!(slow.event_count(), 20, "each event once");
    sys.shutdown().await;
}
