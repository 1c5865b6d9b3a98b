//! Throughput of the per-event work on gridrelay's hot path, without I/O:
//! validating and stamping a publish body (ingest), cutting events into batches and building
//! the request body (deliver), and rendering dead-letter records (dead-letter).
//!
//! Run: `make bench` (release build). Prints one line per measurement.

use std::hint::black_box;
use std::time::{Duration, Instant};

use chrono::Utc;
use gridrelay_shared::batching::plan_batches;
use gridrelay_shared::classify::DeliveryOutcome;
use gridrelay_shared::dead_letter::{FieldNaming, render_object, render_record};
use gridrelay_shared::decision::DeadLetterReason;
use gridrelay_shared::message::{DeadLetterEntry, DeliveryHistory, DeliveryMessage, QueuedEvent};
use gridrelay_shared::publish::parse_event_grid_batch;
use gridrelay_shared::schema::{DeliverySchema, InputSchema, delivery_body, to_delivery_form};
use gridrelay_shared::subscription::BatchPolicy;

/// A publish body of `count` events of about `data_bytes` bytes of data each.
fn body(count: usize, data_bytes: usize) -> Vec<u8> {
    let data = "x".repeat(data_bytes);
    let events: Vec<String> = (0..count)
        .map(|i| {
            format!(
                r#"{{"id":"{i}","subject":"/orders/{i}","eventType":"Contoso.Orders.Created","eventTime":"2026-11-22T03:00:00Z","data":{{"blob":"{data}","n":{i}}}}}"#
            )
        })
        .collect();
    format!("[{}]", events.join(",")).into_bytes()
}

/// Runs `f` repeatedly for about a second; returns runs per second.
fn rate(mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut runs = 0u64;
    while start.elapsed() < Duration::from_secs(1) {
        f();
        runs += 1;
    }
    runs as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    for (count, size) in [(1_000usize, 900usize), (100, 9_900), (10, 99_000)] {
        let b = body(count, size);
        let per_sec = rate(|| {
            black_box(
                parse_event_grid_batch(black_box(&b), "/gridrelay/topics/orders")
                    .map(|v| v.len())
                    .ok(),
            );
        });
        println!(
            "ingest: validate+stamp {count} events of ~{}KB ({:.0} KB body): {:.0} events/s, {:.0} MB/s",
            (size + 100) / 1000,
            b.len() as f64 / 1000.0,
            per_sec * count as f64,
            per_sec * b.len() as f64 / 1e6
        );
    }

    let events =
        parse_event_grid_batch(&body(1_000, 900), "/gridrelay/topics/orders").unwrap_or_default();
    let queued: Vec<QueuedEvent> = events
        .into_iter()
        .map(|event| QueuedEvent::new(Utc::now(), event))
        .collect();
    let sizes: Vec<usize> = queued.iter().map(|e| e.event.get().len()).collect();
    let policy = BatchPolicy {
        max_events_per_batch: 100,
        preferred_batch_size_in_kilobytes: 64,
    };
    let per_sec = rate(|| {
        let batches = plan_batches(black_box(&sizes), &policy);
        for range in batches {
            black_box(delivery_body(
                queued[range].iter().map(|e| &*e.event),
                DeliverySchema::EventGridSchema,
            ));
        }
    });
    println!(
        "deliver: plan batches + build bodies: {:.0} events/s",
        per_sec * 1_000.0
    );

    let per_sec = rate(|| {
        for e in &queued {
            black_box(
                to_delivery_form(
                    &e.event,
                    InputSchema::EventGridSchema,
                    DeliverySchema::CloudEventSchemaV1_0,
                )
                .ok(),
            );
        }
    });
    println!(
        "fan-out: convert Event Grid events to CloudEvents (F2): {:.0} events/s",
        per_sec * 1_000.0
    );

    let history = DeliveryHistory {
        topic: "orders".into(),
        subscription: "audit".into(),
        subscription_id: "0123456789abcdef0123456789abcdef".into(),
        schema: Default::default(),
        attempts: 1,
        last_attempt: None,
        timed_out_attempt: None,
        rate_booked_at: None,
        probation: false,
        replay: None,
        redriven_from: None,
        redriven_at: None,
    };
    let not_before = Utc::now();
    let per_sec = rate(|| {
        let messages = DeliveryMessage::packed(&history, not_before, queued.clone());
        for m in messages {
            black_box(m.to_body().map(|b| b.len()).ok());
        }
    });
    println!(
        "deliver: re-enqueue encoding (pack + serialize): {:.0} events/s",
        per_sec * 1_000.0
    );

    let entries: Vec<DeadLetterEntry> = queued
        .iter()
        .map(|q| DeadLetterEntry {
            reason: DeadLetterReason::MaxDeliveryAttemptsExceeded,
            delivery_attempts: 30,
            last_outcome: Some(DeliveryOutcome::Busy),
            publish_time: q.publish_time,
            last_attempt_time: Some(Utc::now()),
            event: q.event.clone(),
        })
        .collect();
    let per_sec = rate(|| {
        let records: Vec<_> = entries
            .iter()
            .filter_map(|e| render_record(e, FieldNaming::EventGrid).ok())
            .collect();
        black_box(render_object(&records));
    });
    println!(
        "dead-letter: render L6 records into one object: {:.0} events/s",
        per_sec * 1_000.0
    );
}
