//! Tests of the launch step: assignment → run spec.

use super::*;
use crate::gpu::{FakeInventory, FakeMig, GpuInventory};

fn assignment(argv: &[&str]) -> pb::Assignment {
    pb::Assignment {
        job_id: 7,
        attempt: 2,
        argv: argv.iter().map(|s| s.to_string()).collect(),
        gpu_ids: vec![1, 0],
        rank: 1,
        world_size: 4,
        master_port: 29500,
        kill_signal: "SIGTERM".into(),
        checkpoint_signal: "SIGUSR1".into(),
        user: "alice".into(),
        submit_time_ms: 1234,
        ..Default::default()
    }
}

fn whole_gpus() -> DeviceMap {
    DeviceMap::of(&FakeInventory::parse("n", "2", "H100", 80 * 1024).unwrap().discover().unwrap())
}

fn node<'a>(devices: &'a DeviceMap, cores: &'a [u32]) -> Node<'a> {
    Node { name: "n1", state_dir: Path::new("/var/lib/kairos"), devices, cores, pids_max: Some(512) }
}

fn var<'a>(spec: &'a RunSpec, key: &str) -> Option<&'a str> {
    spec.env.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

#[test]
fn an_assignment_becomes_its_command_environment_and_files() {
    let devices = whole_gpus();
    let mut a = assignment(&["python", "train.py", "--lr", "3"]);
    a.env.insert("FOO".into(), "bar".into());
    // The job cannot set what kairos sets.
    a.env.insert("KAIROS_JOB_ID".into(), "99".into());
    let spec = spec(&a, &node(&devices, &[0, 1]), &[]).unwrap();
    assert_eq!(spec.key, (7, 2));
    assert_eq!((spec.program.as_str(), spec.args.join(" ").as_str()), ("python", "train.py --lr 3"));
    assert_eq!(spec.user, "alice");
    assert_eq!(spec.files.job_dir(), Path::new("/var/lib/kairos/jobs/7-1234"));
    assert_eq!(spec.files.log_name, "attempt-2.log");
    assert_eq!(
        spec.files.checkpoint_marker(),
        Path::new("/var/lib/kairos/jobs/7-1234/checkpoint/.kairos-checkpoint")
    );
    assert_eq!(spec.checkpoint_signal, Signal::SIGUSR1);
    for (k, v) in [
        ("FOO", "bar"),
        ("KAIROS_JOB_ID", "7"),
        ("KAIROS_RESTART_COUNT", "2"),
        ("KAIROS_NODE", "n1"),
        ("KAIROS_CHECKPOINT_DIR", "/var/lib/kairos/jobs/7-1234/checkpoint"),
        ("CUDA_VISIBLE_DEVICES", "1,0"),
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
        ("KAIROS_GPUS", "2"),
        ("KAIROS_CHECKPOINT_SIGNAL", "SIGUSR1"),
        ("RANK", "1"),
        ("WORLD_SIZE", "4"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("KAIROS_CPUS", "0"),
    ] {
        assert_eq!(var(&spec, k), Some(v), "{k}");
    }
    // Nothing of a fraction, nor of cores or memory it did not ask for.
    for k in [
        "KAIROS_GPU_FRACTION",
        "SLURM_CPUS_PER_TASK",
        "SLURM_MEM_PER_NODE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    ] {
        assert_eq!(var(&spec, k), None, "{k}");
    }
    assert!(spec.container.is_none());
}

#[test]
fn the_working_directory_defaults_to_the_jobs_and_a_submit_directory_falls_back_to_it() {
    let devices = whole_gpus();
    let n = node(&devices, &[0]);
    let mut a = assignment(&["true"]);
    let bare = spec(&a, &n, &[]).unwrap();
    assert_eq!(
        (bare.workdir.as_path(), bare.fallback_workdir.as_deref()),
        (Path::new("/var/lib/kairos/jobs/7-1234"), None)
    );
    a.workdir = "/home/alice/exp".into();
    let given = spec(&a, &n, &[]).unwrap();
    assert_eq!(
        (given.workdir.as_path(), given.fallback_workdir.as_deref()),
        (Path::new("/home/alice/exp"), None)
    );
    a.workdir_is_submit_dir = true;
    let submit = spec(&a, &n, &[]).unwrap();
    assert_eq!(submit.fallback_workdir.as_deref(), Some(Path::new("/var/lib/kairos/jobs/7-1234")));
}

#[test]
fn limits_take_unshared_cores_the_memory_the_pids_and_only_the_runs_gpu_devices() {
    let devices = whole_gpus();
    let mut a = assignment(&["true"]);
    a.cpus = 2;
    a.memory_mib = 1024;
    a.gpu_ids = vec![1];
    let spec = spec(&a, &node(&devices, &[0, 1, 2, 3]), &[vec![0, 1]]).unwrap();
    assert_eq!(
        spec.limits,
        RunLimits { cores: vec![2, 3], memory_bytes: Some(1 << 30), pids_max: Some(512), gpus: vec![1] }
    );
    assert_eq!(var(&spec, "KAIROS_CPUS"), Some("2"));
    assert_eq!(var(&spec, "SLURM_CPUS_PER_TASK"), Some("2"));
    assert_eq!(var(&spec, "SLURM_MEM_PER_NODE"), Some("1024"));
}

#[test]
fn cores_are_picked_unshared_first_then_the_least_shared() {
    let all = [0, 1, 2, 3];
    assert_eq!(pick_cores(&all, &[vec![0, 1]], 2), vec![2, 3]);
    assert_eq!(pick_cores(&all, &[vec![0, 1], vec![2]], 2), vec![0, 3], "then the least shared, lowest");
    assert_eq!(pick_cores(&all, &[], 9).len(), 4, "never more than the host has");
    assert!(pick_cores(&all, &[], 0).is_empty());
}

#[test]
fn a_mig_fraction_is_seen_by_uuid_through_its_parents_device_with_its_share() {
    let mut inventory = FakeInventory::parse("n", "2xH200", "H100", 1).unwrap();
    inventory.mig = Some(FakeMig::parse("3x2g.35gb").unwrap());
    let devices = DeviceMap::of(&inventory.discover().unwrap());
    let mut a = assignment(&["true"]);
    a.gpu_ids = vec![5];
    a.gpu_milli = 250;
    let spec = spec(&a, &node(&devices, &[0]), &[]).unwrap();
    assert_eq!(var(&spec, "CUDA_VISIBLE_DEVICES"), Some("MIG-fake-n-1-0"));
    assert_eq!(spec.limits.gpus, vec![1], "the parent's device");
    assert_eq!((spec.gpus.as_slice(), spec.milli), (&[5][..], 250));
    assert_eq!(var(&spec, "KAIROS_GPU_FRACTION"), Some("0.250"));
    assert_eq!(var(&spec, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("25"));
    assert_eq!(var(&spec, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), Some("0=8960M"));
}

#[test]
fn a_container_binds_the_jobs_directory_first_then_its_mounts() {
    let devices = whole_gpus();
    let mut a = assignment(&["true"]);
    a.memory_mib = 512;
    a.container = Some(pb::ContainerSpec {
        image: "docker://busybox".into(),
        mounts: vec!["/data:/inputs:ro".into(), "/scratch:/scratch".into()],
        workdir: String::new(),
    });
    let spec = spec(&a, &node(&devices, &[0]), &[]).unwrap();
    let c = spec.container.expect("a container");
    assert_eq!(c.image, "docker://busybox");
    let job = "/var/lib/kairos/jobs/7-1234";
    assert_eq!(c.workdir, job, "the job's directory, bound at its own path");
    let binds: Vec<(&str, &str, bool, bool)> =
        c.binds.iter().map(|b| (b.src.to_str().unwrap(), b.dst.as_str(), b.read_only, b.the_jobs)).collect();
    assert_eq!(
        binds,
        vec![
            (job, job, false, false),
            ("/data", "/inputs", true, true),
            ("/scratch", "/scratch", false, true)
        ]
    );
    assert_eq!(
        (c.gpu_names, c.gpu_minors, c.memory_mib),
        (vec!["1".to_string(), "0".into()], vec![0, 1], 512)
    );
    assert_eq!(c.base, Path::new("/var/lib/kairos/containers"));
    // An empty image is no container.
    a.container = Some(pb::ContainerSpec { image: String::new(), mounts: vec![], workdir: "/w".into() });
    assert!(super::spec(&a, &node(&devices, &[0]), &[]).unwrap().container.is_none());
}

#[test]
fn bad_input_is_refused_with_the_runs_files_for_its_log() {
    let devices = whole_gpus();
    let n = node(&devices, &[0]);
    let e = spec(&assignment(&[]), &n, &[]).unwrap_err();
    assert_eq!((e.key, &e.why), ((7, 2), &LaunchError::EmptyCommand));
    assert_eq!(e.files.log_name, "attempt-2.log");
    for bad in ["relative:/x", "/x", "/a:/b:rx", "/a:b"] {
        let mut a = assignment(&["true"]);
        a.container =
            Some(pb::ContainerSpec { image: "img".into(), mounts: vec![bad.into()], workdir: String::new() });
        let e = spec(&a, &n, &[]).unwrap_err();
        assert_eq!(e.why, LaunchError::BadMount(bad.into()), "{bad}");
        assert!(e.to_string().contains("is not SRC:DST[:ro]"), "{e}");
    }
    assert_eq!(parse_signal("SIGNOPE", Signal::SIGTERM), Signal::SIGTERM);
    assert_eq!(job_of_dir_name("7-1234"), Some(7));
    assert_eq!(job_of_dir_name("7"), Some(7));
    assert_eq!(job_of_dir_name("x-1"), None);
}
