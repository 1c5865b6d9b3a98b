//! The library every gridrelay function shares.
//!
//! It exists so that the rules of Event Grid's delivery contract live in one place, as pure
//! functions over plain types that can be unit- and property-tested without any AWS or HTTP,
//! while the three Lambda functions, the local runner and the command line stay thin.
//!
//! - Domain rules (no I/O): [`limits`], [`time_scale`], [`subscription`], [`classify`],
//!   [`schedule`], [`batching`], [`publish`], [`message`], [`decision`], [`dead_letter`].
//! - I/O behind small traits: [`ports`].
//! - Adapters: [`aws`] (SQS, DynamoDB, S3 with the official SDK crates) and [`http_sender`]
//!   (subscriber endpoints over `reqwest`).
//! - Wiring read from the environment: [`config`].
//!
//! Requirement IDs such as `R1` or `S3` refer to `spec/delivery-semantics.md`.

pub mod aws;
pub mod batching;
pub mod classify;
pub mod config;
pub mod dead_letter;
pub mod decision;
pub mod delivery_attributes;
pub mod fan_out;
pub mod filter;
pub mod health;
pub mod http_sender;
pub mod limits;
pub mod message;
pub mod ports;
pub mod publish;
pub mod registration;
pub mod sas;
pub mod schedule;
pub mod schema;
pub mod subscription;
pub mod time_scale;
pub mod validation;
