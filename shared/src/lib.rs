//! The rules of gridrelay's delivery contract, as pure functions over plain types.
//!
//! It exists so that Event Grid's rules live in one place that can be unit- and property-tested
//! without any AWS, HTTP or async runtime. This crate depends on neither tokio, the AWS SDKs
//! nor an HTTP client, so the compiler keeps I/O out of it: the traits through which the
//! functions do I/O are in `gridrelay-ports`, their AWS and HTTP implementations in
//! `gridrelay-adapters`.
//!
//! - Limits and inputs: [`limits`], [`time_scale`], [`subscription`], [`filter`], [`publish`],
//!   [`schema`], [`raw_json`], [`sas`], [`validation`], [`delivery_attributes`].
//! - Delivery: [`deadline`] (an invocation's last moment for I/O), [`caps`], [`classify`], [`destination`] (AWS resources as endpoints, S4), [`schedule`], [`batching`], [`decision`], [`health`],
//!   [`message`], [`delivery`] (what happens to each due event and after each attempt).
//! - Dead-lettering: [`dead_letter`] (the L6 format), [`dead_letter_write`] (what the
//!   dead-letter function writes, tries again or drops).
//! - Seeing what happened: [`journal`] (every step of an event's life, and reading it back).
//!
//! Requirement IDs such as `R1` or `S3` are defined in `docs/delivery-rules.md`.

pub mod activity;
pub mod archive;
pub mod batching;
pub mod caps;
pub mod classify;
pub mod concurrency;
pub mod dead_letter;
pub mod dead_letter_write;
pub mod deadline;
pub mod decision;
pub mod dedup;
pub mod delivery;
pub mod delivery_attributes;
pub mod destination;
pub mod filter;
pub mod health;
pub mod journal;
pub mod limits;
pub mod message;
pub mod oauth;
pub mod ordering;
pub mod outbound;
pub mod portal;
pub mod publish;
pub mod queue_seal;
pub mod queue_text;
pub mod raw_json;
pub mod readable;
pub mod replay;
pub mod sas;
pub mod schedule;
pub mod schema;
pub mod signing;
pub mod subscription;
pub mod time_scale;
pub mod validation;
