//! What every binary needs on the wire besides the generated types: bearer credentials in
//! request metadata, and TLS settings from PEM files.

use std::path::{Path, PathBuf};

use tonic::metadata::MetadataMap;
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// Metadata key of every bearer credential (`Bearer <credential>`).
pub const AUTH_HEADER: &str = "authorization";
/// Metadata key of the pause (ms) a controller that sheds a call asks its caller to take before
/// trying again (an agent's registration while the leader has too many in flight).
pub const RETRY_AFTER_HEADER: &str = "retry-after-ms";
/// Longest credential read from a request or a file.
pub const CREDENTIAL_LEN_MAX: usize = 512;

/// The credential of a request's `authorization: Bearer …` header, if well formed.
pub fn bearer(metadata: &MetadataMap) -> Option<&str> {
    let value = metadata.get(AUTH_HEADER)?.to_str().ok()?;
    let cred = value.strip_prefix("Bearer ")?.trim();
    (!cred.is_empty() && cred.len() <= CREDENTIAL_LEN_MAX).then_some(cred)
}

/// Sets a request's bearer credential (a credential that is not valid header text is not sent).
pub fn set_bearer(metadata: &mut MetadataMap, credential: &str) {
    if let Ok(v) = format!("Bearer {credential}").parse() {
        metadata.insert(AUTH_HEADER, v);
    }
}

/// Reads a credential file: its first line, trimmed; printable ASCII, `min_len` to
/// `CREDENTIAL_LEN_MAX` characters.
pub fn read_credential(path: &Path, min_len: usize) -> Result<String, WireError> {
    let text = std::fs::read_to_string(path).map_err(|e| WireError(format!("{}: {e}", path.display())))?;
    let line = text.lines().next().unwrap_or("").trim().to_string();
    if line.len() < min_len || line.len() > CREDENTIAL_LEN_MAX || !line.bytes().all(|b| b.is_ascii_graphic())
    {
        return Err(WireError(format!(
            "{}: a credential file holds one line of {min_len}-{CREDENTIAL_LEN_MAX} printable characters",
            path.display()
        )));
    }
    Ok(line)
}

/// `read_credential` with the length every token has at least.
pub fn read_credential_file(path: &Path) -> Result<String, WireError> {
    read_credential(path, 16)
}

/// Writes `content` (one line) to a new file readable by its owner only, synced; an existing
/// file is kept. Returns whether it wrote.
pub fn write_private_new(path: &Path, content: &str) -> Result<bool, WireError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let err = |e: std::io::Error| WireError(format!("writing {}: {e}", path.display()));
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(mut f) => {
            f.write_all(format!("{}\n", content.trim_end()).as_bytes()).map_err(err)?;
            f.sync_all().map_err(err)?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(err(e)),
    }
}

/// Constant-time equality of two credentials (their length is not secret).
pub fn ct_eq(a: &str, b: &str) -> bool {
    let diff = a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    a.len() == b.len() && std::hint::black_box(diff) == 0
}

/// A credential file or TLS setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct WireError(pub String);

/// PEM files: the CA that signs the cluster's certificates, and this process's own pair. With
/// feature `args`, the daemons' one set of TLS flags (`kairosd` and `kairos-agent` flatten it).
#[derive(Clone, Debug, Default)]
#[cfg_attr(feature = "args", derive(clap::Args))]
pub struct TlsFiles {
    /// TLS: the CA certificate (PEM) that signs the cluster's certificates (controllers', peers',
    /// agents'); with it, this daemon talks to the others over TLS only.
    #[cfg_attr(feature = "args", arg(long))]
    pub ca: Option<PathBuf>,
    /// TLS: this daemon's certificate (PEM), with --key: its services are then served over TLS
    /// only, and it is presented to peers that require mutual TLS.
    #[cfg_attr(feature = "args", arg(long, requires = "key"))]
    pub cert: Option<PathBuf>,
    /// TLS: this daemon's private key (PEM).
    #[cfg_attr(feature = "args", arg(long, requires = "cert"))]
    pub key: Option<PathBuf>,
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, WireError> {
    let bytes = std::fs::read(path).map_err(|e| WireError(format!("{what} {}: {e}", path.display())))?;
    if !String::from_utf8_lossy(&bytes).contains("-----BEGIN ") {
        return Err(WireError(format!("{what} {}: not a PEM file", path.display())));
    }
    Ok(bytes)
}

impl TlsFiles {
    /// This process's certificate and key, when both are given (one alone is an error).
    fn identity(&self) -> Result<Option<Identity>, WireError> {
        match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Ok(Some(Identity::from_pem(read("--cert", c)?, read("--key", k)?))),
            (None, None) => Ok(None),
            _ => Err(WireError("--cert and --key go together".into())),
        }
    }

    fn ca(&self) -> Result<Option<Certificate>, WireError> {
        self.ca.as_deref().map(|p| read("--ca", p).map(Certificate::from_pem)).transpose()
    }

    /// Serving TLS: needs `--cert`/`--key`; with `require_client_cert`, clients must present a
    /// certificate signed by `--ca` (mutual TLS). `None` = plaintext.
    pub fn server(&self, require_client_cert: bool) -> Result<Option<ServerTlsConfig>, WireError> {
        let Some(identity) = self.identity()? else {
            return match require_client_cert {
                true => Err(WireError("mutual TLS needs --cert and --key".into())),
                false => Ok(None),
            };
        };
        let mut config = ServerTlsConfig::new().identity(identity);
        if require_client_cert {
            let ca = self.ca()?.ok_or_else(|| WireError("mutual TLS needs --ca".into()))?;
            config = config.client_ca_root(ca).client_auth_optional(false);
        }
        Ok(Some(config))
    }

    /// Connecting over TLS: servers are verified against `--ca`; `--cert`/`--key`, when given,
    /// are presented for mutual TLS. `None` (no `--ca`) = plaintext.
    pub fn client(&self) -> Result<Option<ClientTlsConfig>, WireError> {
        let Some(ca) = self.ca()? else { return Ok(None) };
        let mut config = ClientTlsConfig::new().ca_certificate(ca);
        if let Some(identity) = self.identity()? {
            config = config.identity(identity);
        }
        Ok(Some(config))
    }
}

/// `https://addr` with TLS, `http://addr` without.
pub fn url(addr: &str, tls: bool) -> String {
    format!("{}://{addr}", if tls { "https" } else { "http" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_headers_are_parsed_strictly() {
        let mut md = MetadataMap::new();
        assert_eq!(bearer(&md), None);
        set_bearer(&mut md, "tok");
        assert_eq!(bearer(&md), Some("tok"));
        md.insert(AUTH_HEADER, "Basic tok".parse().unwrap());
        assert_eq!(bearer(&md), None);
        md.insert(AUTH_HEADER, format!("Bearer {}", "x".repeat(600)).parse().unwrap());
        assert_eq!(bearer(&md), None);
    }

    #[test]
    fn tls_settings_are_checked_before_use() {
        let none = TlsFiles::default();
        assert!(none.server(false).unwrap().is_none() && none.client().unwrap().is_none());
        assert!(none.server(true).is_err());
        let dir = std::env::temp_dir().join(format!("kairos-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let only_cert = TlsFiles { cert: Some(junk.clone()), ..Default::default() };
        assert!(only_cert.server(false).unwrap_err().0.contains("go together"));
        let bad_ca = TlsFiles { ca: Some(junk.clone()), ..Default::default() };
        assert!(bad_ca.client().unwrap_err().0.contains("not a PEM file"));
        let missing = TlsFiles { ca: Some(dir.join("absent.pem")), ..Default::default() };
        assert!(missing.client().unwrap_err().0.contains("absent.pem"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
