//! Contexts, like kubeconfig's: named clusters (controller addresses, a token file, TLS files)
//! in `$XDG_CONFIG_HOME/kairos/config.toml` (else `~/.config/kairos/config.toml`), one of them
//! current. `kairos context list|use|delete`; `kairos up` adds its own and makes it current,
//! never changing another.
//!
//! ```toml
//! current = "prod"
//! [contexts.prod]
//! controllers = ["10.0.0.1:7001", "10.0.0.2:7001", "10.0.0.3:7001"]
//! token_file = "/home/alice/.config/kairos/prod.token"
//! ca = "/etc/kairos/ca.pem"          # optional, also cert and key
//! [contexts.local]
//! controllers = ["127.0.0.1:7001"]
//! token_file = "/home/alice/kairos-data/admin.token"
//! ```
//!
//! What a command uses, first found: its flags, then the environment (`KAIROS_CONTROLLERS`,
//! `KAIROS_TOKEN_FILE`, `KAIROS_TOKEN`, `KAIROS_CA`…), then the context (`--context` or
//! `KAIROS_CONTEXT`, else the current one), then the defaults (`127.0.0.1:7001`,
//! `~/.config/kairos/token`). A context's credentials (token file, TLS files) go only with its
//! own addresses (`Config::resolve`): `--controllers` naming other addresses leaves the current
//! context out entirely, so a stale or unrelated context never lends them a token.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use clap::Subcommand;
use serde::{Deserialize, Serialize};

use crate::output::print_list;

#[derive(Subcommand, Debug)]
pub enum ContextCmd {
    /// List the contexts (the current one marked *).
    List,
    /// Make a context the current one.
    Use {
        /// The context's name.
        name: String,
    },
    /// Forget a context (its files stay).
    Delete {
        /// The context's name.
        name: String,
    },
}

/// The contexts file.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
}

/// One cluster as the CLI reaches it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Context {
    pub controllers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PathBuf>,
}

/// What `Config::resolve` decided for a command.
#[derive(Debug, PartialEq)]
pub struct Resolved {
    /// The controllers to call.
    pub controllers: Vec<String>,
    /// The context whose credentials go with them, and its name (None: no context's).
    pub context: Option<(String, Context)>,
}

/// `$XDG_CONFIG_HOME/kairos`, else `$HOME/.config/kairos`.
pub fn config_dir() -> Option<PathBuf> {
    let config = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(config.join("kairos"))
}

fn config_path() -> Option<PathBuf> {
    config_dir().map(|d| d.join("config.toml"))
}

impl Config {
    /// The contexts file, or an empty one where there is none.
    pub fn load() -> anyhow::Result<Config> {
        let Some(path) = config_path() else { return Ok(Config::default()) };
        Config::load_from(&path)
    }

    fn load_from(path: &Path) -> anyhow::Result<Config> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Config::default()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        toml::from_str(&text)
            .map_err(|e: toml::de::Error| anyhow::anyhow!("{}: {}", path.display(), e.message()))
    }

    /// Writes the file whole (a new file renamed over the old, private to its owner).
    pub fn save(&self) -> anyhow::Result<PathBuf> {
        let path = config_path().context("no HOME or XDG_CONFIG_HOME to keep contexts in")?;
        self.save_to(&path)?;
        Ok(path)
    }

    fn save_to(&self, path: &Path) -> anyhow::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = path.parent().context("contexts file without a directory")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let text = toml::to_string(self).context("encoding contexts")?;
        let tmp = dir.join(format!(".config.toml.{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(text.as_bytes())
            .and_then(|_| f.sync_all())
            .with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("replacing {}", path.display()))
    }

    /// The context a command uses: `named` (`--context`), else the current one; None when
    /// neither names one. A name that is not there is an error.
    pub fn selected(&self, named: Option<&str>) -> anyhow::Result<Option<(&str, &Context)>> {
        let Some(name) = named.or(self.current.as_deref()) else { return Ok(None) };
        match self.contexts.get_key_value(name) {
            Some((n, c)) => Ok(Some((n.as_str(), c))),
            None => bail!("context \"{name}\" not found (known: {})", self.known()),
        }
    }

    /// Which controllers a command calls, and the context whose credentials (token file, TLS
    /// files) go with them. `named` is `--context`/`KAIROS_CONTEXT`, `given`
    /// `--controllers`/`KAIROS_CONTROLLERS`, `default` the address used without either.
    ///
    /// - A context named explicitly applies, with `given` addresses in place of its own (the
    ///   caller pairs them); a name that is not there is an error.
    /// - Otherwise the current context applies when no addresses are given, or when every given
    ///   address is one of its own (e.g. one replica of it); other addresses are another
    ///   cluster, and the current context, even one that is not there, is left out.
    pub fn resolve(
        &self,
        named: Option<&str>,
        given: Option<&[String]>,
        default: &str,
    ) -> anyhow::Result<Resolved> {
        let current = match (named, given) {
            (Some(_), _) | (None, None) => self.selected(named)?,
            (None, Some(given)) => self.selected(None).ok().flatten().filter(|(_, c)| {
                !given.is_empty()
                    && given.iter().all(|a| c.controllers.iter().any(|own| own.trim() == a.trim()))
            }),
        };
        let context = current.map(|(n, c)| (n.to_string(), c.clone()));
        let controllers = match (given, &context) {
            (Some(given), _) => given.to_vec(),
            (None, Some((_, c))) if !c.controllers.is_empty() => c.controllers.clone(),
            _ => vec![default.to_string()],
        };
        Ok(Resolved { controllers, context })
    }

    fn known(&self) -> String {
        if self.contexts.is_empty() {
            return "none".into();
        }
        self.contexts.keys().cloned().collect::<Vec<_>>().join(", ")
    }

    /// Adds `ctx` for a local cluster under a name of its own and makes it current: `local`,
    /// unless that names another cluster (then `local-PORT`, `local-PORT-2`, …). A context
    /// that already is this one (same controllers and token file) is reused. Returns its name.
    pub fn add_local(&mut self, ctx: Context) -> String {
        let port = ctx.controllers.first().and_then(|a| a.rsplit(':').next()).unwrap_or("0").to_string();
        let candidates = std::iter::once("local".to_string())
            .chain(std::iter::once(format!("local-{port}")))
            .chain((2..).map(|n| format!("local-{port}-{n}")));
        let mut name = String::new();
        for candidate in candidates {
            match self.contexts.get(&candidate) {
                Some(existing) if *existing != ctx => continue,
                _ => {
                    name = candidate;
                    break;
                }
            }
        }
        self.contexts.insert(name.clone(), ctx);
        self.current = Some(name.clone());
        name
    }
}

pub fn context_command(json: bool, command: ContextCmd) -> anyhow::Result<i32> {
    let mut config = Config::load()?;
    match command {
        ContextCmd::List => {
            let current = config.current.clone().unwrap_or_default();
            let rows: Vec<(&String, &Context)> = config.contexts.iter().collect();
            print_list(
                json,
                &rows,
                |(name, c)| {
                    serde_json::json!({"name": name, "current": **name == current, "controllers": c.controllers,
                        "token_file": c.token_file, "ca": c.ca})
                },
                &["CURRENT", "NAME", "CONTROLLERS", "TOKEN_FILE"],
                |(name, c)| {
                    let mark = if **name == current { "*" } else { "" };
                    let token = c.token_file.as_ref().map_or("-".into(), |p| p.display().to_string());
                    vec![mark.into(), name.to_string(), c.controllers.join(","), token]
                },
            );
        }
        ContextCmd::Use { name } => {
            if !config.contexts.contains_key(&name) {
                bail!("context \"{name}\" not found (known: {})", config.known());
            }
            config.current = Some(name.clone());
            config.save()?;
            println!("context \"{name}\" is current");
        }
        ContextCmd::Delete { name } => {
            if config.contexts.remove(&name).is_none() {
                bail!("context \"{name}\" not found (known: {})", config.known());
            }
            if config.current.as_deref() == Some(name.as_str()) {
                config.current = None;
            }
            config.save()?;
            println!("context \"{name}\" deleted");
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(addr: &str, token: &str) -> Context {
        Context { controllers: vec![addr.into()], token_file: Some(token.into()), ..Context::default() }
    }

    #[test]
    fn a_local_cluster_gets_its_own_context_and_never_replaces_another() {
        let mut c = Config::default();
        assert_eq!(c.add_local(ctx("127.0.0.1:7001", "/a/admin.token")), "local");
        // The same cluster again: the same context.
        assert_eq!(c.add_local(ctx("127.0.0.1:7001", "/a/admin.token")), "local");
        // Another one: a name of its own; the first is kept as it was.
        assert_eq!(c.add_local(ctx("127.0.0.1:7101", "/b/admin.token")), "local-7101");
        assert_eq!(c.add_local(ctx("127.0.0.1:7101", "/c/admin.token")), "local-7101-2");
        assert_eq!(c.contexts["local"], ctx("127.0.0.1:7001", "/a/admin.token"));
        assert_eq!(c.current.as_deref(), Some("local-7101-2"));
        assert_eq!(c.contexts.len(), 3);
    }

    #[test]
    fn the_file_round_trips_refuses_unknown_keys_and_a_missing_context_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kairos").join("config.toml");
        assert_eq!(Config::load_from(&path).unwrap(), Config::default());
        let mut c = Config::default();
        c.add_local(ctx("127.0.0.1:7001", "/a/admin.token"));
        c.save_to(&path).unwrap();
        assert_eq!(Config::load_from(&path).unwrap(), c);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&path, "current = \"x\"\ncontrolers = 1\n").unwrap();
        let err = Config::load_from(&path).unwrap_err().to_string();
        assert!(err.contains("controlers"), "{err}");
        let err = c.selected(Some("prod")).unwrap_err().to_string();
        assert_eq!(err, "context \"prod\" not found (known: local)");
        assert_eq!(c.selected(None).unwrap().map(|(n, _)| n), Some("local"));
    }

    fn addrs(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// Two contexts: `prod` (three replicas, current) and `local`.
    fn two() -> Config {
        let mut c = Config::default();
        c.add_local(ctx("127.0.0.1:7001", "/a/admin.token"));
        let prod = Context {
            controllers: addrs(&["10.0.0.1:7001", "10.0.0.2:7001", "10.0.0.3:7001"]),
            token_file: Some("/p/prod.token".into()),
            ca: Some("/p/ca.pem".into()),
            ..Context::default()
        };
        c.contexts.insert("prod".into(), prod);
        c.current = Some("prod".into());
        c
    }

    fn used(r: &Resolved) -> (Vec<String>, Option<&str>) {
        (r.controllers.clone(), r.context.as_ref().map(|(n, _)| n.as_str()))
    }

    #[test]
    fn without_addresses_the_current_or_named_context_gives_them_and_its_credentials() {
        let c = two();
        let r = c.resolve(None, None, "127.0.0.1:7001").unwrap();
        assert_eq!(used(&r), (c.contexts["prod"].controllers.clone(), Some("prod")));
        assert_eq!(r.context.unwrap().1, c.contexts["prod"]);
        let r = c.resolve(Some("local"), None, "127.0.0.1:7001").unwrap();
        assert_eq!(used(&r), (addrs(&["127.0.0.1:7001"]), Some("local")));
        // No context at all: the default address, no credentials.
        let r = Config::default().resolve(None, None, "127.0.0.1:7001").unwrap();
        assert_eq!(used(&r), (addrs(&["127.0.0.1:7001"]), None));
        // A name that is not there is an error, as is a current one that is gone.
        let err = c.resolve(Some("staging"), None, "x").unwrap_err().to_string();
        assert_eq!(err, "context \"staging\" not found (known: local, prod)");
        let gone = Config { current: Some("old".into()), ..two() };
        assert!(gone.resolve(None, None, "x").is_err());
    }

    #[test]
    fn given_addresses_take_the_current_contexts_credentials_only_when_they_are_its_own() {
        let c = two();
        // All of its addresses, or some of them (one replica): the context's credentials.
        let all = c.contexts["prod"].controllers.clone();
        assert_eq!(used(&c.resolve(None, Some(&all), "x").unwrap()), (all.clone(), Some("prod")));
        let one = addrs(&["10.0.0.2:7001"]);
        assert_eq!(used(&c.resolve(None, Some(&one), "x").unwrap()), (one.clone(), Some("prod")));
        // Any address of another cluster: no context's token or TLS files at all.
        for other in
            [addrs(&["127.0.0.1:1"]), addrs(&["10.0.0.1:7001", "127.0.0.1:1"]), addrs(&["127.0.0.1:7001"])]
        {
            assert_eq!(
                used(&c.resolve(None, Some(&other), "x").unwrap()),
                (other.clone(), None),
                "{other:?}"
            );
        }
        // A current context that is gone does not stand in the way of given addresses.
        let gone = Config { current: Some("old".into()), ..two() };
        assert_eq!(used(&gone.resolve(None, Some(&one), "x").unwrap()), (one.clone(), None));
        // A context named explicitly pairs its credentials with the given addresses.
        let other = addrs(&["127.0.0.1:1"]);
        assert_eq!(used(&c.resolve(Some("prod"), Some(&other), "x").unwrap()), (other, Some("prod")));
    }
}
