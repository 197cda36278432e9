use super::*;

fn policy() -> pb::Policy {
    pb::Policy {
        qos: ["batch", "training", "urgent"]
            .map(|n| pb::Qos { name: n.into(), ..Default::default() })
            .to_vec(),
        partitions: vec![pb::Partition { name: "gpu-a".into(), ..Default::default() }],
        priority_classes: [("high-priority".to_string(), "urgent".to_string())].into(),
        ..Default::default()
    }
}

const JOB: &str = r#"
apiVersion: batch/v1
kind: Job
metadata:
  name: serve-llm
  labels:
    kueue.x-k8s.io/queue-name: gpu-a
spec:
  completions: 4
  parallelism: 2
  activeDeadlineSeconds: 600
  template:
    spec:
      priorityClassName: high-priority
      restartPolicy: Never
      containers:
      - name: main
        image: oci:/srv/images/vllm:v1
        command: ["python", "-m", "serve"]
        args: ["--port", "8000"]
        workingDir: /workspace
        env:
        - name: MODEL
          value: llama
        resources:
          limits:
            nvidia.com/gpu: 2
            memory: 16Gi
          requests:
            cpu: 1500m
"#;

#[test]
fn a_job_manifest_maps_its_image_command_resources_class_and_queue() {
    let got = specs(JOB, &policy()).unwrap();
    let [s] = got.as_slice() else { panic!("{got:?}") };
    assert_eq!(s.name, "serve-llm");
    assert_eq!(s.argv, ["python", "-m", "serve", "--port", "8000"]);
    assert_eq!(s.env.get("MODEL").map(String::as_str), Some("llama"));
    assert_eq!((s.qos.as_str(), s.partition.as_str()), ("urgent", "gpu-a"));
    let r = s.resources.clone().unwrap();
    assert_eq!((r.gpus, r.cpus, r.memory_mib, r.tasks), (2, 2, 16 * 1024, 1));
    let c = s.container.clone().unwrap();
    assert_eq!((c.image.as_str(), c.workdir.as_str()), ("oci:/srv/images/vllm:v1", "/workspace"));
    assert_eq!((s.array_indices.clone(), s.array_max_running, s.time_limit_s), (vec![0, 1, 2, 3], 2, 600));
}

#[test]
fn unsupported_fields_are_refused_all_named_and_unknown_classes_too() {
    let bad = JOB.replace(
        "      restartPolicy: Never\n",
        "      hostNetwork: true\n      volumes:\n      - name: data\n",
    );
    let e = specs(&bad, &policy()).unwrap_err();
    assert!(
        e.contains("Job.spec.template.spec.hostNetwork") && e.contains("Job.spec.template.spec.volumes"),
        "{e}"
    );
    assert!(e.contains("nothing submitted"), "{e}");
    let e = specs(&JOB.replace("high-priority", "low-priority"), &policy()).unwrap_err();
    assert!(e.contains("priorityClassName \"low-priority\" is mapped to no QoS"), "{e}");
    let e = specs(&JOB.replace("gpu-a", "nowhere"), &policy()).unwrap_err();
    assert!(e.contains("neither a partition nor a QoS"), "{e}");
    let e = specs("apiVersion: apps/v1\nkind: Deployment\n", &policy()).unwrap_err();
    assert!(e.contains("apps/v1 Deployment"), "{e}");
    let e =
        specs(&JOB.replace("        command: [\"python\", \"-m\", \"serve\"]\n", ""), &policy()).unwrap_err();
    assert!(e.contains("command is needed"), "{e}");
}

fn kueue_pod(name: &str, cmd: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    kueue.x-k8s.io/pod-group-name: ddp\n  \
         annotations:\n    kueue.x-k8s.io/pod-group-total-count: \"2\"\nspec:\n  containers:\n  - name: c\n    \
         image: oci:/img\n    command: [sh, -c, \"{cmd}\"]\n    resources:\n      limits:\n        nvidia.com/gpu: 1\n"
    )
}

#[test]
fn a_pod_group_is_one_gang_of_its_size_and_its_pods_must_be_alike() {
    let two = format!("{}---\n{}", kueue_pod("ddp-0", "torchrun"), kueue_pod("ddp-1", "torchrun"));
    let got = specs(&two, &policy()).unwrap();
    let [gang] = got.as_slice() else { panic!("{got:?}") };
    assert_eq!((gang.name.as_str(), gang.resources.as_ref().unwrap().tasks), ("ddp", 2));
    let one = kueue_pod("ddp-0", "torchrun");
    assert!(specs(&one, &policy()).unwrap_err().contains("has 1 pods in the file but a size of 2"));
    let unlike = format!("{}---\n{}", kueue_pod("ddp-0", "torchrun"), kueue_pod("ddp-1", "other"));
    assert!(specs(&unlike, &policy()).unwrap_err().contains("differs"));
    // Volcano: the group's size from its PodGroup.
    let volcano = two
        .replace("kueue.x-k8s.io/pod-group-name", "scheduling.k8s.io/group-name")
        .replace("    kueue.x-k8s.io/pod-group-total-count: \"2\"\n", "    other: x\n");
    let group = "apiVersion: scheduling.volcano.sh/v1beta1\nkind: PodGroup\nmetadata:\n  name: ddp\nspec:\n  minMember: 2\n";
    let got = specs(&format!("{volcano}---\n{group}"), &policy()).unwrap();
    assert_eq!(got[0].resources.as_ref().unwrap().tasks, 2);
    assert_eq!((cpus("250m"), cpus("2"), mem_mib("1G"), mem_mib("512Mi")), (Ok(1), Ok(2), Ok(954), Ok(512)));
}

#[test]
fn huge_completions_and_deep_nesting_are_refused_before_any_work() {
    let huge = JOB.replace("completions: 4", "completions: 4294967295");
    let e = specs(&huge, &policy()).unwrap_err();
    assert!(e.contains("Job.spec.completions: at most 10000"), "{e}");
    let many = JOB.replace("completions: 4", "completions: 10001");
    assert!(specs(&many, &policy()).unwrap_err().contains("at most 10000"));
    // Deep by dashes on one line, by indentation, by flow brackets.
    let dashes = format!("{}x\n", "- ".repeat(100_000));
    let indented: String = (0..200).map(|i| format!("{}a{i}:\n", "  ".repeat(i))).collect();
    let flow = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    for deep in [dashes, indented, flow] {
        let e = specs(&deep, &policy()).unwrap_err();
        assert!(e.contains("nested deeper than 64"), "{e}");
    }
    // A real manifest's depth passes.
    assert!(shallow_enough(JOB).is_ok());
}

#[test]
fn backoff_limit_is_retries_indexed_is_taken_and_another_scheduler_is_refused() {
    let job =
        JOB.replace("  completions: 4\n", "  completions: 4\n  backoffLimit: 3\n  completionMode: Indexed\n");
    let got = specs(&job, &policy()).unwrap();
    assert_eq!(got[0].retries, 3);
    let too_many = JOB.replace("  completions: 4\n", "  completions: 4\n  backoffLimit: 1000\n");
    assert!(specs(&too_many, &policy()).unwrap_err().contains("backoffLimit: at most 100"));
    let odd = JOB.replace("  completions: 4\n", "  completions: 4\n  completionMode: Sideways\n");
    assert!(specs(&odd, &policy()).unwrap_err().contains("completionMode"));
    let other = JOB.replace(
        "      restartPolicy: Never\n",
        "      restartPolicy: Never\n      schedulerName: volcano\n",
    );
    let e = specs(&other, &policy()).unwrap_err();
    assert!(e.contains("schedulerName (volcano"), "{e}");
    let ours = JOB
        .replace("      restartPolicy: Never\n", "      restartPolicy: Never\n      schedulerName: kairos\n");
    assert!(specs(&ours, &policy()).is_ok());
}

#[test]
fn kueue_topology_annotations_ask_for_one_domain() {
    let required = JOB.replace("    spec:\n      priorityClassName", "    metadata:\n      annotations:\n        kueue.x-k8s.io/podset-required-topology: rack\n    spec:\n      priorityClassName");
    let got = specs(&required, &policy()).unwrap();
    let t = got[0].resources.clone().unwrap().topology.unwrap();
    assert_eq!((t.level.as_str(), t.required), ("rack", true));
    let preferred = required.replace("podset-required-topology", "podset-preferred-topology");
    let t = specs(&preferred, &policy()).unwrap()[0].resources.clone().unwrap().topology.unwrap();
    assert_eq!((t.level.as_str(), t.required), ("rack", false));
}
