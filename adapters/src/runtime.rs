//! The async runtime every gridrelay function runs on: one thread.
//!
//! Lambda gives a function CPU in proportion to its memory, one vCPU's worth at 1,769 MB, so a
//! 256 MB function has about a seventh of a CPU however many cores its sandbox shows. A
//! multi-threaded runtime there buys no parallelism; it pays for it in work stealing and in
//! waking parked worker threads (a futex call each), once or more per request. `deliver` is
//! hundreds of requests waiting on sockets at once and little CPU between them, which one
//! thread serves with no wakeups across threads; `ingest` and `dead-letter` wait on one AWS
//! call after another and have nothing to run in parallel at all. The runtime alone, in
//! `gridrelay-bench engine` (2026-11-26, the two runtimes alternated, three runs each, nothing
//! else changed):
//! 0.026 to 0.029 ms of CPU per event on one thread against 0.033 to 0.038 ms on two, and
//! 0.50 to 0.58 of the loopback ceiling against 0.45 to 0.46. The endpoint limit it ended at
//! (77 to 93 against 81 to 96) shows the one thread's own delay is not read as a queue at the
//! endpoint.
//!
//! Blocking work still has tokio's blocking pool (name resolution uses it). Past 1,769 MB a
//! function has more than one vCPU; `deliver` at such a size would want a second thread.

/// The runtime each function's `main` runs on, and the engine benchmark with it.
pub fn function_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Runs `step` until `reply_margin` before `deadline` (#34 item 12): `None`, and `step` dropped,
/// if that came first; without a deadline (`DateTime::<Utc>::MAX_UTC`) to its end. What the
/// functions bound their AWS calls with, so an invocation returns before Lambda stops it
/// ([`gridrelay_shared::deadline`]).
pub async fn before_stop<T>(
    now: chrono::DateTime<chrono::Utc>,
    deadline: chrono::DateTime<chrono::Utc>,
    reply_margin: std::time::Duration,
    step: impl std::future::Future<Output = T>,
) -> Option<T> {
    match gridrelay_shared::deadline::until_stop(now, deadline, reply_margin) {
        None => Some(step.await),
        Some(left) => tokio::time::timeout(left, step).await.ok(),
    }
}
