//! Telemetry shared by the daemons (`kairosd`, `kairos-agent`): the Prometheus text exposition
//! (`exposition`), the `/metrics` endpoint that serves it (`http`), and log output (`logs`:
//! `--log-format text|json`).

pub mod exposition;
pub mod http;
pub mod logs;
pub mod traces;

pub use exposition::{Exposition, Histogram};
