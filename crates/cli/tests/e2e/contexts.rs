//! The CLI's contexts when they go stale (issue 50, item 10): `kairos up` run from a directory
//! later removed leaves a current context whose token file is gone. Explicit addresses must not
//! borrow it, a command that does use it names it and the way out, and a real cluster's
//! commands work with such a HOME.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::harness::{free_addr, kairos_in, Cluster};

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

/// One line on stderr, exit 1.
fn one_line_failure(out: &Output) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "expected a failure: {err:?}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err:?}");
    err
}

/// A HOME whose contexts file holds `config`.
fn home_with(dir: &Path, config: &str) -> PathBuf {
    let home = dir.join("home");
    let kairos = home.join(".config/kairos");
    std::fs::create_dir_all(&kairos).unwrap();
    std::fs::write(kairos.join("config.toml"), config).unwrap();
    home
}

/// The stale context of the issue: current, its cluster gone and its token file with it.
fn stale_home(dir: &Path) -> (PathBuf, PathBuf) {
    let data = dir.join("removed/kairos-data");
    std::fs::create_dir_all(&data).unwrap();
    let token = data.join("admin.token");
    std::fs::write(&token, "kairos-admin.of-a-cluster-long-gone\n").unwrap();
    let config = format!(
        "current = \"local\"\n\n[contexts.local]\ncontrollers = [\"{}\"]\ntoken_file = \"{}\"\n",
        free_addr(),
        token.display()
    );
    let home = home_with(dir, &config);
    std::fs::remove_dir_all(dir.join("removed")).unwrap();
    (home, token)
}

#[test]
fn a_stale_current_context_does_not_stand_in_the_way_of_explicit_addresses_and_names_its_fix() {
    let dir = tempfile::tempdir().unwrap();
    let (home, token) = stale_home(dir.path());

    // Explicit addresses (flag or environment) take nothing from the current context: the
    // answer is about the controller, not the context's token file.
    let flag = kairos_in(&home).args(["--controllers", "127.0.0.1:1", "queue"]).output().unwrap();
    let env = kairos_in(&home).env("KAIROS_CONTROLLERS", "127.0.0.1:1").arg("queue").output().unwrap();
    for out in [flag, env] {
        let err = one_line_failure(&out);
        assert!(err.starts_with("kairos: cannot reach controller at 127.0.0.1:1"), "{err:?}");
        assert!(!err.contains("admin.token"), "{err:?}");
    }

    // A command that does use the stale context says which one, and how to be rid of it.
    let err = one_line_failure(&kairos_in(&home).arg("queue").output().unwrap());
    assert!(err.contains("context \"local\""), "{err:?}");
    assert!(err.contains(&token.display().to_string()), "{err:?}");
    assert!(err.contains("kairos context delete local"), "{err:?}");
    // Named explicitly, the same.
    let err = one_line_failure(&kairos_in(&home).args(["--context", "local", "nodes"]).output().unwrap());
    assert!(err.contains("kairos context delete local"), "{err:?}");

    // Commands that call no controller read no context: a KAIROS_CONTEXT that names none is
    // no matter to them.
    for args in [&["completions", "bash"][..], &["context", "list"][..]] {
        let out = kairos_in(&home).env("KAIROS_CONTEXT", "gone").args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }

    // The fix it names works, and leaves a HOME with no context.
    let out = kairos_in(&home).args(["context", "delete", "local"]).output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let list = kairos_in(&home).args(["context", "list", "--json"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&list.stdout).trim(), "[]");
}

#[test]
fn a_real_clusters_commands_work_beside_a_stale_context_and_borrow_no_unrelated_token() {
    let c = Cluster::start(2);
    let dir = tempfile::tempdir().unwrap();
    let (home, _) = stale_home(dir.path());

    // The cluster's addresses and its token file, by flags and by the environment.
    let kairos = |args: &[&str]| {
        kairos_in(&home)
            .args(["--controllers", &c.addrs(), "--token-file"])
            .arg(c.token_file())
            .args(args)
            .output()
            .unwrap()
    };
    let out = kairos(&["submit", "--", "sh", "-c", "echo fine"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let out = kairos(&["wait", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&kairos(&["logs", &id]).stdout), "fine\n");
    let by_env = kairos_in(&home)
        .env("KAIROS_CONTROLLERS", c.addrs())
        .env("KAIROS_TOKEN_FILE", c.token_file())
        .args(["show", &id, "--json"])
        .output()
        .unwrap();
    assert!(by_env.status.success(), "{}", stderr(&by_env));

    // A current context for another cluster holding this cluster's real admin token: other
    // addresses do not take it (the call goes without a token and is refused as such) …
    let other = format!(
        "current = \"prod\"\n\n[contexts.prod]\ncontrollers = [\"{}\", \"{}\"]\ntoken_file = \"{}\"\n",
        free_addr(),
        free_addr(),
        c.token_file().display()
    );
    let prod_home = home_with(&dir.path().join("prod"), &other);
    let out = kairos_in(&prod_home).args(["--controllers", &c.addrs(), "queue"]).output().unwrap();
    let err = one_line_failure(&out);
    assert!(err.contains("Unauthenticated"), "{err:?}");
    // … while a context whose addresses these are (all of them, or one of them) lends its token.
    let own = format!(
        "current = \"here\"\n\n[contexts.here]\ncontrollers = [\"{}\", \"{}\"]\ntoken_file = \"{}\"\n",
        c.addrs(),
        free_addr(),
        c.token_file().display()
    );
    let here_home = home_with(&dir.path().join("here"), &own);
    for args in [&["queue"][..], &["--controllers", &c.addrs(), "queue"][..]] {
        let out = kairos_in(&here_home).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
}

/// The Python client finds its cluster as the CLI does (`kairos_client.config`): given
/// addresses take no token or CA of a current context that is not theirs, and a context whose
/// token file is gone is named with the way out.
#[test]
fn the_python_client_resolves_a_stale_or_unrelated_context_as_the_cli_does() {
    let dir = tempfile::tempdir().unwrap();
    let (home, _) = stale_home(dir.path());
    let config =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/python/kairos_client/config.py");
    // config.py alone (the package's other modules need grpcio): loaded from its file.
    let probe = "import importlib.util, sys\n\
                 spec = importlib.util.spec_from_file_location('kairos_config', sys.argv[1])\n\
                 m = importlib.util.module_from_spec(spec); sys.modules['kairos_config'] = m\n\
                 spec.loader.exec_module(m)\n\
                 def run(**kw):\n\
                 \x20   try:\n\
                 \x20       s = m.resolve(**kw)\n\
                 \x20       print('ok', ','.join(s.addresses), s.token, s.ca)\n\
                 \x20   except ValueError as e:\n\
                 \x20       print('error', e)\n\
                 run(addresses='127.0.0.1:1', token='t')\n\
                 run()\n";
    let python = |home: &Path| {
        let mut cmd = std::process::Command::new(crate::harness::python());
        cmd.args(["-c", probe]).arg(&config).env("HOME", home);
        for var in crate::harness::CALLER_SETTINGS {
            cmd.env_remove(var);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let said = python(&home);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines[0], "ok 127.0.0.1:1 t None", "{said}");
    assert!(lines[1].starts_with("error context \"local\": its token file"), "{said}");
    assert!(lines[1].contains("kairos context delete local"), "{said}");

    // A current context with a CA for other addresses: the given ones go without it.
    let other = format!(
        "current = \"prod\"\n\n[contexts.prod]\ncontrollers = [\"10.0.0.1:7001\"]\ntoken_file = \"{0}\"\nca = \"{0}\"\n",
        dir.path().join("home/.config/kairos/config.toml").display()
    );
    let said = python(&home_with(&dir.path().join("prod"), &other));
    assert!(said.starts_with("ok 127.0.0.1:1 t None\n"), "{said}");
}
