//! Container jobs confined as their users, attacked as a user would (issue 49): a root agent
//! running jobs as their submitters (two real Unix users), images built here that carry a
//! setuid-root binary, and links out through where the host's root used to stay.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::containers::busybox_image_with;
use crate::harness::{alive, Cluster};
use crate::isolation::{submit_as, submitter_cluster_mapping, Users};

/// Where the old code left the host's root inside the container while it made mount points.
const OLD_ROOT: &str = "/.kairos-old-root";

/// A static program that asks for uid 0 (`setuid(0)`), says what it got, and runs its
/// arguments: mode 04755, owned by root, in the image.
fn setuid_root_binary(dir: &Path) -> std::path::PathBuf {
    let src = dir.join("su0.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <unistd.h>\nint main(int argc, char **argv) {\n\
         int r = setuid(0);\n printf(\"setuid0=%d euid=%d\\n\", r, (int)geteuid());\n fflush(stdout);\n\
         if (argc > 1) { execv(argv[1], argv + 1); perror(\"execv\"); return 127; }\n return 0;\n}\n",
    )
    .unwrap();
    let bin = dir.join("su0");
    let out = Command::new("gcc").args(["-static", "-O1", "-o"]).arg(&bin).arg(&src).output().expect("gcc");
    assert!(out.status.success(), "gcc: {}", String::from_utf8_lossy(&out.stderr));
    bin
}

fn logs(c: &Cluster, id: u64) -> String {
    c.ok(&["logs", &id.to_string()])
}

#[test]
fn a_setuid_root_binary_in_the_image_gives_the_job_nothing_and_it_sees_only_its_own_processes() {
    let users = Users::create(&["kq-alice".into()]);
    let (c, map) = submitter_cluster_mapping("alice = kq-alice\n");
    std::fs::set_permissions(map.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let su0 = setuid_root_binary(map.path());
    let image = busybox_image_with(map.path(), |rootfs| {
        let at = rootfs.join("bin/su0");
        std::fs::copy(&su0, &at).unwrap();
        std::os::unix::fs::chown(&at, Some(0), Some(0)).unwrap();
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o4755)).unwrap();
    });
    let uid = users.uid("kq-alice");
    // A host process of root's, and a host directory anyone may write: the job must reach
    // neither.
    let mut victim = Command::new("sleep").arg("300").spawn().unwrap();
    let host = tempfile::tempdir().unwrap();
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let pwned = host.path().join("pwned");
    let probe = format!(
        "echo uid=$(id -u); grep -E '^(NoNewPrivs|CapEff|CapBnd):' /proc/self/status; \
         kill -9 {victim} 2>/dev/null; echo kill-host=$?; kill -9 1; \
         nsenter -t 1 -m -p -- touch {pwned} 2>/dev/null; nsenter -t 1 -m -- mkdir {OLD_ROOT}-x 2>/dev/null; \
         for f in maps environ; do if cat /proc/1/$f >/dev/null 2>&1; then echo $f-readable; else echo $f-denied; fi; done; \
         echo ps:; ps -o pid,comm; echo end",
        victim = victim.id(),
        pwned = pwned.display(),
    );
    let id =
        submit_as(&c, "alice", &["--container-image", &image, "--", "/bin/su0", "/bin/sh", "-c", &probe]);
    let job = c.wait_done(id);
    let out = logs(&c, id);
    assert_eq!(job["state"], "COMPLETED", "{job}\n{out}");
    // setuid(0) fails; the job keeps its uid, no capabilities, no way to gain any.
    assert!(out.contains("setuid0=-1") && out.contains(&format!("uid={uid}")), "{out}");
    assert!(out.contains("NoNewPrivs:\t1"), "{out}");
    assert!(out.contains("CapEff:\t0000000000000000"), "{out}");
    assert!(out.contains("CapBnd:\t0000000000000000"), "{out}");
    // No host process can be signalled; nothing is written on the host.
    assert!(out.contains("kill-host=1"), "{out}");
    assert!(alive(victim.id()), "the job killed a host process of root's");
    let _ = victim.kill();
    let _ = victim.wait();
    assert!(!pwned.exists(), "the job wrote {} on the host", pwned.display());
    // `ps` inside lists its own processes only: its init, the shell, ps.
    let listed: Vec<&str> = out
        .split("ps:\n")
        .nth(1)
        .and_then(|s| s.split("end").next())
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert!((2..=4).contains(&listed.len()), "{listed:?}");
    for line in &listed {
        let pid: u32 = line.split_whitespace().next().and_then(|p| p.parse().ok()).unwrap_or(u32::MAX);
        assert!(pid < 16 && !line.contains("sleep") && !line.contains("kairosd"), "{listed:?}");
    }
    assert!(listed.iter().any(|l| l.contains("kairos-init")), "{listed:?}");
    // Its init is a copy of the agent: never readable by the job (the agent's memory holds the
    // join token), nor is the process outside by the same user on the host.
    assert!(out.contains("maps-denied") && out.contains("environ-denied"), "{out}");
    assert!(!out.contains("kairos-join"), "{out}");
    let sleeper = submit_as(&c, "alice", &["--container-image", &image, "--", "sleep", "60"]);
    c.wait_state(sleeper, "RUNNING");
    let agent = c.agent.as_ref().unwrap().id();
    let relay = crate::harness::wait_for("the run's process outside its namespaces", || {
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid: u32 = stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()?;
            let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(e.path()).ok()?);
            (ppid == agent && owner == uid).then_some(pid)
        })
    });
    for f in ["environ", "maps", "mem"] {
        let read = Command::new("runuser")
            .args(["-u", "kq-alice", "--", "cat", &format!("/proc/{relay}/{f}")])
            .output()
            .unwrap();
        assert!(!read.status.success(), "the job's user read /proc/{relay}/{f} of a copy of the agent");
    }
    c.ok(&["cancel", &sleeper.to_string()]);
    c.wait_done(sleeper);
}

#[test]
fn links_through_the_old_root_and_fifos_create_nothing_on_the_host_and_never_hold_the_node() {
    let users = Users::create(&["kq-carol".into(), "kq-dave".into()]);
    let (c, map) = submitter_cluster_mapping("carol = kq-carol\ndave = kq-dave\n");
    std::fs::set_permissions(map.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // A host directory anyone may write: even the user's own rights must not reach it.
    let host = tempfile::tempdir().unwrap();
    std::fs::set_permissions(host.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let old = |p: &Path| format!("{OLD_ROOT}{}", p.display());
    // carol's FIFO, where her image's links lead.
    let fifo = host.path().join("fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    std::os::unix::fs::chown(&fifo, Some(users.uid("kq-carol")), None).unwrap();
    let carol_dir = map.path().join("carol");
    std::fs::create_dir(&carol_dir).unwrap();
    let (hostside, fifo_inside) = (old(host.path()), old(&fifo));
    let evil = busybox_image_with(&carol_dir, |rootfs| {
        let link = |target: &str, at: &str| std::os::unix::fs::symlink(target, rootfs.join(at)).unwrap();
        std::fs::remove_file(rootfs.join("escape")).unwrap();
        link(&format!("{hostside}/hosts-made"), "etc/hosts");
        link(&format!("{hostside}/resolv-made"), "etc/resolv.conf");
        link(&hostside, "escape");
        link(&fifo_inside, "etc/trap");
    });
    // dave's own image, cached before and run again after carol's attempts.
    let dave_dir = map.path().join("dave");
    std::fs::create_dir(&dave_dir).unwrap();
    let dave_image = busybox_image_with(&dave_dir, |_| {});
    let dave_runs = || {
        let id = submit_as(&c, "dave", &["--container-image", &dave_image, "--", "cat", "/etc/kairos-image"]);
        let job = c.wait_done(id);
        assert_eq!(job["state"], "COMPLETED", "{job}");
        assert!(logs(&c, id).contains("kairos test image"));
    };
    dave_runs();

    // Its name files lead out through the old root: not followed, nothing made on the host; a
    // job mount whose destination climbs through where the old root stayed lands inside.
    let own = carol_dir.join("data");
    std::fs::create_dir(&own).unwrap();
    std::os::unix::fs::chown(&own, Some(users.uid("kq-carol")), None).unwrap();
    let through = format!("{}:{}/mount-made", own.display(), old(host.path()));
    let started = Instant::now();
    let id = submit_as(
        &c,
        "carol",
        &["--container-image", &evil, "--container-mounts", &through, "--", "sh", "-c", "echo ran; ls /etc"],
    );
    let job = c.wait_done(id);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert_eq!(job["state"], "COMPLETED", "{job}");
    assert!(logs(&c, id).contains("ran"));
    // Through a link in the image, as a mount point: refused with a reason, at once.
    let started = Instant::now();
    let trap = format!("{}:/etc/trap", own.display());
    let trapped =
        submit_as(&c, "carol", &["--container-image", &evil, "--container-mounts", &trap, "--", "true"]);
    let job = c.wait_done(trapped);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert_eq!(job["state"], "FAILED", "{job}");
    let reason = job["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("symbolic links") || reason.contains("Not a directory"), "{reason}");
    let escaped = format!("{}:/escape/sub", own.display());
    let linked =
        submit_as(&c, "carol", &["--container-image", &evil, "--container-mounts", &escaped, "--", "true"]);
    assert_eq!(c.wait_done(linked)["state"], "FAILED");

    let left: Vec<String> = std::fs::read_dir(host.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "fifo")
        .collect();
    assert!(left.is_empty(), "made on the host through the container: {left:?}");
    let nodes = c.ok(&["nodes"]);
    assert!(nodes.contains("UP"), "{nodes}");
    dave_runs();
}
