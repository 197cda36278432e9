//! Whom a run executes as, and what environment it gets.
//!
//! `--run-as submitter` (the default when the agent is root): each run executes as the Unix
//! account named by the job's kairos user — or by the agent's user map — with that account's
//! uid, gid and supplementary groups, HOME/USER/LOGNAME/SHELL. No such account, or an account
//! that is root, fails the run at launch with the reason; it never falls back to root.
//! `--run-as agent`: runs execute as the agent's own user.
//!
//! Either way the environment is an allowlist of the agent's (PATH, locale, time zone) plus the
//! job's `--env` plus the kairos variables — never the agent's whole environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::ValueEnum;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RunAs {
    /// Each run as the Unix account of its job's user (the agent must be root).
    Submitter,
    /// Every run as the agent's own user.
    Agent,
}

impl RunAs {
    pub fn as_str(self) -> &'static str {
        match self {
            RunAs::Submitter => "submitter",
            RunAs::Agent => "agent",
        }
    }
}

/// Variables a run inherits from the agent's environment; nothing else of it reaches a job.
pub const ENV_ALLOWLIST: &[&str] = &["PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ"];
/// PATH for a run when the agent has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A Unix account a run executes as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnixAccount {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: PathBuf,
    pub shell: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    #[error("user map {path}:{line}: expected `KAIROS_USER = UNIX_ACCOUNT`")]
    MapSyntax { path: String, line: usize },
    #[error("user map {0}: {1}")]
    MapRead(String, std::io::Error),
}

/// How kairos users map to Unix accounts on this node.
#[derive(Clone, Debug)]
pub struct UnixAccounts {
    pub run_as: RunAs,
    map: BTreeMap<String, String>,
    /// UnixAccounts below this uid (system accounts: `sync`, `daemon`, …) are never taken by name
    /// alone; the user map may still name one explicitly.
    min_uid: u32,
}

/// The lowest uid a kairos user runs as by name alone (as `UID_MIN` in login.defs).
pub const MIN_UID_DEFAULT: u32 = 1000;

impl UnixAccounts {
    pub fn new(run_as: RunAs) -> UnixAccounts {
        UnixAccounts { run_as, map: BTreeMap::new(), min_uid: MIN_UID_DEFAULT }
    }

    /// UnixAccounts below `min_uid` are taken only when the user map names them.
    pub fn with_min_uid(mut self, min_uid: u32) -> UnixAccounts {
        self.min_uid = min_uid;
        self
    }

    /// Reads a user map: one `KAIROS_USER = UNIX_ACCOUNT` per line, `#` comments. Users it does
    /// not name run as the account of their own name.
    pub fn with_map_file(mut self, path: &Path) -> Result<UnixAccounts, AccountError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| AccountError::MapRead(path.display().to_string(), e))?;
        for (i, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let parsed = line
                .split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .filter(|(k, v)| !k.is_empty() && !v.is_empty() && !v.contains(char::is_whitespace));
            let Some((user, account)) = parsed else {
                return Err(AccountError::MapSyntax { path: path.display().to_string(), line: i + 1 });
            };
            self.map.insert(user.to_string(), account.to_string());
        }
        Ok(self)
    }

    /// The account a run of kairos user `user` executes as: `None` means the agent's own.
    pub fn resolve(&self, user: &str) -> Result<Option<UnixAccount>, String> {
        if self.run_as == RunAs::Agent {
            return Ok(None);
        }
        let mapped = self.map.get(user);
        let name = mapped.map(String::as_str).unwrap_or(user);
        let found = nix::unistd::User::from_name(name)
            .map_err(|e| format!("looking up Unix account \"{name}\": {e}"))?
            .ok_or_else(|| {
                format!("no Unix account \"{name}\" for kairos user \"{user}\" on this node (runs never fall back to root)")
            })?;
        if found.uid.is_root() || found.gid.as_raw() == 0 {
            return Err(format!(
                "kairos user \"{user}\" maps to Unix account \"{name}\" with uid or gid 0; runs never execute as root"
            ));
        }
        if mapped.is_none() && found.uid.as_raw() < self.min_uid {
            return Err(format!(
                "kairos user \"{user}\" names the system account \"{name}\" (uid {}, below --min-uid {}); runs take such an account only when --user-map names it",
                found.uid, self.min_uid
            ));
        }
        let cname = std::ffi::CString::new(name).map_err(|_| format!("bad account name \"{name}\""))?;
        let groups = nix::unistd::getgrouplist(&cname, found.gid)
            .map_err(|e| format!("groups of \"{name}\": {e}"))?
            .into_iter()
            .map(|g| g.as_raw())
            .filter(|g| *g != 0)
            .collect();
        Ok(Some(UnixAccount {
            name: name.to_string(),
            uid: found.uid.as_raw(),
            gid: found.gid.as_raw(),
            groups,
            home: found.dir,
            shell: found.shell,
        }))
    }
}

/// The base environment of a run: the allowlisted variables of `agent_env`, then who it runs as.
pub fn base_env(
    agent_env: impl Iterator<Item = (String, String)>,
    account: Option<&UnixAccount>,
) -> BTreeMap<String, String> {
    let agent_env: BTreeMap<String, String> = agent_env.collect();
    let mut env: BTreeMap<String, String> =
        ENV_ALLOWLIST.iter().filter_map(|k| agent_env.get(*k).map(|v| (k.to_string(), v.clone()))).collect();
    env.entry("PATH".into()).or_insert_with(|| DEFAULT_PATH.into());
    match account {
        Some(a) => {
            env.insert("HOME".into(), a.home.display().to_string());
            env.insert("USER".into(), a.name.clone());
            env.insert("LOGNAME".into(), a.name.clone());
            env.insert("SHELL".into(), a.shell.display().to_string());
        }
        None => {
            for k in ["HOME", "USER", "LOGNAME", "SHELL"] {
                if let Some(v) = agent_env.get(k) {
                    env.insert(k.into(), v.clone());
                }
            }
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowlisted_variables_pass() {
        let agent = [
            ("PATH", "/bin"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
            ("KAIROS_JOIN_TOKEN_FILE", "/j"),
            ("HOME", "/root"),
            ("TZ", "UTC"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let acct = UnixAccount {
            name: "alice".into(),
            uid: 1000,
            gid: 1000,
            groups: vec![],
            home: "/home/alice".into(),
            shell: "/bin/sh".into(),
        };
        let env = base_env(agent.clone(), Some(&acct));
        assert_eq!(env.get("PATH").map(String::as_str), Some("/bin"));
        assert_eq!(env.get("HOME").map(String::as_str), Some("/home/alice"));
        assert_eq!(env.get("USER").map(String::as_str), Some("alice"));
        assert!(!env.contains_key("AWS_SECRET_ACCESS_KEY") && !env.contains_key("KAIROS_JOIN_TOKEN_FILE"));
        let own = base_env(agent, None);
        assert_eq!(own.get("HOME").map(String::as_str), Some("/root"));
        assert!(!own.contains_key("AWS_SECRET_ACCESS_KEY"));
        assert_eq!(base_env(std::iter::empty(), None).get("PATH").map(String::as_str), Some(DEFAULT_PATH));
    }

    #[test]
    fn user_maps_parse_and_refuse_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("map");
        std::fs::write(&path, "# kairos = unix\nalice = root\n\nbob=nobody # comment\n").unwrap();
        let a = UnixAccounts::new(RunAs::Submitter).with_map_file(&path).unwrap();
        // Mapped to root: refused, never run as root.
        assert!(a.resolve("alice").unwrap_err().contains("never execute as root"));
        let e = a.resolve("no-such-user-kairos").unwrap_err();
        assert!(e.contains("no Unix account \"no-such-user-kairos\""), "{e}");
        // nobody exists on Debian; its uid is not 0.
        if let Ok(Some(nobody)) = a.resolve("bob") {
            assert_eq!(nobody.name, "nobody");
            assert_ne!(nobody.uid, 0);
        }
        assert_eq!(UnixAccounts::new(RunAs::Agent).resolve("anyone").unwrap(), None);
        // A kairos user named like a system account does not run as it by name alone.
        let e = UnixAccounts::new(RunAs::Submitter).resolve("sync").unwrap_err();
        assert!(e.contains("system account \"sync\"") && e.contains("--user-map"), "{e}");
        std::fs::write(&path, "syncer = sync\n").unwrap();
        let mapped = UnixAccounts::new(RunAs::Submitter).with_map_file(&path).unwrap();
        assert_eq!(mapped.resolve("syncer").unwrap().map(|a| a.name), Some("sync".to_string()));
        std::fs::write(&path, "alice\n").unwrap();
        let e = UnixAccounts::new(RunAs::Submitter).with_map_file(&path).unwrap_err();
        assert!(e.to_string().contains(":1:"), "{e}");
    }
}
