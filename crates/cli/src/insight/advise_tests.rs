//! `policy advise` on a synthetic history whose usage is known: the values it must propose, and
//! the file it writes is one `policy apply --dry-run` accepts.

use super::*;
use crate::insight::figures::tests::record;
use crate::insight::proposal;
use crate::policy_file::PolicyFile;

const POLICY: &str = r#"
[submit_rules]
training = "training"
inference = "inference"
batch = "batch"

[qos.training]
priority = 100
preempt_mode = "requeue"
max_wall = "48h"

[qos.inference]
priority = 200
max_wall = "2h"
gpu_sharing = true

[qos.batch]
priority = 10
max_wall = "1day"

[partitions.default]
priority_tier = 1

[partitions.big]
selector = { rack = "r2" }
"#;

fn policy() -> pb::Policy {
    PolicyFile::parse(POLICY).unwrap().to_pb().unwrap()
}

/// 20 training jobs on 2 GPUs, busy, running 1h to 1h19m, using 1.0 to 2.9 cores and 4 to
/// 8.75 GiB per GPU; 12 inference jobs on one GPU for 10 minutes, 10 of them peaking at 16000
/// MiB of 80 GiB (2 at 40000), 8 of them 2 % busy; 3 batch jobs.
fn history() -> Vec<pb::JobRecord> {
    let mut out = Vec::new();
    for i in 0..20u64 {
        let mut r = record(i + 1, 2, 3_600_000 + i * 60_000);
        r.cpu_time_ms = r.run_ms * 2 * (10 + i) / 10;
        r.max_rss_kib = 2 * (4096 + 256 * i) * 1024;
        r.gpu_ms = 2 * r.run_ms;
        r.gpu_busy_ms = r.gpu_ms * 8 / 10;
        out.push(r);
    }
    for i in 0..12u64 {
        let mut r = record(100 + i, 1, 600_000);
        r.qos = "inference".into();
        r.profile = pb::Profile::Inference as i32;
        r.gpu_ms = r.run_ms;
        r.gpu_busy_ms = if i < 8 { r.gpu_ms / 50 } else { r.gpu_ms * 6 / 10 };
        r.gpu_mem_device_mib = 81_920;
        r.gpu_mem_max_mib = if i < 10 { 16_000 } else { 40_000 };
        out.push(r);
    }
    for i in 0..3u64 {
        let mut r = record(200 + i, 1, 300_000);
        r.qos = "batch".into();
        out.push(r);
    }
    out
}

fn offers() -> Vec<Offer> {
    let mig = |m: u64, p: &str| Offer { memory_mib: m, mig_profile: Some(p.into()) };
    vec![Offer { memory_mib: 81_920, mig_profile: None }, mig(40_960, "3g.40gb"), mig(18_432, "1g.18gb")]
}

fn settings(a: &ClassAdvice) -> Vec<(Setting, String)> {
    a.changes.iter().map(|c| (c.setting.clone(), c.was.clone())).collect()
}

#[test]
fn training_gets_a_wall_limit_from_p99_and_defaults_per_gpu_from_p90() {
    let advice = advise(&history(), &policy(), &offers());
    let training = advice.iter().find(|a| a.table == "qos.training").unwrap();
    assert_eq!(training.jobs, 20);
    assert_eq!(
        settings(training),
        [
            (Setting::MaxWall(7_200), "2days".to_string()),
            (Setting::DefCpusPerGpu(3), "unset".to_string()),
            (Setting::DefMemPerGpu(11 * 1024), "unset".to_string()),
        ],
        "p99 1h19m × 1.5 → 2h; p90 2.7 cores per GPU → 3; p90 8448 MiB × 1.25 → 11G"
    );
    assert!(training.changes[0].why.contains("p99 run time 1h19m over 20 jobs"), "{:?}", training.changes[0]);
}

#[test]
fn inference_gets_sharing_advice_and_an_idle_watch() {
    let advice = advise(&history(), &policy(), &offers());
    let inference = advice.iter().find(|a| a.table == "qos.inference").unwrap();
    let idle = IdleGpuEntry { after: "30m".into(), below: 0.05, action: "notify".into() };
    assert_eq!(
        settings(inference),
        [
            (Setting::MaxWall(900), "2h".to_string()),
            (Setting::DefCpusPerGpu(1), "unset".to_string()),
            (Setting::IdleGpu(idle), "unset".to_string()),
        ]
    );
    assert_eq!(
        inference.notes,
        ["83 % of 12 inference jobs peaked under 20.0G (1/4 of the GPU): gpu_sharing with 4 per GPU (--gpu-fraction 0.250), or MIG 1g.18gb (83 % fit)"]
    );
    assert_eq!(inference.changes[2].why, "8 of 12 GPU jobs (67 %) averaged under 10 % GPU utilisation");
}

#[test]
fn classes_with_too_few_jobs_get_no_advice_and_partitions_are_advised_too() {
    let advice = advise(&history(), &policy(), &offers());
    let batch = advice.iter().find(|a| a.table == "qos.batch").unwrap();
    assert!(batch.changes.is_empty());
    assert_eq!(batch.notes, ["3 finished jobs measured (fewer than 10): no advice"]);
    let big = advice.iter().find(|a| a.table == "partitions.big").unwrap();
    assert_eq!((big.jobs, big.changes.len()), (0, 0));
    let default = advice.iter().find(|a| a.table == "partitions.default").unwrap();
    assert_eq!(default.jobs, 35);
    assert_eq!(
        settings(default)[..2],
        [(Setting::MaxWall(7_200), "none".to_string()), (Setting::DefCpusPerGpu(3), "unset".to_string())]
    );
}

#[test]
fn the_proposed_file_is_the_policy_with_the_changes_marked_and_passes_the_dry_run_check() {
    let current = policy();
    let advice = advise(&history(), &current, &offers());
    let mut file = PolicyFile::from_pb(&current);
    proposal::apply(&mut file, &advice);
    let text = proposal::render(&file, &advice, &proposal::preamble("since 30d", 35)).unwrap();
    assert!(text.contains("max_wall = \"2h\"  # advised (was 2days)"), "{text}");
    assert!(text.contains("def_mem_per_gpu = \"11G\"  # advised (was unset)"), "{text}");
    assert!(
        text.contains("# advise qos.batch: 3 finished jobs measured\n#   3 finished jobs measured"),
        "{text}"
    );
    let checked = crate::policy_file::check(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let inference = checked.qos.iter().find(|q| q.name == "inference").unwrap();
    assert_eq!(inference.max_wall_s, 900);
    assert_eq!(inference.idle_gpu.as_ref().map(|i| (i.after_s, i.below_milli)), Some((1_800, 50)));
    let training = checked.qos.iter().find(|q| q.name == "training").unwrap();
    assert_eq!(training.resources.and_then(|r| r.def_cpus_per_gpu), Some(3));
    assert_eq!(training.preempt_mode, pb::PreemptMode::Requeue as i32, "the rest is the current policy");
}

#[test]
fn mig_instances_are_offered_with_their_profile() {
    let gpu = |model: &str, mem: u64, parent: Option<u32>| pb::Gpu {
        model: model.into(),
        memory_mib: mem,
        mig_parent: parent,
        ..Default::default()
    };
    let node = pb::Node {
        info: Some(pb::NodeInfo {
            gpus: vec![gpu("H200", 144_000, None), gpu("H200 MIG 1g.18gb", 18_432, Some(0))],
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        offers_of(&[node]),
        [
            Offer { memory_mib: 144_000, mig_profile: None },
            Offer { memory_mib: 18_432, mig_profile: Some("1g.18gb".into()) }
        ]
    );
}

fn offers_of(nodes: &[pb::Node]) -> Vec<Offer> {
    super::offers(nodes)
}
