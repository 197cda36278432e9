//! Jobs in containers (`--container-image`), end to end: a test image built here from Debian
//! packages (busybox-static into an OCI layout with umoci; scripts/test.sh installs both), real
//! mount namespaces and overlays, real Unix users, real cgroups.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{wait_for, Cluster, Options};
use crate::isolation::{submit_as, submitter_cluster_mapping, Users};

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (scripts/test.sh installs umoci and busybox-static)"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// An OCI image layout under `dir` tagged `test`: busybox (static, every applet linked) and a
/// marker file, /etc/kairos-image. Its reference, `oci:DIR/layout:test`.
fn busybox_image(dir: &Path) -> String {
    busybox_image_with(dir, |_| {})
}

/// `busybox_image` with `extra` applied to its root file system before it is packed (as root:
/// owners and modes are kept in the layer).
pub(crate) fn busybox_image_with(dir: &Path, extra: impl FnOnce(&Path)) -> String {
    let layout = dir.join("layout");
    let bundle = dir.join("bundle");
    run(Command::new("umoci").args(["init", "--layout"]).arg(&layout));
    run(Command::new("umoci").args(["new", "--image"]).arg(format!("{}:test", layout.display())));
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:test", layout.display()))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    for d in ["bin", "etc", "tmp"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    std::fs::set_permissions(rootfs.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("/bin/busybox (busybox-static)");
    // Every applet a relative link to it (`--install` would link to this host's path).
    let list = Command::new("/bin/busybox").arg("--list").output().unwrap();
    for applet in String::from_utf8_lossy(&list.stdout).lines().filter(|a| *a != "busybox") {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    std::fs::write(rootfs.join("etc/kairos-image"), "kairos test image\n").unwrap();
    // A link out of the image onto a host directory: mounts made through it must stay inside.
    std::fs::create_dir_all(dir.join("hostside")).unwrap();
    std::os::unix::fs::symlink(dir.join("hostside"), rootfs.join("escape")).unwrap();
    extra(&rootfs);
    run(Command::new("umoci")
        .args(["repack", "--image"])
        .arg(format!("{}:test", layout.display()))
        .arg(&bundle));
    // Readable by anyone who can reach `dir` (a job's image is read as its user).
    run(Command::new("chmod").args(["-R", "a+rX"]).arg(&layout));
    format!("oci:{}:test", layout.display())
}

/// Pids of processes whose environment has KAIROS_JOB_ID=`job` and whose owner is `uid`.
fn job_processes(job: u64, uid: u32) -> Vec<u32> {
    let want = format!("KAIROS_JOB_ID={job}");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            (std::fs::metadata(e.path()).ok()?.uid() == uid).then_some(())?;
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            env.split(|b| *b == 0).any(|v| v == want.as_bytes()).then_some(pid)
        })
        .collect()
}

#[test]
fn a_container_job_runs_in_its_image_as_its_submitter_and_is_preempted_resumed_and_cancelled() {
    let users = Users::create(&["kc-alice".into(), "kc-bob".into()]);
    // The admin's urgent job runs as kc-bob.
    let (c, map) = submitter_cluster_mapping("alice = kc-alice\nadmin = kc-bob\n");
    std::fs::set_permissions(map.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let image = busybox_image(map.path());
    let uid = users.uid("kc-alice");

    // Its root is the image's (no host python), its user the submitter, its GPUs and Slurm
    // environment a bare run's.
    let probe =
        "cat /etc/kairos-image; echo uid=$(id -u); echo gpus=$CUDA_VISIBLE_DEVICES slurm=$SLURM_JOB_ID; \
                 if [ -e /usr/bin/python3 ]; then echo host-python; else echo no-host-python; fi; pwd";
    let id = submit_as(&c, "alice", &["--gpus", "1", "--container-image", &image, "--", "sh", "-c", probe]);
    let job = c.wait_done(id);
    assert_eq!(job["state"], "COMPLETED", "{job}");
    let out = c.ok(&["logs", &id.to_string()]);
    assert!(out.contains("kairos test image") && out.contains("no-host-python"), "{out}");
    assert!(out.contains(&format!("uid={uid}")), "{out}");
    assert!(out.contains(&format!("gpus={} slurm={id}", job["gpu_ids"][0])), "{out}");
    assert!(
        Path::new("/usr/bin/python3").exists(),
        "the host has python3, so its absence shows the image's root"
    );
    assert_eq!(job["image"], Value::from(image.clone()));
    assert!(job["image_digest"].as_str().is_some_and(|d| d.starts_with("sha256:")), "{job}");

    // A host directory the submitter cannot reach (inside a root-only one) is not bound for
    // them: the root agent mounts only what the job's user could open.
    let vault = tempfile::tempdir().unwrap();
    std::fs::set_permissions(vault.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let secret = vault.path().join("secret");
    std::fs::create_dir(&secret).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(secret.join("key"), "root-only-secret").unwrap();
    std::fs::set_permissions(secret.join("key"), std::fs::Permissions::from_mode(0o644)).unwrap();
    let stolen = format!("{}:/stolen", secret.display());
    let thief = submit_as(
        &c,
        "alice",
        &["--container-image", &image, "--container-mounts", &stolen, "--", "cat", "/stolen/key"],
    );
    let job = c.wait_done(thief);
    let out = c.ok(&["logs", &thief.to_string()]);
    assert!(!out.contains("root-only-secret"), "the job read a file its user cannot reach: {out}");
    assert_eq!(job["state"], "FAILED", "{job}");
    assert!(job["reason"].as_str().unwrap_or_default().contains("Permission denied"), "{job}");
    // Nor is an image the submitter cannot read taken for them.
    let hidden = busybox_image(vault.path());
    let peek = submit_as(&c, "alice", &["--container-image", &hidden, "--", "cat", "/etc/kairos-image"]);
    let job = c.wait_done(peek);
    assert_eq!(job["state"], "FAILED", "{job}");
    assert!(job["reason"].as_str().unwrap_or_default().contains("image pull failed"), "{job}");

    // Preempted under REQUEUE, it resumes from its checkpoint (in the job's directory, bound
    // into the container) and writes every step exactly once to a mounted host directory.
    let ckpt = map.path().join("ckpt");
    std::fs::create_dir(&ckpt).unwrap();
    std::os::unix::fs::chown(&ckpt, Some(uid), None).unwrap();
    let examples = std::fs::canonicalize(format!("{}/../../examples", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let mounts = format!("{}:/ckpt,{}:/examples:ro", ckpt.display(), examples.display());
    let train = submit_as(
        &c,
        "alice",
        &[
            "--gpus",
            "2",
            "--qos",
            "training",
            "--container-image",
            &image,
            "--container-mounts",
            &mounts,
            "--env",
            "STEPS=40",
            "--env",
            "CHECKPOINT_EVERY=5",
            "--env",
            "OUT=/ckpt/steps",
            "--",
            "sh",
            "/examples/train.sh",
        ],
    );
    c.wait_state(train, "RUNNING");
    wait_for("training progress", || {
        (std::fs::read_to_string(ckpt.join("steps")).unwrap_or_default().lines().count() >= 8).then_some(())
    });
    let urgent = c.submit(&["--qos", "urgent", "--gpus", "2", "--", "true"]);
    assert_eq!(c.wait_done(urgent)["state"], "COMPLETED");
    let t = c.wait_done(train);
    assert_eq!((t["state"].as_str(), t["attempt"].as_u64()), (Some("COMPLETED"), Some(1)), "{t}");
    let steps: Vec<u32> = std::fs::read_to_string(ckpt.join("steps"))
        .unwrap()
        .lines()
        .map(|l| l.trim_start_matches("step ").parse().unwrap())
        .collect();
    assert_eq!(steps, (1..=40).collect::<Vec<u32>>(), "steps lost or repeated across the preemption");
    let log = c.ok(&["logs", &train.to_string()]);
    assert!(
        log.starts_with("attempt 1 resumes at step ") && !log.starts_with("attempt 1 resumes at step 0"),
        "{log}"
    );

    // Cancel leaves no process of it alive.
    let sleeper =
        submit_as(&c, "alice", &["--container-image", &image, "--", "sh", "-c", "sleep 600 & sleep 600"]);
    c.wait_state(sleeper, "RUNNING");
    wait_for("the container's processes", || (job_processes(sleeper, uid).len() >= 2).then_some(()));
    c.ok(&["cancel", &sleeper.to_string()]);
    assert_eq!(c.wait_done(sleeper)["state"], "CANCELLED");
    let left = job_processes(sleeper, uid);
    assert!(left.is_empty(), "processes of the cancelled container job still alive: {left:?}");
}

#[test]
fn a_container_gets_only_its_gpus_from_the_cdi_spec_ends_out_of_memory_over_its_limit_and_a_missing_image_fails_fast(
) {
    // A CDI spec as nvidia-ctk writes one, for two GPUs (this node has one), their device nodes
    // stood in for by files.
    let dir = tempfile::tempdir().unwrap();
    let cdi = dir.path().join("cdi");
    std::fs::create_dir(&cdi).unwrap();
    for (f, text) in [("nvidia0", "gpu0"), ("nvidia1", "gpu1"), ("libcuda.so.1", "fake driver")] {
        std::fs::write(dir.path().join(f), text).unwrap();
    }
    let spec = format!(
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    \
         - path: /dev/nvidia0\n      hostPath: {d}/nvidia0\n- name: \"1\"\n  containerEdits:\n    deviceNodes:\n    \
         - path: /dev/nvidia1\n      hostPath: {d}/nvidia1\ncontainerEdits:\n  env: [KAIROS_CDI=yes]\n  mounts:\n  \
         - hostPath: {d}/libcuda.so.1\n    containerPath: /usr/lib/libcuda.so.1\n    options: [ro, bind]\n",
        d = dir.path().display()
    );
    std::fs::write(cdi.join("nvidia.yaml"), spec).unwrap();
    let flags = ["--cpus", "2", "--memory", "2G", "--cdi-spec-dirs"].iter().map(|s| s.to_string());
    let flags = flags.chain([cdi.display().to_string()]).collect();
    let c = Cluster::start_opts(1, 1, Options { agent_flags: flags, ..Options::default() });
    let image = busybox_image(dir.path());

    // Only the run's GPU, and what the spec adds for every GPU, are in its container.
    let gpu = c.submit(&[
        "--container-image",
        &image,
        "--",
        "sh",
        "-c",
        "ls /dev; cat /dev/nvidia0 /usr/lib/libcuda.so.1; echo; echo cdi=$KAIROS_CDI",
    ]);
    assert_eq!(c.wait_done(gpu)["state"], "COMPLETED");
    let out = c.ok(&["logs", &gpu.to_string()]);
    assert!(out.contains("gpu0") && out.contains("fake driver") && out.contains("cdi=yes"), "{out}");
    assert!(out.contains("nvidia0") && !out.contains("nvidia1"), "{out}");
    // dd's 256 MiB buffer under a 128 MiB limit.
    let hog = c.submit(&[
        "--gpus",
        "0",
        "-c",
        "1",
        "--mem",
        "128M",
        "--container-image",
        &image,
        "--",
        "dd",
        "if=/dev/zero",
        "of=/dev/null",
        "bs=256M",
        "count=1",
    ]);
    let job = c.wait_done(hog);
    assert_eq!(job["state"], "OUT_OF_MEMORY", "{job}");

    // A mount through the image's link to a host directory resolves inside the container:
    // nothing is made on the host.
    let through = format!("{}:/escape/inside/x", dir.path().display());
    let linked = c.submit(&[
        "--container-image",
        &image,
        "--container-mounts",
        &through,
        "--",
        "ls",
        "/escape/inside/x",
    ]);
    let done = c.wait_done(linked);
    let onto_host = dir.path().join("hostside/inside");
    assert!(!onto_host.exists(), "{} was made on the host through the image's link", onto_host.display());
    // No mount point is made through a link: the launch fails, saying so.
    assert_eq!(done["state"], "FAILED", "{done}");
    assert!(done["reason"].as_str().unwrap_or_default().contains("Not a directory"), "{done}");

    let started = Instant::now();
    let missing = c.submit(&["--container-image", "oci:/nonexistent/image:v1", "--", "true"]);
    let job = c.wait_done(missing);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert_eq!(job["state"], "FAILED", "{job}");
    let reason = job["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("image pull failed: oci:/nonexistent/image:v1"), "{reason}");

    // Refused at submit, naming what is wrong, and nothing submitted.
    for (args, says) in [
        (vec!["--container-image", "oci:relative", "--", "true"], "absolute path"),
        (
            vec!["--container-image", &image, "--container-mounts", "/a:/proc/x", "--", "true"],
            "container's own",
        ),
        (vec!["--container-mounts", "/a:/b", "--", "true"], "--container-image"),
    ] {
        let out = c.kairos(&[&["submit"], args.as_slice()].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{args:?}: {err}");
    }
    let all: Value = serde_json::from_str(&c.ok(&["queue", "--all", "--json"])).unwrap();
    assert_eq!(all.as_array().map(Vec::len), Some(4), "{all}");
}

/// A Job manifest: `gpus` GPUs of the image, with a priority class.
fn job_manifest(image: &str, class: &str, gpus: u32) -> String {
    format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: infer\nspec:\n  template:\n    spec:\n      \
         priorityClassName: {class}\n      restartPolicy: Never\n      containers:\n      - name: main\n        \
         image: \"{image}\"\n        command: [sh, -c, \"cat /etc/kairos-image\"]\n        resources:\n          \
         limits:\n            nvidia.com/gpu: {gpus}\n"
    )
}

/// A Kueue pod group of two pods, each with 2 GPUs.
fn pod_group(image: &str) -> String {
    let pod = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    kueue.x-k8s.io/pod-group-name: ddp\n  \
             annotations:\n    kueue.x-k8s.io/pod-group-total-count: \"2\"\nspec:\n  containers:\n  - name: c\n    \
             image: \"{image}\"\n    command: [sh, -c, \"echo rank=$RANK of $WORLD_SIZE\"]\n    resources:\n      limits:\n        \
             nvidia.com/gpu: 2\n"
        )
    };
    format!("{}---\n{}", pod("ddp-0"), pod("ddp-1"))
}

#[test]
fn kubernetes_manifests_run_in_their_qos_and_image_and_a_pod_group_starts_whole_or_not_at_all() {
    let mut c = Cluster::start(2);
    c.add_agent("node-b", 2);
    let dir = tempfile::tempdir().unwrap();
    let image = busybox_image(dir.path());
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    // The policy maps the Kubernetes class to a QoS.
    let mut policy = c.ok(&["policy", "export"]);
    policy.push_str("\n[priority_classes]\nhigh-priority = \"urgent\"\n");
    c.ok(&["policy", "apply", "--yes", &file("policy.toml", &policy)]);

    // Refused naming every unsupported field; nothing submitted.
    let bad = job_manifest(&image, "high-priority", 1).replace(
        "      restartPolicy: Never\n",
        "      hostNetwork: true\n      volumes:\n      - name: data\n",
    );
    let out = c.kairos(&["submit", "-f", &file("bad.yaml", &bad)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("spec.hostNetwork") && err.contains("spec.volumes"),
        "{err}"
    );
    assert!(c.jobs().is_empty(), "a refused manifest submitted something");

    // Training fills every GPU; the manifest's high-priority job preempts one and runs as urgent
    // from its image.
    let trainings: Vec<u64> = (0..2)
        .map(|_| c.submit(&["--qos", "training", "--gpus", "2", "--requeue", "--", "sleep", "600"]))
        .collect();
    for t in &trainings {
        c.wait_state(*t, "RUNNING");
    }
    let infer: u64 = c
        .ok(&["submit", "-f", &file("job.yaml", &job_manifest(&image, "high-priority", 2))])
        .trim()
        .parse()
        .unwrap();
    let job = c.wait_done(infer);
    assert_eq!((job["state"].as_str(), job["qos"].as_str()), (Some("COMPLETED"), Some("urgent")), "{job}");
    assert!(c.ok(&["logs", &infer.to_string()]).contains("kairos test image"));
    let pre: Value = serde_json::from_str(&c.ok(&["preemptions", "--json"])).unwrap();
    assert!(pre.as_array().unwrap().iter().any(|p| p["preemptor"] == infer), "{pre}");

    // The pod group is one gang: while a node is taken neither pod starts; then both do.
    for t in &trainings {
        c.ok(&["cancel", &t.to_string()]);
        c.wait_done(*t);
    }
    let blocker = c.submit(&["--gpus", "2", "--", "sleep", "600"]);
    c.wait_state(blocker, "RUNNING");
    let gang: u64 = c.ok(&["submit", "-f", &file("group.yaml", &pod_group(&image))]).trim().parse().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let waiting = c.job(gang);
    assert_eq!(waiting["state"], "PENDING", "{waiting}");
    assert!(waiting["tasks"].as_array().is_none_or(|t| t.is_empty()), "{waiting}");
    c.ok(&["cancel", &blocker.to_string()]);
    let done = c.wait_done(gang);
    assert_eq!(done["state"], "COMPLETED", "{done}");
    let nodes: std::collections::BTreeSet<&str> =
        done["tasks"].as_array().unwrap().iter().filter_map(|t| t["node"].as_str()).collect();
    assert_eq!(nodes.len(), 2, "both pods ran, each on a node of its own: {done}");
}
