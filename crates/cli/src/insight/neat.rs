//! Rounding a measurement up to a value people write: durations to neat units, memory to whole
//! GiB (or 256 MiB steps below one), and the text of each as the CLI's flags take it.

use std::time::Duration;

/// Neat wall-clock limits, seconds: the first at or above a need is proposed.
const NEAT_SECS: [u64; 26] = [
    60, 120, 300, 600, 900, 1_200, 1_800, 2_700, 3_600, 5_400, 7_200, 10_800, 14_400, 21_600, 28_800, 43_200,
    57_600, 86_400, 129_600, 172_800, 259_200, 345_600, 432_000, 604_800, 864_000, 1_209_600,
];

/// The neat duration at or above `secs` (whole days past two weeks).
pub fn duration_up(secs: u64) -> u64 {
    NEAT_SECS.iter().copied().find(|n| *n >= secs).unwrap_or_else(|| secs.div_ceil(86_400) * 86_400)
}

/// A duration as the policy file and `--time` take it: `20m`, `1h30m`, `2days`; whole minutes
/// from ten minutes on.
pub fn duration_text(secs: u64) -> String {
    let secs = if secs >= 600 { secs / 60 * 60 } else { secs };
    if secs == 0 {
        return "0s".into();
    }
    humantime::format_duration(Duration::from_secs(secs)).to_string().replace(' ', "")
}

/// Memory rounded up: whole GiB from 1 GiB, 256 MiB steps below.
pub fn mem_mib(need_mib: f64) -> u64 {
    let need = need_mib.ceil().max(1.0) as u64;
    if need >= 1024 {
        need.div_ceil(1024) * 1024
    } else {
        need.div_ceil(256) * 256
    }
}

/// A size as `--mem` and the policy file take it: `12G` for whole GiB, else `768M`.
pub fn mem_arg(m: u64) -> String {
    if m >= 1024 && m % 1024 == 0 {
        format!("{}G", m / 1024)
    } else {
        format!("{m}M")
    }
}

/// D-HH:MM:SS like sacct's Elapsed.
pub fn clock(seconds: i64) -> String {
    let (d, rest) = (seconds / 86_400, seconds % 86_400);
    let hms = format!("{:02}:{:02}:{:02}", rest / 3600, rest % 3600 / 60, rest % 60);
    if d > 0 {
        format!("{d}-{hms}")
    } else {
        hms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_sizes_round_up_to_neat_values() {
        assert_eq!(duration_up(1_080), 1_200);
        assert_eq!(duration_up(3_600), 3_600);
        assert_eq!(duration_up(3_601), 5_400);
        assert_eq!(duration_up(2_000_000), 24 * 86_400);
        assert_eq!(duration_text(1_200), "20m");
        assert_eq!(duration_text(5_400), "1h30m");
        assert_eq!(duration_text(725), "12m");
        assert_eq!(duration_text(45), "45s");
        assert_eq!(mem_mib(11_648.0), 12 * 1024);
        assert_eq!(mem_mib(300.0), 512);
        assert_eq!(
            (mem_arg(12 * 1024), mem_arg(512), mem_arg(1536)),
            ("12G".into(), "512M".into(), "1536M".into())
        );
        assert_eq!(clock(93_784), "1-02:03:04");
    }
}
