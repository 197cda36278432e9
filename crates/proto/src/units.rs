//! Units of the wire's size fields, as users write them.

/// A memory size as Slurm writes it — a number with an optional unit K, M (the default), G or
/// T (binary; a trailing "B"/"iB" is accepted) — in MiB, rounded up.
pub fn parse_mem_mib(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let upper = t.to_ascii_uppercase();
    let body = upper.strip_suffix("IB").or_else(|| upper.strip_suffix('B')).unwrap_or(&upper);
    let (digits, kib) = match body.chars().last() {
        Some('K') => (&body[..body.len() - 1], 1u64),
        Some('M') => (&body[..body.len() - 1], 1 << 10),
        Some('G') => (&body[..body.len() - 1], 1 << 20),
        Some('T') => (&body[..body.len() - 1], 1 << 30),
        _ => (body, 1 << 10),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{t:?} is not a size (e.g. 512M, 16G)"))?;
    let kib = n.checked_mul(kib).ok_or_else(|| format!("{t:?} is too large"))?;
    Ok(kib.div_ceil(1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_slurm_writes_them() {
        assert_eq!(parse_mem_mib("256M"), Ok(256));
        assert_eq!(parse_mem_mib("256"), Ok(256), "MiB without a unit");
        assert_eq!(parse_mem_mib("2G"), Ok(2048));
        assert_eq!(parse_mem_mib("2GiB"), Ok(2048));
        assert_eq!(parse_mem_mib("1t"), Ok(1 << 20));
        assert_eq!(parse_mem_mib("1500K"), Ok(2), "rounded up");
        assert!(parse_mem_mib("lots").is_err());
        assert!(parse_mem_mib("99999999999999T").is_err());
    }
}
