use super::*;

/// `n` finished inference-QoS jobs of one GPU each with known usage.
fn history(n: u64) -> Vec<pb::JobRecord> {
    (0..n)
        .map(|i| pb::JobRecord {
            id: i + 1,
            qos: "inference".into(),
            profile: pb::Profile::Inference as i32,
            state: pb::JobState::Completed as i32,
            submit_time_ms: 0,
            start_time_ms: 1_000,
            // Runs of 10 to 19 minutes.
            end_time_ms: 1_000 + (600 + 60 * (i % 10) as i64) * 1000,
            gpus: 1,
            tasks: 1,
            run_ms: 600_000,
            // 1.5 cores each, one job 3 cores.
            cpu_time_ms: if i == 0 { 1_800_000 } else { 900_000 },
            max_rss_kib: 6 << 20,
            gpu_ms: 600_000,
            gpu_busy_ms: 24_000,
            // 9 in 10 peak under a quarter of an 80 GiB GPU.
            gpu_mem_max_mib: if i % 10 == 0 { 40_000 } else { 15_000 },
            gpu_mem_device_mib: 81_920,
            ..Default::default()
        })
        .collect()
}

fn shipped() -> PolicyFile {
    let policy = kairos_convert::policy::policy_to_pb(&kairos_scheduler::policy::Policy::default());
    PolicyFile::from_pb(&policy)
}

#[test]
fn a_synthetic_history_gives_the_expected_proposals_with_their_evidence() {
    let mig = vec![("1g.18gb".to_string(), 18_432), ("3g.71gb".to_string(), 72_704)];
    let advice = advise_from(&history(20), &shipped(), &mig);
    let changes: Vec<&Change> = advice.iter().map(|a| &a.change).collect();
    // p99 of 10..19 min is 19 min; × 1.5 → 29 min.
    assert!(changes.contains(&&Change::MaxWall("29m".into())), "{advice:#?}");
    // p90 of cores per GPU is 1.5 → 2.
    assert!(changes.contains(&&Change::DefCpusPerGpu(2)), "{advice:#?}");
    // 6 GiB × 1.25 → 8G.
    assert!(changes.contains(&&Change::DefMemPerGpu("8G".into())), "{advice:#?}");
    assert!(changes.contains(&&Change::IdleNotify), "4 % busy: {advice:#?}");
    let sharing = advice.iter().find(|a| a.change == Change::GpuSharing);
    let shipped_shares = shipped().qos["inference"].gpu_sharing;
    if !shipped_shares {
        let s = sharing.expect("sharing proposed");
        assert_eq!(
            s.evidence,
            "90 % of 20 inference jobs peaked under 20.0G: gpu_sharing with 4 per GPU, or MIG 1g.18gb"
        );
    }
    let wall = advice.iter().find(|a| matches!(a.change, Change::MaxWall(_))).unwrap();
    assert!(wall.evidence.starts_with("20 completed jobs ran at most 19m (p99)"), "{}", wall.evidence);
}

#[test]
fn the_rendered_file_applies_each_proposal_and_parses_back_valid() {
    let mut file = shipped();
    let advice = advise_from(&history(20), &file, &[]);
    let text = render(&mut file, &advice, "30d").unwrap();
    assert!(text.contains("# qos.inference: max_wall = \"29m\": 20 completed jobs"), "{text}");
    let parsed = PolicyFile::parse(&text).unwrap();
    assert_eq!(parsed.qos["inference"].max_wall, "29m");
    assert_eq!(parsed.qos["inference"].def_cpus_per_gpu, Some(2));
    let policy = kairos_convert::policy::policy_from_pb(parsed.to_pb().unwrap()).unwrap();
    policy.validate().unwrap();
}

#[test]
fn too_few_jobs_give_a_note_and_no_change() {
    let advice = advise_from(&history(5), &shipped(), &[]);
    assert_eq!(advice.len(), 1);
    assert_eq!(advice[0].change, Change::Note);
    assert!(advice[0].evidence.contains("fewer than 10"), "{:?}", advice[0]);
}
