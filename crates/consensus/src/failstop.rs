//! Fail-stop on storage errors: a replica whose disk fails (no space, EIO, a failed sync) must
//! stop rather than keep answering calls it can no longer serve durably. The storage layer
//! reports every error here; the daemon installs what happens then (`on_storage_error`: log
//! and exit non-zero). Without a hook (library tests) errors are only returned, as before.

use std::sync::OnceLock;

type Hook = Box<dyn Fn(&str) + Send + Sync>;

static HOOK: OnceLock<Hook> = OnceLock::new();

/// Installs what a storage error does to this process (once; later calls are ignored).
pub fn on_storage_error(hook: impl Fn(&str) + Send + Sync + 'static) {
    let _ = HOOK.set(Box::new(hook));
}

/// A storage operation failed with `what`.
pub fn storage_failed(what: &str) {
    if let Some(hook) = HOOK.get() {
        hook(what);
    }
}
