//! gridrelay end to end, one test binary (every module shares one link of the AWS SDKs): the
//! real local system (`gridrelay local`'s runner, or the functions' bootstrap binaries) against
//! the AWS API at `AWS_ENDPOINT_URL` (moto by default), with subscribers that are real HTTP
//! servers on 127.0.0.1. One module per area. `tests/redaction.rs` is a binary of its own: it
//! captures every log line of its process.

// Test code: an unwrap that fails is a failed test (the workspace denies it elsewhere).
#![allow(clippy::unwrap_used)]

mod aws_faults;
mod clients;
mod deadlines;
mod dedup;
mod delivery;
mod delivery_caps;
mod endpoint_health;
mod event_source;
mod filters;
mod headers;
mod lambda_bootstrap;
mod late_success;
mod notifications;
mod oauth;
mod ordering;
mod outbound;
mod provision;
mod replays;
mod resources;
mod robustness;
mod schemas;
mod signing;
mod validation;
mod warm_cache;
