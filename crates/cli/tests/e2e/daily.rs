//! Daily use as a Slurm user expects it (issue 50): the repository's examples run as their
//! headers say (the submit directory and environment, sbatch's defaults), scancel's forms,
//! `batch --wrap`.

use std::path::Path;
use std::process::Command;

use crate::harness::{bin, Cluster};

/// The commands an example's header shows (`#   … kairos …` lines).
fn header_commands(text: &str) -> Vec<String> {
    text.lines()
        .take_while(|l| l.starts_with('#'))
        .filter_map(|l| l.strip_prefix("#   "))
        .filter(|l| l.contains("kairos "))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_example_runs_as_its_header_says_in_the_submit_directory_with_its_environment() {
    let c = Cluster::start(4);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // A copy of the repository's examples, where a user would run them from.
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir(work.path().join("examples")).unwrap();
    let mut ran = 0;
    for e in std::fs::read_dir(repo.join("examples")).unwrap().flatten() {
        std::fs::copy(e.path(), work.path().join("examples").join(e.file_name())).unwrap();
    }
    for e in std::fs::read_dir(work.path().join("examples")).unwrap().flatten() {
        let text = std::fs::read_to_string(e.path()).unwrap();
        for command in header_commands(&text) {
            let kairos_dir = bin("kairos").parent().unwrap().to_path_buf();
            let path = format!("{}:{}", kairos_dir.display(), std::env::var("PATH").unwrap_or_default());
            let out = Command::new("sh")
                .args(["-c", &command])
                .current_dir(work.path())
                .env("PATH", path)
                .env("KAIROS_CONTROLLERS", c.addrs())
                .env("KAIROS_TOKEN_FILE", c.token_file())
                .env("HOME", work.path())
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{command}: {said}{}", String::from_utf8_lossy(&out.stderr));
            let id: u64 = said.trim().parse().unwrap_or_else(|_| panic!("{command}: printed {said}"));
            let job = c.wait_done(id);
            assert_eq!(job["state"], "COMPLETED", "{command}: {job}");
            ran += 1;
        }
    }
    assert!(ran >= 1, "no example header has a kairos command");
    // train.sh's header: STEPS=50 … OUT=steps.log, written in the submit directory.
    let steps =
        std::fs::read_to_string(work.path().join("steps.log")).expect("steps.log in the submit directory");
    assert_eq!(steps.lines().count(), 50, "{steps}");

    // scancel's forms: several ids at once, and every job of a user.
    let ids: Vec<String> = (0..3).map(|_| c.submit(&["--hold", "--", "true"]).to_string()).collect();
    let out =
        c.kairos(&[&["cancel"], ids.iter().map(String::as_str).collect::<Vec<_>>().as_slice()].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for id in &ids {
        assert_eq!(c.job(id.parse().unwrap())["state"], "CANCELLED");
    }
    let mine: Vec<u64> = (0..2).map(|_| c.submit(&["--hold", "--", "true"])).collect();
    let user = c.job(mine[0])["user"].as_str().unwrap().to_string();
    c.ok(&["cancel", "-u", &user, "--state", "PENDING"]);
    for id in &mine {
        assert_eq!(c.job(*id)["state"], "CANCELLED");
    }
    assert!(!c.kairos(&["cancel"]).status.success(), "cancel with nothing named must refuse");

    // batch --wrap: the command is the script.
    let wrapped: u64 = c.ok(&["batch", "--wrap", "echo wrapped $SLURM_JOB_ID"]).trim().parse().unwrap();
    assert_eq!(c.wait_done(wrapped)["state"], "COMPLETED");
    assert_eq!(c.ok(&["logs", &wrapped.to_string()]).trim(), format!("wrapped {wrapped}"));
}

#[test]
fn a_manifests_backoff_limit_retries_failed_pods_and_an_indexed_job_sees_its_index() {
    let c = Cluster::start(2);
    let dir = tempfile::tempdir().unwrap();
    let image = crate::containers::busybox_image_with(dir.path(), |_| {});
    // Each pod fails its first run and passes its second: backoffLimit 1 retries it once.
    let manifest = format!(
        "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: indexed\nspec:\n  completions: 2\n  \
         completionMode: Indexed\n  backoffLimit: 1\n  template:\n    spec:\n      restartPolicy: Never\n      \
         containers:\n      - name: main\n        image: \"{image}\"\n        command: [sh, -c, \
         \"echo index=$JOB_COMPLETION_INDEX run=$KAIROS_RESTART_COUNT; [ $KAIROS_RESTART_COUNT -ge 1 ] || exit 3\"]\n"
    );
    let file = dir.path().join("job.yaml");
    std::fs::write(&file, &manifest).unwrap();
    let arr: u64 = c.ok(&["submit", "-f", &file.display().to_string()]).trim().parse().unwrap();
    for (task, index) in [(arr, 0), (arr + 1, 1)] {
        let job = c.wait_done(task);
        assert_eq!((job["state"].as_str(), job["attempt"].as_u64()), (Some("COMPLETED"), Some(1)), "{job}");
        let events = job["events"].to_string();
        assert!(events.contains("exit code 3; retry 1 of 1"), "{events}");
        let log = c.ok(&["logs", &task.to_string()]);
        assert_eq!(log.trim(), format!("index={index} run=1"), "{log}");
        let first = c.ok(&["logs", &task.to_string(), "--attempt", "0"]);
        assert_eq!(first.trim(), format!("index={index} run=0"), "{first}");
    }
    // A field kairos does not honour is refused by name; nothing is submitted.
    let before = c.jobs().len();
    let odd = manifest.replace("  backoffLimit: 1\n", "  backoffLimit: 1\n  podFailurePolicy: {}\n");
    std::fs::write(&file, odd).unwrap();
    let out = c.kairos(&["submit", "-f", &file.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("Job.spec.podFailurePolicy"), "{err}");
    assert_eq!(c.jobs().len(), before);
}
