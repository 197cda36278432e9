//! Parsing of the command line's values (durations, times, GPU counts, KEY=VALUE) and the
//! request ids that make retried calls idempotent.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in Unix ms (what `--since 2h` counts back from).
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A `--since`/`--until` value in Unix ms: a time ago, a date, or an RFC 3339 time.
pub fn parse_when(s: &str, now: i64) -> Result<i64, String> {
    let s = s.trim();
    if let Ok(ago) = humantime::parse_duration(s) {
        return Ok(now - ago.as_millis() as i64);
    }
    let full = if s.len() == 10 { format!("{s}T00:00:00Z") } else { s.to_string() };
    humantime::parse_rfc3339_weak(&full)
        .map(|t| t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0))
        .map_err(|_| format!("cannot parse \"{s}\" (use e.g. 2h, 7d, 2026-11-30 or 2026-11-30T08:00:00Z)"))
}

/// Parses a wall-clock limit into seconds: Slurm's forms (`M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`,
/// `D-H:M:S`) or a human one (`90s`, `30m`, `2h`, `1h30m`, `2d`).
pub fn parse_time(s: &str) -> Result<u64, String> {
    let err =
        || format!("cannot parse \"{s}\" as a duration (use e.g. 90s, 30m, 2h, 1h30m, 1:30:00, 2-00:00:00)");
    let number = |p: &str| -> Option<u64> {
        (!p.is_empty() && p.chars().all(|c| c.is_ascii_digit())).then(|| p.parse().ok()).flatten()
    };
    // Units from the left: seconds per field of each form.
    let fields = |parts: &[&str], units: &[u64]| -> Option<u64> {
        (parts.len() <= units.len()).then_some(())?;
        parts
            .iter()
            .zip(units)
            .try_fold(0u64, |acc, (p, unit)| acc.checked_add(number(p)?.checked_mul(*unit)?))
    };
    let secs = if let Some((days, rest)) = s.split_once('-') {
        // D-H, D-H:M, D-H:M:S
        let rest: Vec<&str> = rest.split(':').collect();
        let day_secs = number(days).and_then(|d| d.checked_mul(86_400)).ok_or_else(err)?;
        fields(&rest, &[3600, 60, 1]).and_then(|r| r.checked_add(day_secs)).ok_or_else(err)?
    } else if s.contains(':') {
        // M:S or H:M:S
        let parts: Vec<&str> = s.split(':').collect();
        let units: &[u64] = if parts.len() == 2 { &[60, 1] } else { &[3600, 60, 1] };
        fields(&parts, units).ok_or_else(err)?
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

/// A reservation's `--start`/`--end` in Unix ms: `now`, a time from now (`+20s`, `+5m`,
/// `now+2h`, `+1d`), an RFC 3339 time (`2026-12-07T10:00:00Z`, `2026-12-07T11:00:00+01:00`), or
/// `YYYY-MM-DDTHH:MM[:SS]` / `YYYY-MM-DD` in UTC.
pub fn parse_at(s: &str, now: i64) -> Result<i64, String> {
    let s = s.trim();
    let err = || {
        format!(
            "cannot parse \"{s}\" as a time (use now, +20s, +5m, +2h, +1d, 2026-12-07T10:00:00Z or 2026-12-07T10:00)"
        )
    };
    if s.eq_ignore_ascii_case("now") {
        return Ok(now);
    }
    let relative = s.strip_prefix("now").unwrap_or(s);
    if let Some(ahead) = relative.strip_prefix('+') {
        let secs = parse_time(ahead).map_err(|_| err())?;
        let ms = i64::try_from(secs).ok().and_then(|x| x.checked_mul(1000)).ok_or_else(err)?;
        return now.checked_add(ms).ok_or_else(err);
    }
    // An offset (`+01:00`, `-05:00`) after the time: humantime reads UTC times only.
    let (text, offset_ms) = match s.len().checked_sub(6).map(|i| s.split_at(i)) {
        Some((t, off))
            if t.len() > 10
                && (off.starts_with('+') || off.starts_with('-'))
                && off.as_bytes()[3] == b':' =>
        {
            let sign = if off.starts_with('-') { -1 } else { 1 };
            let h: i64 = off[1..3].parse().map_err(|_| err())?;
            let m: i64 = off[4..6].parse().map_err(|_| err())?;
            (t, sign * (h * 3_600_000 + m * 60_000))
        }
        _ => (s, 0),
    };
    let text = text.strip_suffix('Z').or_else(|| text.strip_suffix('z')).unwrap_or(text);
    let full = match text.len() {
        10 => format!("{text}T00:00:00Z"),
        16 => format!("{text}:00Z"),
        _ => format!("{text}Z"),
    };
    let t = humantime::parse_rfc3339_weak(&full).map_err(|_| err())?;
    let ms = t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).map_err(|_| err())?;
    Ok(ms - offset_ms)
}

pub fn parse_gpus(s: &str) -> Result<u32, String> {
    match s.parse::<i64>() {
        Ok(n) if n < 0 => Err(format!("{n} is negative")),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slurm_time_form_and_the_human_ones_parse() {
        for (text, secs) in [
            ("90", 90 * 60),
            ("5:30", 5 * 60 + 30),
            ("1:30:00", 5400),
            ("2-00:00:00", 2 * 86_400),
            ("1-12", 86_400 + 12 * 3600),
            ("1-0:30", 86_400 + 30 * 60),
            ("0-00:05:00", 300),
            ("90s", 90),
            ("1h30m", 5400),
            ("2d", 2 * 86_400),
        ] {
            assert_eq!(parse_time(text), Ok(secs), "{text}");
        }
        for bad in ["", "-1", "1-", "a-1", "1-1:2:3:4", "1:2:3:4", "1::2", "0", "0-0", "x"] {
            assert!(parse_time(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn reservation_times_are_now_relative_rfc3339_or_utc_without_a_zone() {
        let now = 1_796_635_200_000; // 2026-12-07T09:20:00Z
        assert_eq!(parse_at("now", now), Ok(now));
        assert_eq!(parse_at("+20s", now), Ok(now + 20_000));
        assert_eq!(parse_at("now+5m", now), Ok(now + 300_000));
        assert_eq!(parse_at("+2h", now), Ok(now + 7_200_000));
        assert_eq!(parse_at("+1d", now), Ok(now + 86_400_000));
        let ten = 1_796_642_400_000; // 2026-12-07T11:20:00Z
        assert_eq!(parse_at("2026-12-07T11:20:00Z", now), Ok(ten));
        assert_eq!(parse_at("2026-12-07T11:20:00", now), Ok(ten));
        assert_eq!(parse_at("2026-12-07T11:20", now), Ok(ten));
        assert_eq!(parse_at("2026-12-07T12:20:00+01:00", now), Ok(ten));
        assert_eq!(parse_at("2026-12-07T06:20:00-05:00", now), Ok(ten));
        assert_eq!(parse_at("2026-12-07", now), Ok(ten - 11 * 3_600_000 - 20 * 60_000));
        for bad in ["", "soon", "+", "+0s", "2026-13-07T10:00:00Z", "tomorrow"] {
            assert!(parse_at(bad, now).unwrap_err().starts_with("cannot parse"), "{bad} accepted");
        }
    }
}

/// What a job waits for, from Slurm's `--dependency` form.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Dependencies {
    pub after_ok: Vec<u64>,
    pub after_any: Vec<u64>,
    pub after_not_ok: Vec<u64>,
}

impl Dependencies {
    /// These and those Slurm's form `spec` names.
    pub fn with(mut self, spec: Option<&str>) -> Result<Dependencies, String> {
        if let Some(d) = spec {
            let more = parse_dependency(d)?;
            self.after_ok.extend(more.after_ok);
            self.after_any.extend(more.after_any);
            self.after_not_ok.extend(more.after_not_ok);
        }
        Ok(self)
    }
}

/// `afterok:ID[:ID...][,afterany:ID...][,afternotok:ID...]` (every part must hold, as with
/// Slurm's `,`); Slurm's other types are refused by name. An id may be an array's (every
/// task) or `ARRAY_INDEX` is not taken: a task is named by its own job id.
pub fn parse_dependency(s: &str) -> Result<Dependencies, String> {
    let mut deps = Dependencies::default();
    if s.contains('?') {
        return Err(format!(
            "--dependency \"{s}\": \"?\" (any of) is not supported by kairos; separate types with \",\" (all of)"
        ));
    }
    for part in s.split(',') {
        let (kind, ids) = part.split_once(':').ok_or_else(|| {
            format!("--dependency \"{part}\": TYPE:ID[:ID...] is needed (afterok, afterany or afternotok)")
        })?;
        let list = match kind {
            "afterok" => &mut deps.after_ok,
            "afterany" => &mut deps.after_any,
            "afternotok" => &mut deps.after_not_ok,
            "after" | "aftercorr" | "afterburstbuffer" | "singleton" => {
                return Err(format!(
                "--dependency: {kind} is not supported by kairos (it has afterok, afterany and afternotok)"
            ))
            }
            other => {
                return Err(format!(
                    "--dependency: unknown type \"{other}\" (kairos has afterok, afterany and afternotok)"
                ))
            }
        };
        for id in ids.split(':') {
            if id.contains('+') {
                return Err(format!("--dependency: a delay (\"{id}\") is not supported by kairos"));
            }
            list.push(id.parse().map_err(|_| format!("--dependency: \"{id}\" is not a job id"))?);
        }
    }
    Ok(deps)
}

/// The most variables an exported environment may carry (the job spec's own bound is 256).
const EXPORT_VARS_MAX: usize = 200;

/// Who the submitter is and where their session lives: the node sets these for the account
/// the job runs as (which need not be the submitter's, `--as`), so they are never exported.
const SESSION_VARS: &[&str] = &[
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "MAIL",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "XDG_RUNTIME_DIR",
    "XDG_SESSION_ID",
    "DBUS_SESSION_BUS_ADDRESS",
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
];

/// The environment a job takes from its submitter, sbatch's `--export`: `ALL` (the default:
/// every variable but kairos's own — its credentials among them —, Slurm's, those the agent
/// sets for every run, the session's (`HOME`, `USER`, …: the node's account's), and names a
/// job may not carry), `NONE`, or `NAME` / `NAME=VALUE` items
/// (with `ALL` among them: all and those).
pub fn export_env(
    spec: Option<&str>,
    env: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, String> {
    let exportable = |k: &str| {
        !k.starts_with("KAIROS_")
            && !k.starts_with("SLURM_")
            && !SESSION_VARS.contains(&k)
            && !kairos_scheduler::validate::RESERVED_ENV.contains(&k)
            && !k.is_empty()
            && !k.starts_with(|c: char| c.is_ascii_digit())
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let mut out: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    for item in spec.unwrap_or("ALL").split(',').filter(|i| !i.is_empty()) {
        match item {
            "NONE" => {}
            "ALL" => {
                out.extend(env.iter().filter(|(k, _)| exportable(k)).map(|(k, v)| (k.clone(), v.clone())))
            }
            kv if kv.contains('=') => {
                let (k, v) = parse_env(kv)?;
                out.insert(k, v);
            }
            name => {
                if let Some(v) = env.get(name).filter(|_| exportable(name)) {
                    out.insert(name.to_string(), v.clone());
                }
            }
        }
    }
    if out.len() > EXPORT_VARS_MAX {
        return Err(format!(
            "the environment has {} variables, more than the {EXPORT_VARS_MAX} a job takes: \
             name them with --export=NAME,... or use --export=NONE",
            out.len()
        ));
    }
    Ok(out.into_iter().collect())
}

/// The most tasks one array (or one manifest's completions) has.
pub const ARRAY_TASKS_MAX: u32 = 10_000;

/// A job array's indices and task limit, Slurm's form: `0-31:2,40%4` (ranges with an optional
/// step, comma-separated; `%N`: at most N tasks at once).
pub fn parse_array(s: &str) -> Result<(Vec<u32>, Option<u32>), String> {
    let err = |why: &str| format!("cannot parse \"{s}\" as an array ({why}; use e.g. 0-7, 1,3,5, 0-31:2%4)");
    let (list, limit) = match s.split_once('%') {
        Some((list, n)) => {
            let n: u32 = n.parse().map_err(|_| err("%N must be a number"))?;
            if n == 0 {
                return Err(err("%N must be at least 1"));
            }
            (list, Some(n))
        }
        None => (s, None),
    };
    let number = |p: &str| p.trim().parse::<u32>().map_err(|_| err(&format!("\"{p}\" is not an index")));
    let mut indices = std::collections::BTreeSet::new();
    for part in list.split(',') {
        let (range, step) = match part.split_once(':') {
            Some((r, st)) => (r, number(st)?),
            None => (part, 1),
        };
        if step == 0 {
            return Err(err("a step must be at least 1"));
        }
        let (lo, hi) = match range.split_once('-') {
            Some((a, b)) => (number(a)?, number(b)?),
            None => (number(range)?, number(range)?),
        };
        if lo > hi {
            return Err(err(&format!("{lo}-{hi} is backwards")));
        }
        let mut i = lo;
        while i <= hi {
            indices.insert(i);
            if indices.len() > ARRAY_TASKS_MAX as usize {
                return Err(err(&format!("at most {ARRAY_TASKS_MAX} tasks")));
            }
            i = match i.checked_add(step) {
                Some(next) => next,
                None => break,
            };
        }
    }
    Ok((indices.into_iter().collect(), limit))
}

/// A job id, or an array task as `ARRAY_INDEX` (e.g. `41_3`).
pub fn parse_job_ref(s: &str) -> Result<(u64, Option<u32>), String> {
    let bad = || format!("invalid value '{s}': a job id (41) or an array task (41_3)");
    match s.split_once('_') {
        Some((id, index)) => Ok((id.parse().map_err(|_| bad())?, Some(index.parse().map_err(|_| bad())?))),
        None => Ok((s.parse().map_err(|_| bad())?, None)),
    }
}

#[cfg(test)]
mod array_tests {
    use super::*;

    #[test]
    fn dependency_forms_parse_like_slurm_and_the_rest_is_refused_by_name() {
        let d = parse_dependency("afterok:1:2,afternotok:3,afterany:4").unwrap();
        assert_eq!(d, Dependencies { after_ok: vec![1, 2], after_any: vec![4], after_not_ok: vec![3] });
        for (bad, says) in [
            ("aftercorr:5", "aftercorr is not supported"),
            ("singleton", "TYPE:ID"),
            ("after:5", "after is not supported"),
            ("afterok:5?afterany:6", "any of"),
            ("afterok:5+10", "delay"),
            ("afterok:x", "not a job id"),
            ("afterfoo:1", "unknown type \"afterfoo\""),
        ] {
            let e = parse_dependency(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn export_takes_all_but_kairos_and_slurm_variables_and_never_credentials() {
        let env: std::collections::BTreeMap<String, String> = [
            ("STEPS", "50"),
            ("KAIROS_TOKEN", "secret"),
            ("KAIROS_TOKEN_FILE", "/t"),
            ("SLURM_JOB_ID", "3"),
            ("CUDA_VISIBLE_DEVICES", "0"),
            ("RANK", "1"),
            ("BASH_FUNC_x%%", "() { :; }"),
            ("PATH", "/usr/bin"),
            ("HOME", "/home/admin"),
            ("SSH_AUTH_SOCK", "/tmp/agent.sock"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let all = export_env(None, &env).unwrap();
        assert_eq!(all, vec![("PATH".into(), "/usr/bin".into()), ("STEPS".into(), "50".into())]);
        assert!(export_env(Some("NONE"), &env).unwrap().is_empty());
        let some = export_env(Some("STEPS,KAIROS_TOKEN,X=1"), &env).unwrap();
        assert_eq!(some, vec![("STEPS".into(), "50".into()), ("X".into(), "1".into())]);
        let many: std::collections::BTreeMap<String, String> =
            (0..300).map(|i| (format!("V{i}"), "x".to_string())).collect();
        assert!(export_env(None, &many).unwrap_err().contains("--export=NONE"));
    }

    #[test]
    fn array_forms_parse_like_slurm() {
        assert_eq!(parse_array("0-7%2"), Ok(((0..8).collect(), Some(2))));
        assert_eq!(parse_array("0-31:8,40"), Ok((vec![0, 8, 16, 24, 40], None)));
        assert_eq!(parse_array("3,1,3"), Ok((vec![1, 3], None)));
        for bad in ["", "7-3", "1-x", "0-4%0", "0-9:0", "0-20000"] {
            assert!(parse_array(bad).unwrap_err().starts_with("cannot parse"), "{bad}");
        }
        assert_eq!(parse_job_ref("41_3"), Ok((41, Some(3))));
        assert_eq!(parse_job_ref("41"), Ok((41, None)));
        assert!(parse_job_ref("41_x").is_err());
    }
}
