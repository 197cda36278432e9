//! `kairos policy import FILE`: Kueue `ClusterQueue`s and `Cohort`s as kairos accounts with
//! GPU guarantees, for clusters that come from Kueue.
//!
//! What maps (YAML, one or more documents, or a `kubectl get -o yaml` `List`):
//! - a `ClusterQueue` → an account of its name, under its cohort (`spec.cohort`, v1beta2's
//!   `spec.cohortName`; none: `root`);
//! - a `Cohort` → an account under its parent (`spec.parentName`, v1alpha1's `spec.parent`;
//!   none: `root`); a cohort only named by its members → an account under `root`;
//! - GPU quotas (`nvidia.com/gpu`, `amd.com/gpu`, summed over flavors): `nominalQuota` → the
//!   guarantee, `borrowingLimit` → `borrow_limit` (absent on a flavor: unlimited),
//!   `lendingLimit` → `lend_limit` (absent on a flavor: all). A Kueue cohort's own quota comes
//!   on top of its members' (a pool they share), and a kairos guarantee covers the account's
//!   children: so a cohort is guaranteed its own quota and its members' together (none when
//!   that is nothing), which keeps the borrowing inside a cohort from other teams' reclaim as
//!   in Kueue.
//!
//! What is noted, not mapped: `cpu`, `memory`, `pods` and `ephemeral-storage` quotas (kairos
//! guarantees GPUs only), flavors other than `default` (taken as any GPU model),
//! `queueingStrategy`, `preemption.reclaimWithinCohort` and `preemption.withinClusterQueue`;
//! `LocalQueue`s, `ResourceFlavor`s and `WorkloadPriorityClass`es are skipped.
//!
//! Anything else — `fairSharing`, `admissionChecks`, `preemption.borrowWithinCohort`, a
//! non-empty `namespaceSelector`, another resource, another kind of object, a name kairos
//! cannot take — is refused by name, and nothing is applied.

use std::collections::BTreeMap;
use std::path::Path;

use kairos_proto::v1 as pb;
use serde::Deserialize;
use serde_yaml_ng::Value;

use crate::client::Client;

const GPU_RESOURCES: &[&str] = &["nvidia.com/gpu", "amd.com/gpu"];
/// Quotas of resources kairos does not guarantee (noted, not refused: every real queue has them).
const IGNORED_RESOURCES: &[&str] = &["cpu", "memory", "pods", "ephemeral-storage"];
const OBJECT_KEYS: &[&str] = &["apiVersion", "kind", "metadata", "spec", "status"];
const QUEUE_SPEC_KEYS: &[&str] =
    &["cohort", "cohortName", "resourceGroups", "queueingStrategy", "preemption", "namespaceSelector"];
const COHORT_SPEC_KEYS: &[&str] = &["parent", "parentName", "resourceGroups"];
const PREEMPTION_KEYS: &[&str] = &["reclaimWithinCohort", "withinClusterQueue"];
const GROUP_KEYS: &[&str] = &["coveredResources", "flavors"];
const FLAVOR_KEYS: &[&str] = &["name", "resources"];
const RESOURCE_KEYS: &[&str] = &["name", "nominalQuota", "borrowingLimit", "lendingLimit"];
/// Kueue objects with nothing for kairos to take, and why.
const SKIPPED_KINDS: &[(&str, &str)] = &[
    ("LocalQueue", "jobs name their account with --account"),
    ("ResourceFlavor", "kairos guarantees any GPU model"),
    ("WorkloadPriorityClass", "kairos's QoS classes set priorities"),
];
/// The longest account name kairos takes.
const NAME_MAX: usize = 64;
/// The account every kairos cluster has, the top of the tree.
const ROOT: &str = "root";

/// The GPU quota of one queue or cohort, summed over its flavors.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Quota {
    gpus: u64,
    /// None: unlimited (some flavor sets none).
    borrow: Option<u64>,
    /// None: all of it (some flavor sets none).
    lend: Option<u64>,
}

/// One queue or cohort of the file, as an account.
#[derive(Debug)]
struct Node {
    /// "ClusterQueue", "Cohort", or "cohort" for a cohort only named by its members.
    kind: &'static str,
    parent: String,
    /// Its own GPU quota (None: it names no GPU resource).
    quota: Option<Quota>,
}

/// What the file holds so far: the queues and cohorts by name, and the notes for the user.
#[derive(Default)]
struct Import {
    nodes: BTreeMap<String, Node>,
    notes: Vec<String>,
}

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key).unwrap_or(&Value::Null)
}

fn text_of(v: &Value, key: &str) -> String {
    match get(v, key) {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => String::new(),
    }
}

/// The items of a YAML list at `path` (none when absent).
fn list<'a>(who: &str, v: &'a Value, path: &str) -> Result<&'a [Value], String> {
    match v {
        Value::Null => Ok(&[]),
        Value::Sequence(s) => Ok(s),
        _ => Err(format!("kueue: {who}: {path} is not a list")),
    }
}

/// Refuses the first key of mapping `v` (at `path`) that is not in `allowed`, by name.
fn refuse_unknown(who: &str, v: &Value, path: &str, allowed: &[&str]) -> Result<(), String> {
    match v {
        Value::Null => Ok(()),
        Value::Mapping(m) => {
            for k in m.keys() {
                let k = k.as_str().unwrap_or("?");
                if !allowed.contains(&k) {
                    let at = if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
                    return Err(format!("kueue: {who}: {at} is not supported"));
                }
            }
            Ok(())
        }
        _ => Err(format!("kueue: {who}: {path} is not a mapping")),
    }
}

/// Refuses a name kairos cannot give an account (`what`: how the object names it).
fn check_name(who: &str, what: &str, name: &str) -> Result<(), String> {
    let valid = !name.is_empty()
        && name.len() <= NAME_MAX
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if valid {
        return Ok(());
    }
    let dots = if name.contains('.') { " (Kubernetes names may have '.', kairos's may not)" } else { "" };
    Err(format!(
        "kueue: {who}: {what} \"{name}\" is not a kairos account name: use 1-{NAME_MAX} characters of [a-z0-9_-]{dots}"
    ))
}

/// A whole GPU count: a YAML integer or a plain integer quantity ("8"); not "500m", "1k".
fn count(who: &str, path: &str, v: &Value) -> Result<u64, String> {
    let n = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s.parse().ok(),
        _ => None,
    };
    n.filter(|n| *n <= u64::from(u32::MAX)).ok_or_else(|| {
        let shown = match v {
            Value::String(s) => format!("\"{s}\""),
            Value::Number(n) => n.to_string(),
            _ => "(not a quantity)".into(),
        };
        format!("kueue: {who}: {path} {shown} is not a whole number of GPUs")
    })
}

/// Adds the limit at `path` of `entry` to `sum`; absent, the sum becomes None (no limit).
fn add_limit(who: &str, entry: &Value, path: &str, key: &str, sum: &mut Option<u64>) -> Result<(), String> {
    match get(entry, key) {
        Value::Null => *sum = None,
        v => {
            let n = count(who, &format!("{path}.{key}"), v)?;
            *sum = sum.map(|s| s + n);
        }
    }
    Ok(())
}

impl Import {
    /// Takes one document (or `List` item) of the file.
    fn add(&mut self, v: &Value, doc: usize) -> Result<(), String> {
        if v.is_null() {
            return Ok(());
        }
        let (api, kind) = (text_of(v, "apiVersion"), text_of(v, "kind"));
        let kueue = api.starts_with("kueue.x-k8s.io/");
        match kind.as_str() {
            "List" if api == "v1" => {
                for item in list(&format!("document {doc}"), get(v, "items"), "items")? {
                    self.add(item, doc)?;
                }
                Ok(())
            }
            "ClusterQueue" if kueue => self.object("ClusterQueue", v),
            "Cohort" if kueue => self.object("Cohort", v),
            k => match SKIPPED_KINDS.iter().find(|(s, _)| kueue && *s == k) {
                Some((_, why)) => {
                    let name = text_of(get(v, "metadata"), "name");
                    self.notes.push(format!("{k} \"{name}\" skipped: {why}"));
                    Ok(())
                }
                None => Err(format!(
                    "kueue: document {doc}: {api} {k} is not a Kueue ClusterQueue or Cohort (kind refused)"
                )),
            },
        }
    }

    /// A ClusterQueue or Cohort: its name, its parent, its GPU quota; what it cannot map refused.
    fn object(&mut self, kind: &'static str, v: &Value) -> Result<(), String> {
        let name = text_of(get(v, "metadata"), "name");
        let who = format!("{kind} \"{name}\"");
        check_name(&who, "metadata.name", &name)?;
        if name == ROOT {
            return Err(format!("kueue: {who}: \"{ROOT}\" is kairos's top account: rename it"));
        }
        refuse_unknown(&who, v, "", OBJECT_KEYS)?;
        let spec = get(v, "spec");
        let queue = kind == "ClusterQueue";
        refuse_unknown(&who, spec, "spec", if queue { QUEUE_SPEC_KEYS } else { COHORT_SPEC_KEYS })?;
        let keys: &[&str] = if queue { &["cohort", "cohortName"] } else { &["parentName", "parent"] };
        let parent = keys.iter().map(|k| text_of(spec, k)).find(|p| !p.is_empty());
        if let Some(p) = &parent {
            check_name(&who, if queue { "cohort" } else { "parent" }, p)?;
        }
        if queue {
            self.queue_settings(&who, spec)?;
        }
        let quota = self.quota(&who, get(spec, "resourceGroups"))?;
        let node = Node { kind, parent: parent.unwrap_or_else(|| ROOT.into()), quota };
        if self.nodes.insert(name.clone(), node).is_some() {
            return Err(format!("kueue: {who}: a second ClusterQueue or Cohort of this name"));
        }
        Ok(())
    }

    /// A queue's settings kairos does otherwise: noted; the ones it cannot honour refused.
    fn queue_settings(&mut self, who: &str, spec: &Value) -> Result<(), String> {
        if !get(spec, "queueingStrategy").is_null() {
            self.notes.push(format!("{who}: queueingStrategy not taken: kairos orders jobs by priority"));
        }
        let preemption = get(spec, "preemption");
        refuse_unknown(who, preemption, "spec.preemption", PREEMPTION_KEYS)?;
        if !get(preemption, "reclaimWithinCohort").is_null() {
            self.notes.push(format!(
                "{who}: reclaimWithinCohort not taken: kairos always takes back lent GPUs (preempting borrowers through their QoS's preempt mode)"
            ));
        }
        if !get(preemption, "withinClusterQueue").is_null() {
            self.notes.push(format!(
                "{who}: withinClusterQueue not taken: kairos's QoS rules decide preemption inside an account"
            ));
        }
        match get(spec, "namespaceSelector") {
            Value::Null => Ok(()),
            Value::Mapping(m) if m.is_empty() => Ok(()),
            _ => Err(format!(
                "kueue: {who}: spec.namespaceSelector is not supported (only {{}}: kairos accounts list their users)"
            )),
        }
    }

    /// The GPU quota of `spec.resourceGroups` (None: no GPU resource in it).
    fn quota(&mut self, who: &str, groups: &Value) -> Result<Option<Quota>, String> {
        let mut quota = Quota { gpus: 0, borrow: Some(0), lend: Some(0) };
        let (mut any_gpu, mut ignored, mut flavors) = (false, Vec::<String>::new(), Vec::<String>::new());
        for (flavor, at, r) in resources(who, groups)? {
            let name = text_of(r, "name");
            if IGNORED_RESOURCES.contains(&name.as_str()) {
                if !ignored.contains(&name) {
                    ignored.push(name);
                }
                continue;
            }
            add_gpus(who, r, &at, &name, &mut quota)?;
            any_gpu = true;
            if flavor != "default" && !flavors.contains(&flavor) {
                flavors.push(flavor);
            }
        }
        if !ignored.is_empty() {
            let ignored = ignored.join(", ");
            self.notes.push(format!("{who}: {ignored} quota ignored: kairos guarantees GPUs only"));
        }
        for f in flavors {
            let note = format!("{who}: flavor \"{f}\" taken as any GPU model (no per-model guarantee yet)");
            self.notes.push(note);
        }
        Ok(any_gpu.then_some(quota))
    }

    /// The queues and cohorts as accounts, parents first, and the notes.
    fn accounts(mut self) -> Result<(Vec<pb::Account>, Vec<String>), String> {
        if self.nodes.is_empty() {
            return Err("kueue: the file has no ClusterQueue or Cohort".into());
        }
        self.add_named_cohorts()?;
        let order = self.parents_first()?;
        let totals = self.totals(&order);
        let mut accounts = Vec::with_capacity(order.len());
        for name in order {
            let node = &self.nodes[&name];
            let who = format!("{} \"{name}\"", node.kind);
            let total = totals.get(&name).copied().unwrap_or(0);
            let own = node.quota.unwrap_or(Quota { gpus: 0, borrow: None, lend: None });
            if total > own.gpus {
                self.notes.push(format!(
                    "{who}: guaranteed {total} GPUs, its members' {} with its own {} (a kairos guarantee covers the account's children)",
                    total - own.gpus,
                    own.gpus
                ));
            }
            let guarantee = guarantee(&who, Quota { gpus: total, ..own })?;
            accounts.push(pb::Account {
                name: name.clone(),
                parent: node.parent.clone(),
                shares: 1,
                guarantee,
                ..Default::default()
            });
        }
        if accounts.iter().any(|a| a.guarantee.is_some()) {
            self.notes.push(
                "kairos lends idle guaranteed GPUs to any team, not only inside a cohort: lend_limit keeps them"
                    .into(),
            );
        }
        Ok((accounts, self.notes))
    }

    /// Cohorts only named by their members (or as a Cohort's parent): accounts under root.
    fn add_named_cohorts(&mut self) -> Result<(), String> {
        let mut named = BTreeMap::new();
        for (name, node) in &self.nodes {
            let p = &node.parent;
            match self.nodes.get(p) {
                _ if p == ROOT => {}
                None => {
                    named.insert(p.clone(), Node { kind: "cohort", parent: ROOT.into(), quota: None });
                }
                Some(parent) if parent.kind == "ClusterQueue" => {
                    return Err(format!(
                        "kueue: {} \"{name}\": its cohort \"{p}\" is also a ClusterQueue's name (one account each)",
                        node.kind
                    ))
                }
                Some(_) => {}
            }
        }
        for name in named.keys() {
            self.notes.push(format!("cohort \"{name}\" has no Cohort object: an account under {ROOT}"));
        }
        self.nodes.extend(named);
        Ok(())
    }

    /// Every name, parents before their children (by depth, then name); a cycle refused.
    fn parents_first(&self) -> Result<Vec<String>, String> {
        let mut depths = Vec::with_capacity(self.nodes.len());
        for (name, node) in &self.nodes {
            let mut depth = 0;
            let mut at = node.parent.as_str();
            while let Some(up) = self.nodes.get(at) {
                depth += 1;
                if depth > self.nodes.len() {
                    return Err(format!("kueue: {} \"{name}\": its parents form a cycle", node.kind));
                }
                at = up.parent.as_str();
            }
            depths.push((depth, name.clone()));
        }
        depths.sort();
        Ok(depths.into_iter().map(|(_, n)| n).collect())
    }

    /// Each account's own GPU quota with its members' (`order`: parents first).
    fn totals(&self, order: &[String]) -> BTreeMap<String, u64> {
        let mut totals: BTreeMap<String, u64> = BTreeMap::new();
        for name in order.iter().rev() {
            let node = &self.nodes[name];
            let total = totals.get(name).copied().unwrap_or(0) + node.quota.map_or(0, |q| q.gpus);
            totals.insert(name.clone(), total);
            if self.nodes.contains_key(&node.parent) {
                *totals.entry(node.parent.clone()).or_default() += total;
            }
        }
        totals
    }
}

/// Every resource entry of `spec.resourceGroups`: its flavor's name, its path, the entry;
/// keys kairos does not read refused.
fn resources<'a>(who: &str, groups: &'a Value) -> Result<Vec<(String, String, &'a Value)>, String> {
    let mut out = Vec::new();
    for (i, group) in list(who, groups, "spec.resourceGroups")?.iter().enumerate() {
        let at = format!("spec.resourceGroups[{i}]");
        refuse_unknown(who, group, &at, GROUP_KEYS)?;
        for (j, flavor) in list(who, get(group, "flavors"), &format!("{at}.flavors"))?.iter().enumerate() {
            let at = format!("{at}.flavors[{j}]");
            refuse_unknown(who, flavor, &at, FLAVOR_KEYS)?;
            let entries = list(who, get(flavor, "resources"), &format!("{at}.resources"))?;
            for (k, r) in entries.iter().enumerate() {
                let at = format!("{at}.resources[{k}]");
                refuse_unknown(who, r, &at, RESOURCE_KEYS)?;
                out.push((text_of(flavor, "name"), at, r));
            }
        }
    }
    Ok(out)
}

/// Adds one GPU resource entry (`r`, at `at`) to `quota`; any other resource refused.
fn add_gpus(who: &str, r: &Value, at: &str, name: &str, quota: &mut Quota) -> Result<(), String> {
    if !GPU_RESOURCES.contains(&name) {
        return Err(format!(
            "kueue: {who}: {at}.name \"{name}\" is not supported (kairos guarantees whole GPUs: {}; cpu, memory, pods are ignored)",
            GPU_RESOURCES.join(", ")
        ));
    }
    let nominal = get(r, "nominalQuota");
    if nominal.is_null() {
        return Err(format!("kueue: {who}: {at}.nominalQuota is missing"));
    }
    quota.gpus += count(who, &format!("{at}.nominalQuota"), nominal)?;
    add_limit(who, r, at, "borrowingLimit", &mut quota.borrow)?;
    add_limit(who, r, at, "lendingLimit", &mut quota.lend)
}

/// The kairos guarantee of a quota (None: nothing guaranteed and no limit).
fn guarantee(who: &str, q: Quota) -> Result<Option<pb::Guarantee>, String> {
    let gpus32 = |n: u64, what: &str| {
        u32::try_from(n).map_err(|_| format!("kueue: {who}: {what} of {n} GPUs is too large"))
    };
    if let Some(lend) = q.lend.filter(|l| *l > q.gpus) {
        return Err(format!("kueue: {who}: lendingLimit {lend} is more than its {} guaranteed GPUs", q.gpus));
    }
    if q.gpus == 0 && q.borrow.is_none() && q.lend.is_none() {
        return Ok(None);
    }
    Ok(Some(pb::Guarantee {
        gpus: gpus32(q.gpus, "a guarantee")?,
        borrow_limit: q.borrow.map(|b| gpus32(b, "a borrowingLimit")).transpose()?,
        lend_limit: q.lend.map(|l| gpus32(l, "a lendingLimit")).transpose()?,
    }))
}

/// The kairos accounts (parents first) that Kueue ClusterQueues and Cohorts in `yaml` (one or
/// more documents) make, and notes on what was not taken; or why the file is refused.
pub fn accounts_from_kueue(yaml: &str) -> Result<(Vec<pb::Account>, Vec<String>), String> {
    let mut import = Import::default();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(yaml).enumerate() {
        let v = Value::deserialize(doc).map_err(|e| format!("document {}: {e}", i + 1))?;
        import.add(&v, i + 1)?;
    }
    import.accounts()
}

/// "parent ml, guaranteed 8 GPUs, borrow ≤ 4, lend all".
fn summary(a: &pb::Account) -> String {
    let parent = if a.parent.is_empty() { "none" } else { &a.parent };
    match &a.guarantee {
        None => format!("parent {parent}, no guarantee"),
        Some(g) => {
            let borrow = g.borrow_limit.map_or("borrow unlimited".into(), |b| format!("borrow ≤ {b}"));
            let lend = g.lend_limit.map_or("lend all".into(), |l| format!("lend ≤ {l}"));
            format!("parent {parent}, guaranteed {} GPUs, {borrow}, {lend}", g.gpus)
        }
    }
}

/// The accounts as a fragment of a policy file (`kairos policy apply`), notes as comments.
fn toml_fragment(accounts: &[pb::Account], notes: &[String]) -> String {
    let mut out = String::from("# kairos policy import --dry-run: nothing applied\n");
    for n in notes {
        out.push_str(&format!("# note: {n}\n"));
    }
    for a in accounts {
        out.push_str(&format!("\n[accounts.{}]\nparent = \"{}\"\n", a.name, a.parent));
        if let Some(g) = &a.guarantee {
            out.push_str(&format!("guaranteed = {{ gpus = {} }}\n", g.gpus));
            if let Some(b) = g.borrow_limit {
                out.push_str(&format!("borrow_limit = {b}\n"));
            }
            if let Some(l) = g.lend_limit {
                out.push_str(&format!("lend_limit = {l}\n"));
            }
        }
    }
    out
}

/// The accounts to put: an existing one keeps its users, QoS and shares, and takes only the
/// file's parent and guarantee.
fn merged(current: &pb::Policy, imported: Vec<pb::Account>) -> Vec<pb::Account> {
    imported
        .into_iter()
        .map(|new| match current.accounts.iter().find(|a| a.name == new.name) {
            Some(old) => pb::Account { parent: new.parent, guarantee: new.guarantee, ..old.clone() },
            None => new,
        })
        .collect()
}

/// Checks the policy after each put in turn, as the controllers will: a file that cannot be
/// applied whole is refused before anything is sent.
fn check_steps(current: &pb::Policy, puts: &[pb::Account]) -> anyhow::Result<()> {
    let mut policy = current.clone();
    for a in puts {
        match policy.accounts.iter_mut().find(|x| x.name == a.name) {
            Some(x) => *x = a.clone(),
            None => policy.accounts.push(a.clone()),
        }
        let checked = kairos_convert::policy::policy_from_pb(policy.clone()).map_err(|e| {
            anyhow::anyhow!("importing account \"{}\": {} (nothing applied)", a.name, e.message())
        })?;
        checked
            .validate()
            .map_err(|e| anyhow::anyhow!("importing account \"{}\": {e} (nothing applied)", a.name))?;
    }
    Ok(())
}

/// `kairos policy import FILE [--dry-run]`.
pub async fn import(client: &Client, file: &Path, dry_run: bool) -> anyhow::Result<i32> {
    let size = std::fs::metadata(file).map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?.len();
    let max = crate::manifest::MANIFEST_BYTES_MAX;
    if size > max {
        anyhow::bail!("{}: {size} bytes, past the {max} a Kueue file may have", file.display());
    }
    let yaml =
        std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("reading {}: {e}", file.display()))?;
    let (accounts, notes) =
        accounts_from_kueue(&yaml).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    if dry_run {
        print!("{}", toml_fragment(&accounts, &notes));
        return Ok(0);
    }
    let current = crate::client::get_policy(client).await?;
    let puts = merged(&current, accounts);
    check_steps(&current, &puts)?;
    for n in &notes {
        println!("note: {n}");
    }
    for a in puts {
        let line = format!("account \"{}\": {}", a.name, summary(&a));
        let req = pb::PutAccountRequest { account: Some(a), mode: pb::PutMode::Upsert as i32 };
        client.admin(req, |mut c, r| async move { c.put_account(r).await }).await?;
        println!("{line}");
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two teams' queues in a cohort with a pool of its own, as a Kueue cluster has them.
    const REALISTIC: &str = r#"
apiVersion: kueue.x-k8s.io/v1beta1
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
        nominalQuota: 4
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata:
  name: team-a
  labels:
    team: a
spec:
  namespaceSelector: {}
  cohort: cohort-ml
  queueingStrategy: BestEffortFIFO
  preemption:
    reclaimWithinCohort: Any
    withinClusterQueue: LowerPriority
  resourceGroups:
  - coveredResources: ["cpu", "memory", "nvidia.com/gpu"]
    flavors:
    - name: default
      resources:
      - name: cpu
        nominalQuota: 96
      - name: memory
        nominalQuota: 768Gi
      - name: nvidia.com/gpu
        nominalQuota: 8
        borrowingLimit: 4
        lendingLimit: "2"
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
    - name: h100
      resources:
      - name: cpu
        nominalQuota: "48"
      - name: memory
        nominalQuota: 384Gi
      - name: nvidia.com/gpu
        nominalQuota: "4"
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: LocalQueue
metadata:
  namespace: team-a
  name: team-a-queue
spec:
  clusterQueue: team-a
"#;

    /// An account's name, parent and guarantee (GPUs, borrow limit, lend limit).
    type Shape<'a> = (&'a str, &'a str, Option<(u32, Option<u32>, Option<u32>)>);

    fn shape(a: &pb::Account) -> Shape<'_> {
        let g = a.guarantee.as_ref().map(|g| (g.gpus, g.borrow_limit, g.lend_limit));
        (a.name.as_str(), a.parent.as_str(), g)
    }

    #[test]
    fn a_cohort_and_two_queues_become_accounts_with_their_gpu_guarantees() {
        let (accounts, notes) = accounts_from_kueue(REALISTIC).expect("a valid file");
        let got: Vec<_> = accounts.iter().map(shape).collect();
        assert_eq!(
            got,
            vec![
                // Its own 4 and its members' 8 + 4: a kairos guarantee covers its children.
                ("cohort-ml", "root", Some((16, None, None))),
                ("team-a", "cohort-ml", Some((8, Some(4), Some(2)))),
                ("team-b", "cohort-ml", Some((4, None, None))),
            ]
        );
        assert!(accounts.iter().all(|a| a.shares == 1 && a.users.is_empty()));
        let all = notes.join("\n");
        for expected in [
            "ClusterQueue \"team-a\": cpu, memory quota ignored",
            "ClusterQueue \"team-b\": flavor \"h100\" taken as any GPU model",
            "ClusterQueue \"team-a\": queueingStrategy not taken",
            "reclaimWithinCohort not taken",
            "withinClusterQueue not taken",
            "LocalQueue \"team-a-queue\" skipped",
            "Cohort \"cohort-ml\": guaranteed 16 GPUs, its members' 12 with its own 4",
        ] {
            assert!(all.contains(expected), "{expected:?} not in {all}");
        }
    }

    #[test]
    fn a_named_cohort_without_an_object_and_a_queue_without_one_go_under_root() {
        let yaml = r#"
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: q1}
spec:
  cohortName: pool
  resourceGroups:
  - flavors:
    - name: default
      resources:
      - {name: amd.com/gpu, nominalQuota: 2, borrowingLimit: 1}
    - name: other
      resources:
      - {name: amd.com/gpu, nominalQuota: 3}
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: ClusterQueue
metadata: {name: solo}
spec:
  resourceGroups:
  - flavors:
    - name: default
      resources:
      - {name: cpu, nominalQuota: 4}
"#;
        let (accounts, notes) = accounts_from_kueue(yaml).expect("a valid file");
        let got: Vec<_> = accounts.iter().map(shape).collect();
        // A flavor without a borrowing limit makes it unlimited; lending limits absent: all.
        assert_eq!(
            got,
            vec![
                ("pool", "root", Some((5, None, None))),
                ("solo", "root", None),
                ("q1", "pool", Some((5, None, None)))
            ]
        );
        assert!(notes.iter().any(|n| n.contains("cohort \"pool\" has no Cohort object")), "{notes:?}");
        let toml = toml_fragment(&accounts, &notes);
        assert!(toml.contains("[accounts.q1]\nparent = \"pool\"\nguaranteed = { gpus = 5 }\n"), "{toml}");
        assert!(toml.contains("[accounts.solo]\nparent = \"root\"\n"), "{toml}");
    }

    #[test]
    fn the_dry_run_fragment_is_a_policy_file_with_the_limits() {
        let (accounts, notes) = accounts_from_kueue(REALISTIC).unwrap();
        let toml = toml_fragment(&accounts, &notes);
        let parsed = crate::policy_file::PolicyFile::parse(&toml).expect("the policy file's format");
        let a = &parsed.accounts["team-a"];
        assert_eq!(a.parent.as_deref(), Some("cohort-ml"));
        assert_eq!(
            (a.guaranteed.as_ref().map(|g| g.gpus), a.borrow_limit, a.lend_limit),
            (Some(8), Some(4), Some(2))
        );
        assert_eq!(summary(&accounts[1]), "parent cohort-ml, guaranteed 8 GPUs, borrow ≤ 4, lend ≤ 2");
        assert_eq!(summary(&accounts[2]), "parent cohort-ml, guaranteed 4 GPUs, borrow unlimited, lend all");
    }

    #[test]
    fn fields_kairos_cannot_honour_are_refused_by_name() {
        let with = |extra: &str| {
            format!(
                "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ClusterQueue\nmetadata:\n  name: team-a\nspec:\n  cohort: ml\n{extra}"
            )
        };
        for (extra, refused) in [
            ("  fairSharing:\n    weight: 2\n", "spec.fairSharing is not supported"),
            ("  admissionChecks: [prov]\n", "spec.admissionChecks is not supported"),
            ("  stopPolicy: Hold\n", "spec.stopPolicy is not supported"),
            (
                "  preemption:\n    borrowWithinCohort:\n      policy: Never\n",
                "spec.preemption.borrowWithinCohort is not supported",
            ),
            ("  namespaceSelector:\n    matchLabels: {team: a}\n", "spec.namespaceSelector is not supported"),
            ("  flavorFungibility: {whenCanBorrow: Borrow}\n", "spec.flavorFungibility is not supported"),
        ] {
            let err = accounts_from_kueue(&with(extra)).expect_err(refused);
            assert!(err.starts_with("kueue: ClusterQueue \"team-a\": "), "{err}");
            assert!(err.contains(refused), "{err} lacks {refused}");
            assert!(!err.contains('\n'), "one line: {err}");
        }
        assert_eq!(
            accounts_from_kueue(&with("  fairSharing: {weight: 2}\n")).unwrap_err(),
            "kueue: ClusterQueue \"team-a\": spec.fairSharing is not supported"
        );
    }

    #[test]
    fn a_fractional_quantity_and_a_resource_kairos_cannot_guarantee_are_refused() {
        let queue = |resource: &str, quota: &str| {
            format!(
                "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ClusterQueue\nmetadata: {{name: team-a}}\nspec:\n  resourceGroups:\n  - flavors:\n    - name: default\n      resources:\n      - {{name: {resource}, nominalQuota: {quota}}}\n"
            )
        };
        let err = accounts_from_kueue(&queue("nvidia.com/gpu", "\"500m\"")).unwrap_err();
        assert_eq!(
            err,
            "kueue: ClusterQueue \"team-a\": spec.resourceGroups[0].flavors[0].resources[0].nominalQuota \"500m\" is not a whole number of GPUs"
        );
        assert!(accounts_from_kueue(&queue("nvidia.com/gpu", "1.5")).unwrap_err().contains("1.5"));
        assert!(accounts_from_kueue(&queue("nvidia.com/gpu", "-1")).is_err());
        let err = accounts_from_kueue(&queue("nvidia.com/mig-1g.5gb", "7")).unwrap_err();
        assert!(err.contains("\"nvidia.com/mig-1g.5gb\" is not supported"), "{err}");
        let lend = queue("nvidia.com/gpu", "2, lendingLimit: 3");
        assert!(accounts_from_kueue(&lend).unwrap_err().contains("lendingLimit 3 is more than"));
    }

    #[test]
    fn an_unknown_kind_a_dotted_name_and_a_cycle_are_refused() {
        let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n";
        let err = accounts_from_kueue(deployment).unwrap_err();
        assert_eq!(
            err,
            "kueue: document 1: apps/v1 Deployment is not a Kueue ClusterQueue or Cohort (kind refused)"
        );
        let dotted = "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ClusterQueue\nmetadata: {name: team.a}\n";
        let err = accounts_from_kueue(dotted).unwrap_err();
        assert!(err.starts_with("kueue: ClusterQueue \"team.a\": metadata.name \"team.a\""), "{err}");
        assert!(err.contains("may not"), "{err}");
        let cohort = "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ClusterQueue\nmetadata: {name: q}\nspec: {cohort: ml.x}\n";
        assert!(accounts_from_kueue(cohort).unwrap_err().contains("cohort \"ml.x\""));
        let cycle = "apiVersion: kueue.x-k8s.io/v1alpha1\nkind: Cohort\nmetadata: {name: a}\nspec: {parent: b}\n---\napiVersion: kueue.x-k8s.io/v1alpha1\nkind: Cohort\nmetadata: {name: b}\nspec: {parentName: a}\n";
        assert!(accounts_from_kueue(cycle).unwrap_err().contains("cycle"));
        let only_flavors =
            "apiVersion: kueue.x-k8s.io/v1beta1\nkind: ResourceFlavor\nmetadata: {name: default}\n";
        assert!(accounts_from_kueue(only_flavors).unwrap_err().contains("no ClusterQueue or Cohort"));
    }

    #[test]
    fn a_kubectl_list_is_read_item_by_item() {
        let yaml = "apiVersion: v1\nkind: List\nitems:\n- apiVersion: kueue.x-k8s.io/v1beta1\n  kind: ClusterQueue\n  metadata: {name: q, uid: abc, resourceVersion: \"7\"}\n  spec: {cohort: ml}\n  status: {pendingWorkloads: 0}\n";
        let (accounts, _) = accounts_from_kueue(yaml).unwrap();
        assert_eq!(
            accounts.iter().map(shape).collect::<Vec<_>>(),
            vec![("ml", "root", None), ("q", "ml", None)]
        );
    }

    #[test]
    fn an_existing_account_keeps_its_users_qos_and_shares() {
        let old = pb::Account {
            name: "team-a".into(),
            parent: "root".into(),
            shares: 3,
            users: vec!["alice".into()],
            allowed_qos: vec!["training".into()],
            ..Default::default()
        };
        let current = pb::Policy { accounts: vec![old], ..Default::default() };
        let (accounts, _) = accounts_from_kueue(REALISTIC).unwrap();
        let puts = merged(&current, accounts);
        let a = puts.iter().find(|a| a.name == "team-a").unwrap();
        assert_eq!((a.shares, a.users.as_slice(), a.allowed_qos.len()), (3, &["alice".to_string()][..], 1));
        assert_eq!((a.parent.as_str(), a.guarantee.as_ref().map(|g| g.gpus)), ("cohort-ml", Some(8)));
    }
}
