//! Which image of an index this node runs: the entry for its own operating system and CPU, in
//! OCI's (Go's) names — `std::env::consts` mapped (`x86_64` → `amd64`, `aarch64` → `arm64`, …).
//! A variant that is its architecture's baseline (arm64's `v8`, amd64's `v1`) counts as none,
//! so an arm64 node takes `linux/arm64` and `linux/arm64/v8` alike, and no other variant.
//! An entry that names no platform fits any node, after every entry that names this one.

use oci_spec::image::{Arch, Descriptor, MediaType, Os, Platform};

use super::{fail, PullError};

/// This node's platform.
pub(super) fn node() -> Platform {
    of(std::env::consts::OS, std::env::consts::ARCH)
}

/// The OCI platform of Rust's names for an operating system and a CPU architecture (`powerpc64`
/// and `mips64` by the endianness this agent was built for).
pub(super) fn of(os: &str, arch: &str) -> Platform {
    let little = cfg!(target_endian = "little");
    let goarch = match arch {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "loongarch64" => "loong64",
        "powerpc" => "ppc",
        "powerpc64" if little => "ppc64le",
        "powerpc64" => "ppc64",
        "mips64" if little => "mips64le",
        other => other,
    };
    let mut platform = Platform::default();
    platform.set_os(Os::from(os));
    platform.set_architecture(Arch::from(goarch));
    platform.set_variant((goarch == "arm64").then(|| "v8".to_string()));
    platform
}

/// `platform`'s variant with the baseline of its architecture as none.
fn variant(platform: &Platform) -> Option<&str> {
    let v = platform.variant().as_deref().filter(|v| !v.is_empty())?;
    let baseline = match platform.architecture() {
        Arch::ARM64 => ["v8", "8"],
        Arch::Amd64 => ["v1", "1"],
        _ => return Some(v),
    };
    (!baseline.contains(&v)).then_some(v)
}

/// Whether an image for `entry` runs on `node`.
fn fits(entry: &Platform, node: &Platform) -> bool {
    entry.os() == node.os() && entry.architecture() == node.architecture() && variant(entry) == variant(node)
}

/// `platform` as `os/arch[/variant]`.
pub(super) fn name(platform: &Platform) -> String {
    match platform.variant().as_deref().filter(|v| !v.is_empty()) {
        Some(v) => format!("{}/{}/{v}", platform.os(), platform.architecture()),
        None => format!("{}/{}", platform.os(), platform.architecture()),
    }
}

/// Whether `kind` is a list of manifests (OCI's image index, Docker's manifest list).
pub(super) fn is_index(kind: &MediaType) -> bool {
    *kind == MediaType::ImageIndex
        || kind.as_ref() == "application/vnd.docker.distribution.manifest.list.v2+json"
}

/// The first of `entries` made for `node` (else the first that names no platform); an error
/// naming the platforms there are when none is.
pub(super) fn choose<'a>(entries: &[&'a Descriptor], node: &Platform) -> Result<&'a Descriptor, PullError> {
    let named = entries.iter().find(|d| d.platform().as_ref().is_some_and(|p| fits(p, node)));
    if let Some(chosen) = named.or_else(|| entries.iter().find(|d| d.platform().is_none())) {
        return Ok(chosen);
    }
    let there: Vec<String> =
        entries.iter().filter_map(|d| d.platform().as_ref()).map(name).take(20).collect();
    fail(format!(
        "the image has no manifest for this node's platform {} (it has: {})",
        name(node),
        if there.is_empty() { "none".to_string() } else { there.join(", ") }
    ))
}

#[cfg(test)]
mod tests {
    use oci_spec::image::Digest;

    use super::*;

    /// A manifest descriptor for `platform` (`os/arch[/variant]`; "" for none), its digest
    /// made of `n`.
    fn entry(platform: &str, n: u8) -> Descriptor {
        let digest: Digest = format!("sha256:{}", format!("{n:02x}").repeat(32)).parse().unwrap();
        let mut d = Descriptor::new(MediaType::ImageManifest, 100, digest);
        let parts: Vec<&str> = platform.split('/').collect();
        if let [os, arch, rest @ ..] = parts.as_slice() {
            let mut p = Platform::default();
            p.set_os(Os::from(*os));
            p.set_architecture(Arch::from(*arch));
            p.set_variant(rest.first().map(|v| v.to_string()));
            d.set_platform(Some(p));
        }
        d
    }

    fn chosen(entries: &[Descriptor], node: &Platform) -> Result<u8, String> {
        let refs: Vec<&Descriptor> = entries.iter().collect();
        let d = choose(&refs, node).map_err(|e| e.to_string())?;
        Ok(u8::from_str_radix(&d.digest().digest()[..2], 16).unwrap())
    }

    #[test]
    fn the_nodes_own_architecture_is_chosen_from_an_index() {
        let index = [entry("linux/amd64", 1), entry("linux/arm64/v8", 2), entry("linux/arm/v7", 3)];
        assert_eq!(chosen(&index, &of("linux", "aarch64")), Ok(2));
        assert_eq!(chosen(&index, &of("linux", "x86_64")), Ok(1));
        // arm64 without a variant is arm64/v8; a later variant is not the baseline.
        let plain = [entry("linux/arm64/v9", 4), entry("linux/amd64", 1), entry("linux/arm64", 2)];
        assert_eq!(chosen(&plain, &of("linux", "aarch64")), Ok(2));
        // The order of the index does not decide: amd64 first or last, arm64 takes arm64.
        let reversed = [entry("linux/arm64", 2), entry("linux/amd64", 1)];
        assert_eq!(chosen(&reversed, &of("linux", "x86_64")), Ok(1));
        assert_eq!(chosen(&reversed, &of("linux", "aarch64")), Ok(2));
    }

    #[test]
    fn no_entry_for_the_node_is_a_clear_error_and_one_naming_no_platform_fits_any() {
        let index = [entry("linux/amd64", 1), entry("windows/arm64", 2), entry("linux/arm64/v9", 3)];
        let e = chosen(&index, &of("linux", "aarch64")).unwrap_err();
        assert!(
            e.contains("no manifest for this node's platform linux/arm64/v8")
                && e.contains("it has: linux/amd64, windows/arm64, linux/arm64/v9"),
            "{e}"
        );
        let e = chosen(&[], &of("linux", "riscv64")).unwrap_err();
        assert!(e.contains("linux/riscv64 (it has: none)"), "{e}");
        let unnamed = [entry("linux/amd64", 1), entry("", 5)];
        assert_eq!(chosen(&unnamed, &of("linux", "aarch64")), Ok(5));
        assert_eq!(chosen(&unnamed, &of("linux", "x86_64")), Ok(1));
    }

    #[test]
    fn rust_names_map_to_oci_names() {
        for (rust, oci) in [("x86_64", "amd64"), ("aarch64", "arm64"), ("x86", "386"), ("riscv64", "riscv64")]
        {
            assert_eq!(of("linux", rust).architecture().to_string(), oci);
        }
        assert_eq!(name(&of("linux", "aarch64")), "linux/arm64/v8");
        assert_eq!(name(&of("linux", "x86_64")), "linux/amd64");
        assert!(!matches!(node().architecture(), Arch::Other(_)), "{}", name(&node()));
        assert!(is_index(&MediaType::ImageIndex) && !is_index(&MediaType::ImageManifest));
    }
}
