//! `kairos policy import`: a Kueue cluster's ClusterQueues and Cohorts become accounts with
//! the same GPU guarantees; what kairos cannot honour is refused by name and nothing changes.

use crate::harness::Cluster;

/// A cohort with a pool of its own and two teams' queues in it, as Kueue has them.
const KUEUE: &str = r#"apiVersion: kueue.x-k8s.io/v1beta1
kind: ResourceFlavor
metadata:
  name: default
---
apiVersion: kueue.x-k8s.io/v1alpha1
kind: Cohort
metadata:
  name: cohort-ml
spec:
  resourceGroups:
  - coveredResources: ["nvidia.com/gpu"]
    flavors:
    - name: default
      resources:
      - name: nvidia.com/gpu
        nominalQuota: 2
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata:
  name: team-a
spec:
  namespaceSelector: {}
  cohort: cohort-ml
  preemption:
    reclaimWithinCohort: Any
  resourceGroups:
  - coveredResources: ["cpu", "memory", "nvidia.com/gpu"]
    flavors:
    - name: default
      resources:
      - name: cpu
        nominalQuota: 32
      - name: memory
        nominalQuota: 256Gi
      - name: nvidia.com/gpu
        nominalQuota: 4
        borrowingLimit: 2
        lendingLimit: 1
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata:
  name: team-b
spec:
  cohort: cohort-ml
  resourceGroups:
  - coveredResources: ["cpu", "memory", "nvidia.com/gpu"]
    flavors:
    - name: default
      resources:
      - name: cpu
        nominalQuota: 16
      - name: memory
        nominalQuota: 128Gi
      - name: nvidia.com/gpu
        nominalQuota: "2"
"#;

fn accounts(c: &Cluster) -> serde_json::Value {
    serde_json::from_str(&c.ok(&["account", "list", "--json"])).unwrap()
}

/// (parent, guaranteed_gpus, borrow_limit, lend_limit) of account `name` in `list`.
fn guarantee_of(
    list: &serde_json::Value,
    name: &str,
) -> (Option<String>, Option<u64>, Option<u64>, Option<u64>) {
    let a = list
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == name)
        .unwrap_or_else(|| panic!("{name}: {list}"));
    let parent = a["parent"].as_str().map(String::from);
    (parent, a["guaranteed_gpus"].as_u64(), a["borrow_limit"].as_u64(), a["lend_limit"].as_u64())
}

#[test]
fn kueue_queues_and_cohorts_become_accounts_with_the_same_guarantees() {
    let c = Cluster::start_with(1, 8, &[]);
    // An account of the same name keeps its members and shares; only parent and guarantee change.
    c.ok(&["account", "create", "team-a", "--parent", "root", "--users", "alice", "--shares", "3"]);
    let file = c.path("kueue.yaml");
    std::fs::write(&file, KUEUE).unwrap();
    let file = file.to_str().unwrap();

    // A dry run prints the policy file fragment and changes nothing.
    let before = accounts(&c);
    let dry = c.ok(&["policy", "import", file, "--dry-run"]);
    assert!(dry.contains("[accounts.team-a]\nparent = \"cohort-ml\"\nguaranteed = { gpus = 4 }\nborrow_limit = 2\nlend_limit = 1\n"), "{dry}");
    assert!(dry.contains("# note: ClusterQueue \"team-a\": cpu, memory quota ignored"), "{dry}");
    assert_eq!(accounts(&c), before, "a dry run changed the accounts");

    let out = c.ok(&["policy", "import", file]);
    for line in [
        "account \"cohort-ml\": parent root, guaranteed 8 GPUs, borrow unlimited, lend all",
        "account \"team-a\": parent cohort-ml, guaranteed 4 GPUs, borrow ≤ 2, lend ≤ 1",
        "account \"team-b\": parent cohort-ml, guaranteed 2 GPUs, borrow unlimited, lend all",
    ] {
        assert!(out.lines().any(|l| l == line), "{line:?} not in {out}");
    }
    let list = accounts(&c);
    let own = |p: &str| Some(p.to_string());
    // The cohort's own 2 GPUs on top of its members' 4 + 2.
    assert_eq!(guarantee_of(&list, "cohort-ml"), (own("root"), Some(8), None, None), "{list}");
    assert_eq!(guarantee_of(&list, "team-a"), (own("cohort-ml"), Some(4), Some(2), Some(1)), "{list}");
    assert_eq!(guarantee_of(&list, "team-b"), (own("cohort-ml"), Some(2), None, None), "{list}");
    let a = list.as_array().unwrap().iter().find(|a| a["name"] == "team-a").unwrap();
    assert_eq!((a["users"].clone(), a["shares"].as_u64()), (serde_json::json!(["alice"]), Some(3)), "{a}");

    // Importing the same file again changes nothing.
    c.ok(&["policy", "import", file]);
    assert_eq!(accounts(&c), list);
}

#[test]
fn a_kueue_field_kairos_cannot_honour_is_refused_by_name_and_nothing_changes() {
    let c = Cluster::start_with(1, 8, &[]);
    let bad = KUEUE.replace(
        "  cohort: cohort-ml\n  resourceGroups:",
        "  cohort: cohort-ml\n  fairSharing:\n    weight: 2\n  resourceGroups:",
    );
    let file = c.path("kueue.yaml");
    std::fs::write(&file, bad).unwrap();
    let before = accounts(&c);
    let out = c.kairos(&["policy", "import", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the import succeeded: {err}");
    assert!(err.contains("kueue: ClusterQueue \"team-b\": spec.fairSharing is not supported"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err:?}");
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(accounts(&c), before, "a refused import changed the accounts");
}
