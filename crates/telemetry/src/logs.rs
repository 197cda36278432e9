//! Log output of the daemons: `--log-format text` (the default; ANSI colours only on a
//! terminal) or `json` (one JSON object per line, for log shippers). The filter comes from
//! `KAIROS_LOG` (tracing's env-filter syntax), else the daemon's default.

use std::io::IsTerminal;

/// How logs are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the global subscriber writing to stderr.
pub fn init(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("KAIROS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().with_current_span(false).init(),
    }
}
