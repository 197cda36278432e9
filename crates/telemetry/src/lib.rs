//! What the daemons (`kairosd`, `kairos-agent`) share for operators: config files (`config`),
//! the Prometheus text exposition (`exposition`), the `/metrics` endpoint that serves it
//! and the HTTP/1.1 serving the gateway shares (`http`: axum on hyper), log output (`logs`:
//! `--log-format text|json`) and traces (`traces`).

pub mod config;
pub mod exposition;
pub mod http;
pub mod logs;
pub mod traces;

pub use exposition::{Exposition, Histogram};
