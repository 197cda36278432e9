//! Parsing of the command line's values (durations, GPU counts, KEY=VALUE) and the request ids
//! that make retried calls idempotent.

/// Parses a wall-clock limit into seconds.
pub fn parse_time(s: &str) -> Result<u64, String> {
    let err = || format!("cannot parse \"{s}\" as a duration (use e.g. 90s, 30m, 2h, 1h30m, 1:30:00)");
    let secs = if s.contains(':') {
        let parts: Vec<&str> = s.split(':').collect();
        if parts.len() > 3 || parts.iter().any(|p| p.is_empty() || !p.chars().all(|c| c.is_ascii_digit())) {
            return Err(err());
        }
        parts
            .iter()
            .try_fold(0u64, |acc, p| Some(acc.checked_mul(60)? + p.parse::<u64>().ok()?))
            .ok_or_else(err)?
    } else if !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()) {
        s.parse::<u64>().ok().and_then(|m| m.checked_mul(60)).ok_or_else(err)?
    } else {
        humantime::parse_duration(s).map_err(|_| err())?.as_secs()
    };
    if secs == 0 {
        return Err(format!("\"{s}\" is zero; a time limit must be at least one second"));
    }
    Ok(secs)
}

pub fn parse_gpus(s: &str) -> Result<u32, String> {
    match s.parse::<i64>() {
        Ok(n) if n < 0 => Err(format!("{n} is negative; a job needs at least 1 GPU")),
        Ok(n) => u32::try_from(n).map_err(|_| format!("{n} is too large")),
        Err(_) => Err(format!("\"{s}\" is not a whole number")),
    }
}

pub fn parse_min_gpus(s: &str) -> Result<u32, String> {
    match parse_gpus(s)? {
        0 => Err("an elastic job runs on at least 1 GPU".to_string()),
        n => Ok(n),
    }
}

pub fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("\"{s}\" is not KEY=VALUE"))
}

/// A comma-separated list, blanks dropped.
pub fn csv(s: &str) -> Vec<String> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty()).map(String::from).collect()
}

/// A practically unique id for one `kairos submit` or `token create` invocation.
pub fn request_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    format!("cli-{}-{nanos:x}-{random:016x}", std::process::id())
}
