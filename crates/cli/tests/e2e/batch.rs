//! sbatch scripts: an unmodified array script runs every task with its index, never more than
//! `%N` at once, writing to its `--output` pattern; unsupported directives are refused whole.

use crate::harness::{wait_for, Cluster};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn an_array_script_runs_every_task_with_its_index_never_more_than_n_at_once() {
    let c = Cluster::start(8);
    let out_dir = c.path("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let d = out_dir.display();
    let script = c.path("array.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n\
             #SBATCH --job-name=arr\n\
             #SBATCH --array=0-7%2\n\
             #SBATCH --gres=gpu:1\n\
             #SBATCH --time=0-00:05:00\n\
             #SBATCH --output={d}/arr_%A_%a.out\n\
             \n\
             echo \"task $SLURM_ARRAY_TASK_ID kairos $KAIROS_ARRAY_TASK_ID of $SLURM_ARRAY_JOB_ID arg $1\"\n\
             echo \"$(date +%s%N) $(date +%s%N)\" > {d}/start_$SLURM_ARRAY_TASK_ID\n\
             sleep 1\n\
             date +%s%N > {d}/end_$SLURM_ARRAY_TASK_ID\n"
        ),
    )
    .unwrap();
    let array: u64 = c.ok(&["batch", script.to_str().unwrap(), "hello"]).trim().parse().unwrap();
    // While tasks wait, the queue folds them onto one line like squeue.
    let queue = c.ok(&["queue"]);
    assert!(queue.lines().any(|l| l.starts_with(&format!("{array}_[")) && l.contains("%2]")), "{queue}");
    let tasks: Vec<u64> = (array..array + 8).collect();
    for t in &tasks {
        let job = c.wait_done(*t);
        assert_eq!(job["state"], "COMPLETED", "{job}");
        assert_eq!(job["array_job_id"], array);
    }
    // `kairos logs` of a task says where its output went instead of printing nothing.
    let out = c.kairos(&["logs", &array.to_string()]);
    assert!(out.status.success() && out.stdout.is_empty());
    assert!(
        stderr(&out).contains("sends its output to its -o/-e files") && stderr(&out).contains("arr_"),
        "{}",
        stderr(&out)
    );
    // Each task saw its index in both variables and wrote to its own output file.
    for i in 0..8 {
        let path = out_dir.join(format!("arr_{array}_{i}.out"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(text, format!("task {i} kairos {i} of {array} arg hello\n"));
    }
    // Never more than two at once, by the tasks' own clocks.
    let read = |name: String| -> u128 {
        std::fs::read_to_string(out_dir.join(name))
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let spans: Vec<(u128, u128)> =
        (0..8).map(|i| (read(format!("start_{i}")), read(format!("end_{i}")))).collect();
    let peak =
        spans.iter().map(|(s, _)| spans.iter().filter(|(a, b)| a <= s && s < b).count()).max().unwrap();
    assert!((1..=2).contains(&peak), "{peak} tasks ran at once: {spans:?}");
}

#[test]
fn an_unsupported_directive_is_refused_naming_it_and_tasks_cancel_alone_or_together() {
    let c = Cluster::start(2);
    let before = c.jobs().len();
    let script = c.path("licensed.sh");
    std::fs::write(&script, "#!/bin/sh\n#SBATCH --gres=gpu:1\n#SBATCH --licenses=matlab:1\ntrue\n").unwrap();
    let out = c.kairos(&["batch", script.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("unsupported option --licenses") && err.lines().count() == 1, "{err}");
    assert_eq!(c.jobs().len(), before, "nothing was submitted");
    // A held array from the command line: ID_N cancels one task, ID the rest.
    let plain = c.path("plain.sh");
    std::fs::write(&plain, "#!/bin/sh\ntrue\n").unwrap();
    let array: u64 =
        c.ok(&["batch", "--hold", "--array", "0-3", plain.to_str().unwrap()]).trim().parse().unwrap();
    c.ok(&["cancel", &format!("{array}_2")]);
    let state = |id: u64| c.job(id)["state"].as_str().unwrap().to_string();
    assert_eq!((state(array + 2).as_str(), state(array).as_str()), ("CANCELLED", "PENDING"));
    c.ok(&["cancel", &array.to_string()]);
    wait_for("every task cancelled", || (0..4).all(|i| state(array + i) == "CANCELLED").then_some(()));
    let out = c.kairos(&["cancel", &format!("{array}_9")]);
    assert!(stderr(&out).contains(&format!("array {array} has no task 9")), "{}", stderr(&out));
}

#[test]
fn submit_takes_sbatch_s_short_flags_and_its_output_files() {
    let c = Cluster::start(2);
    let dir = c.path("outputs");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display().to_string();
    let out = c.ok(&[
        "submit",
        "-J",
        "shorts",
        "-G",
        "1",
        "-t",
        "5m",
        "-q",
        "batch",
        "-D",
        &d,
        "-o",
        "out-%j-%x.txt",
        "-e",
        "err-%j.txt",
        "--",
        "sh",
        "-c",
        "echo to stdout; echo to stderr >&2",
    ]);
    let id: u64 = out.trim().parse().unwrap();
    let job = c.wait_done(id);
    assert_eq!(job["state"], "COMPLETED", "{job}");
    assert_eq!(job["name"], "shorts", "{job}");
    let read =
        |name: String| std::fs::read_to_string(dir.join(&name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(read(format!("out-{id}-shorts.txt")), "to stdout\n");
    assert_eq!(read(format!("err-{id}.txt")), "to stderr\n");
    // -o alone takes stderr too.
    let id: u64 = c
        .ok(&["submit", "-D", &d, "-o", "both-%j.txt", "--", "sh", "-c", "echo a; echo b >&2"])
        .trim()
        .parse()
        .unwrap();
    c.wait_done(id);
    assert_eq!(read(format!("both-{id}.txt")), "a\nb\n");
    // `kairos logs` says where the output went.
    let logs = c.kairos(&["logs", &id.to_string()]);
    assert!(
        stderr(&logs).contains("sends its output to its -o/-e files (>>\"both-${SLURM_JOB_ID}.txt\""),
        "{}",
        stderr(&logs)
    );
}
