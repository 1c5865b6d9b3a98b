//! gridrelay's ports (`gridrelay-ports`) on real parts.
//!
//! It exists so that everything that talks to the outside world is thin and in one place:
//! [`aws`] (SQS, DynamoDB, S3, Secrets Manager with the official SDK crates), [`http_sender`]
//! (subscriber endpoints over `hyper`), and [`config`] (the names of the settings the
//! functions read from their environment). End-to-end tests run these against an AWS API
//! (moto by default); unit tests and simulations use `gridrelay_ports::memory` instead.

pub mod aws;
pub mod config;
pub mod descriptors;
pub mod http_sender;
pub mod journal;
pub mod metrics;
pub mod outbound;
pub mod runtime;
