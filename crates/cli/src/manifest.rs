//! `kairos submit -f FILE.yaml`: Kubernetes manifests as kairos jobs, for users who come from
//! Kubernetes, Kueue or Volcano.
//!
//! A file holds one or more documents: `batch/v1` Jobs and `v1` Pods (one container each), and
//! Volcano `PodGroup`s. What maps:
//! - the container's `image` (run with `--container-image`), `command` + `args`, `env`
//!   (`name`/`value`), `workingDir`;
//! - `resources.limits["nvidia.com/gpu"]`, `cpu` and `memory` (limits, else requests);
//! - `priorityClassName` → a QoS through the policy's `[priority_classes]`;
//! - Kueue's `kueue.x-k8s.io/queue-name` → the partition of that name, else the QoS;
//! - a pod group — Kueue's `kueue.x-k8s.io/pod-group-name` with
//!   `kueue.x-k8s.io/pod-group-total-count`, or Volcano's `scheduling.k8s.io/group-name` with a
//!   `PodGroup`'s `minMember` — → one gang job of that many tasks (all start or none), its pods
//!   alike;
//! - Kueue's `kueue.x-k8s.io/podset-required-topology` / `podset-preferred-topology` (a node
//!   label, e.g. `rack`) → `--topology LEVEL=required|preferred`;
//! - a Job's `completions` → an array of that many tasks, `parallelism` → at most that many at
//!   once, `activeDeadlineSeconds` → the time limit.
//!
//! Anything else is refused, naming every such field, and nothing is submitted.

use std::collections::BTreeMap;

use kairos_proto::v1 as pb;
use serde::Deserialize;
use serde_yaml_ng::Value;

const QUEUE_NAME: &str = "kueue.x-k8s.io/queue-name";
const KUEUE_GROUP: &str = "kueue.x-k8s.io/pod-group-name";
const KUEUE_TOTAL: &str = "kueue.x-k8s.io/pod-group-total-count";
const VOLCANO_GROUP: &str = "scheduling.k8s.io/group-name";
const KUEUE_REQUIRED_TOPOLOGY: &str = "kueue.x-k8s.io/podset-required-topology";
const KUEUE_PREFERRED_TOPOLOGY: &str = "kueue.x-k8s.io/podset-preferred-topology";

/// The fields kairos reads at each place of a manifest (any other is refused).
const JOB_KEYS: &[&str] = &["apiVersion", "kind", "metadata", "spec", "status"];
const META_KEYS: &[&str] = &["name", "generateName", "namespace", "labels", "annotations"];
const JOB_SPEC_KEYS: &[&str] =
    &["template", "parallelism", "completions", "completionMode", "backoffLimit", "activeDeadlineSeconds"];
const TEMPLATE_KEYS: &[&str] = &["metadata", "spec"];
const POD_SPEC_KEYS: &[&str] =
    &["containers", "restartPolicy", "priorityClassName", "terminationGracePeriodSeconds", "schedulerName"];
const CONTAINER_KEYS: &[&str] =
    &["name", "image", "command", "args", "env", "workingDir", "resources", "imagePullPolicy"];
const RESOURCE_KEYS: &[&str] = &["limits", "requests"];
const QUANTITY_KEYS: &[&str] = &["nvidia.com/gpu", "cpu", "memory"];
const ENV_KEYS: &[&str] = &["name", "value"];
const GROUP_KEYS: &[&str] = &["apiVersion", "kind", "metadata", "spec"];
const GROUP_SPEC_KEYS: &[&str] = &["minMember", "queue", "priorityClassName"];

/// Fields kairos does not take, by path, collected across the whole file.
#[derive(Default)]
struct Refusals(Vec<String>);

impl Refusals {
    /// Notes every key of mapping `v` at `path` that is not in `allowed`.
    fn keys(&mut self, v: &Value, path: &str, allowed: &[&str]) {
        if let Value::Mapping(m) = v {
            for k in m.keys() {
                let k = k.as_str().unwrap_or("?");
                if !allowed.contains(&k) {
                    self.0.push(format!("{path}.{k}"));
                }
            }
        }
    }
}

fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.get(key).unwrap_or(&Value::Null)
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A label or annotation of `meta`.
fn tag(meta: &Value, key: &str) -> Option<String> {
    text(get(get(meta, "labels"), key)).or_else(|| text(get(get(meta, "annotations"), key)))
}

/// A Kubernetes CPU quantity ("2", "500m") as whole CPUs, rounded up.
fn cpus(q: &str) -> Result<u32, String> {
    let milli = match q.strip_suffix('m') {
        Some(m) => m.parse::<u64>().map_err(|_| format!("cpu \"{q}\" is not a quantity"))?,
        None => {
            (q.parse::<f64>().map_err(|_| format!("cpu \"{q}\" is not a quantity"))? * 1000.0).ceil() as u64
        }
    };
    u32::try_from(milli.div_ceil(1000)).map_err(|_| format!("cpu \"{q}\" is too large"))
}

/// A Kubernetes memory quantity ("512Mi", "16Gi", "1G", "1000000") in MiB, rounded up.
fn mem_mib(q: &str) -> Result<u64, String> {
    let units: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    let (number, scale) =
        units.iter().find_map(|(u, s)| q.strip_suffix(u).map(|n| (n, *s))).unwrap_or((q, 1));
    let n: u64 = number.parse().map_err(|_| format!("memory \"{q}\" is not a quantity"))?;
    Ok(n.saturating_mul(scale).div_ceil(1 << 20))
}

/// One pod's worth of a job: what it runs and with what.
#[derive(Clone, Debug, PartialEq)]
struct Pod {
    name: String,
    spec: pb::JobSpec,
    /// Its pod group and the group's size, if it is in one.
    group: Option<(String, Option<u32>)>,
}

/// The largest manifest file taken (Kubernetes' own object limit is about 1.5 MiB).
pub const MANIFEST_BYTES_MAX: u64 = 4 << 20;
/// The deepest nesting a manifest may have (a Job's own is under 12 levels).
const NESTING_MAX: usize = 64;

/// Refuses, before any parsing, a manifest nested deeper than `NESTING_MAX`: by indentation,
/// by sequence dashes at a line's start, or by flow brackets (a YAML parser's time and stack
/// grow with the depth).
fn shallow_enough(yaml: &str) -> Result<(), String> {
    let too_deep = || format!("the manifest is nested deeper than {NESTING_MAX} levels");
    let mut flow = 0usize;
    for line in yaml.lines() {
        let rest = line.trim_start_matches([' ', '\t']);
        let indent = line.len() - rest.len();
        let dashes = rest.split_inclusive(['-']).take_while(|p| *p == "-" || p.trim() == "-").count();
        if indent / 2 + dashes > NESTING_MAX {
            return Err(too_deep());
        }
        for b in rest.bytes() {
            match b {
                b'[' | b'{' => flow += 1,
                b']' | b'}' => flow = flow.saturating_sub(1),
                b'#' => break,
                _ => {}
            }
            if flow > NESTING_MAX {
                return Err(too_deep());
            }
        }
    }
    Ok(())
}

/// The jobs `text` (one or more YAML documents) asks for, with the cluster's `policy`.
pub fn specs(yaml: &str, policy: &pb::Policy) -> Result<Vec<pb::JobSpec>, String> {
    shallow_enough(yaml)?;
    let mut refusals = Refusals::default();
    let mut pods = Vec::new();
    let mut group_sizes: BTreeMap<String, u32> = BTreeMap::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(yaml).enumerate() {
        let v = Value::deserialize(doc).map_err(|e| format!("document {}: {e}", i + 1))?;
        if v.is_null() {
            continue;
        }
        let kind = text_of(&v, "kind");
        match (text_of(&v, "apiVersion").as_str(), kind.as_str()) {
            ("batch/v1", "Job") => pods.push(job(&v, policy, &mut refusals)?),
            ("v1", "Pod") => pods.push(pod(&v, &v, policy, &mut refusals, "Pod")?),
            (api, "PodGroup") if api.starts_with("scheduling.volcano.sh/") => {
                refusals.keys(&v, "PodGroup", GROUP_KEYS);
                refusals.keys(get(&v, "spec"), "PodGroup.spec", GROUP_SPEC_KEYS);
                let name = text_of(get(&v, "metadata"), "name");
                let min = get(get(&v, "spec"), "minMember")
                    .as_u64()
                    .ok_or("PodGroup.spec.minMember: a number is needed")?;
                group_sizes
                    .insert(name, u32::try_from(min).map_err(|_| "PodGroup.spec.minMember: too large")?);
            }
            (api, kind) => {
                return Err(format!(
                    "document {}: {api} {kind} is not a batch/v1 Job, a v1 Pod or a Volcano PodGroup",
                    i + 1
                ))
            }
        }
    }
    if !refusals.0.is_empty() {
        return Err(format!("not supported by kairos (nothing submitted): {}", refusals.0.join(", ")));
    }
    gangs(pods, &group_sizes)
}

fn text_of(v: &Value, key: &str) -> String {
    text(get(v, key)).unwrap_or_default()
}

/// A `batch/v1` Job: its template's pod, with completions, parallelism and a deadline.
fn job(v: &Value, policy: &pb::Policy, refusals: &mut Refusals) -> Result<Pod, String> {
    refusals.keys(v, "Job", JOB_KEYS);
    let spec = get(v, "spec");
    refusals.keys(spec, "Job.spec", JOB_SPEC_KEYS);
    let template = get(spec, "template");
    refusals.keys(template, "Job.spec.template", TEMPLATE_KEYS);
    let mut p = pod(v, template, policy, refusals, "Job.spec.template")?;
    let number = |k: &str| {
        get(spec, k)
            .as_u64()
            .map(|n| u32::try_from(n).map_err(|_| format!("Job.spec.{k}: too large")))
            .transpose()
    };
    let completions = number("completions")?.unwrap_or(1);
    if completions > crate::args::ARRAY_TASKS_MAX {
        return Err(format!(
            "Job.spec.completions: at most {} (kairos runs each completion as an array task)",
            crate::args::ARRAY_TASKS_MAX
        ));
    }
    let parallelism = number("parallelism")?;
    if completions > 1 {
        p.spec.array_indices = (0..completions).collect();
        p.spec.array_max_running = parallelism.filter(|n| *n < completions).unwrap_or(0);
    } else if parallelism.is_some_and(|n| n > 1) {
        return Err(
            "Job.spec.parallelism above 1 needs completions (kairos runs each completion as an array task)"
                .into(),
        );
    }
    if let Some(s) = get(spec, "activeDeadlineSeconds").as_u64() {
        p.spec.time_limit_s = s;
    }
    // A failed task (pod) is started again up to backoffLimit times; absent, none is (kairos
    // does not take Kubernetes' default of 6 unasked).
    if let Some(limit) = number("backoffLimit")? {
        if limit > kairos_scheduler::validate::RETRIES_MAX {
            return Err(format!(
                "Job.spec.backoffLimit: at most {}",
                kairos_scheduler::validate::RETRIES_MAX
            ));
        }
        p.spec.retries = limit;
    }
    // Every array task has JOB_COMPLETION_INDEX (its index), as an Indexed Job's pods have.
    match text(get(spec, "completionMode")).as_deref() {
        None | Some("Indexed" | "NonIndexed") => {}
        Some(other) => return Err(format!("Job.spec.completionMode \"{other}\": Indexed or NonIndexed")),
    }
    Ok(p)
}

/// The pod of `object` (a Pod, or a Job whose template is `template`).
fn pod(
    object: &Value,
    template: &Value,
    policy: &pb::Policy,
    refusals: &mut Refusals,
    at: &str,
) -> Result<Pod, String> {
    if at == "Pod" {
        refusals.keys(object, "Pod", JOB_KEYS);
    }
    let meta = get(object, "metadata");
    refusals.keys(meta, &format!("{}.metadata", if at == "Pod" { "Pod" } else { "Job" }), META_KEYS);
    let tmeta = get(template, "metadata");
    if at != "Pod" {
        refusals.keys(tmeta, &format!("{at}.metadata"), META_KEYS);
    }
    let spec = get(template, "spec");
    let sp = format!("{at}.spec");
    refusals.keys(spec, &sp, POD_SPEC_KEYS);
    let containers = get(spec, "containers").as_sequence().cloned().unwrap_or_default();
    let [c] = containers.as_slice() else {
        return Err(format!("{sp}.containers: exactly one container (kairos runs one command per job)"));
    };
    // kairos is the scheduler: a manifest that names another is not for it.
    if let Some(other) =
        text(get(spec, "schedulerName")).filter(|s| s != "kairos" && s != "default-scheduler")
    {
        refusals.0.push(format!("{sp}.schedulerName ({other}: kairos schedules it)"));
    }
    let cp = format!("{sp}.containers[0]");
    refusals.keys(c, &cp, CONTAINER_KEYS);
    let name = text_of(meta, "name");
    let mut job = container(c, &cp, refusals)?;
    job.name = if name.is_empty() { text_of(meta, "generateName") } else { name.clone() };
    let tagged = |k: &str| tag(meta, k).or_else(|| tag(tmeta, k));
    if let Some(class) = text(get(spec, "priorityClassName")) {
        job.qos = policy.priority_classes.get(&class).cloned().ok_or_else(|| {
            format!("{sp}.priorityClassName \"{class}\" is mapped to no QoS ([priority_classes] in `kairos policy export`)")
        })?;
    }
    if let Some(queue) = tagged(QUEUE_NAME) {
        if policy.partitions.iter().any(|p| p.name == queue) {
            job.partition = queue;
        } else if policy.qos.iter().any(|q| q.name == queue) {
            job.qos = queue;
        } else {
            return Err(format!("{QUEUE_NAME} \"{queue}\" is neither a partition nor a QoS"));
        }
    }
    if let Some(grace) = get(spec, "terminationGracePeriodSeconds").as_u64() {
        job.checkpoint = Some(pb::CheckpointSpec {
            grace_s: u32::try_from(grace).unwrap_or(u32::MAX),
            ..Default::default()
        });
    }
    if let Some(res) = job.resources.as_mut() {
        res.topology = topology_of(tagged(KUEUE_REQUIRED_TOPOLOGY), tagged(KUEUE_PREFERRED_TOPOLOGY));
    }
    let group = match (tagged(KUEUE_GROUP), tagged(VOLCANO_GROUP)) {
        (Some(g), _) => {
            let total = tagged(KUEUE_TOTAL).ok_or(format!("{KUEUE_GROUP} needs {KUEUE_TOTAL}"))?;
            Some((g, Some(total.parse().map_err(|_| format!("{KUEUE_TOTAL} \"{total}\" is not a number"))?)))
        }
        (None, Some(g)) => Some((g, None)),
        (None, None) => None,
    };
    Ok(Pod { name, spec: job, group })
}

/// Kueue's pod-set topology annotations (a node label's key) as the job's ask: required first.
fn topology_of(required: Option<String>, preferred: Option<String>) -> Option<pb::TopologyRequest> {
    let (level, required) = match (required, preferred) {
        (Some(level), _) => (level, true),
        (None, Some(level)) => (level, false),
        (None, None) => return None,
    };
    Some(pb::TopologyRequest { level, required, max_domains: 1, relax_after_s: 0 })
}

/// A container as a job spec (command, environment, image, resources).
fn container(c: &Value, at: &str, refusals: &mut Refusals) -> Result<pb::JobSpec, String> {
    let image = text_of(c, "image");
    if image.is_empty() {
        return Err(format!("{at}.image is needed"));
    }
    let strings = |k: &str| -> Vec<String> {
        get(c, k).as_sequence().map(|s| s.iter().filter_map(text).collect()).unwrap_or_default()
    };
    let mut argv = strings("command");
    if argv.is_empty() {
        return Err(format!("{at}.command is needed (kairos does not read the image's entrypoint)"));
    }
    argv.extend(strings("args"));
    let mut env = BTreeMap::new();
    for (i, e) in get(c, "env").as_sequence().cloned().unwrap_or_default().iter().enumerate() {
        refusals.keys(e, &format!("{at}.env[{i}]"), ENV_KEYS);
        env.insert(text_of(e, "name"), text_of(e, "value"));
    }
    let res = get(c, "resources");
    refusals.keys(res, &format!("{at}.resources"), RESOURCE_KEYS);
    for k in RESOURCE_KEYS {
        refusals.keys(get(res, k), &format!("{at}.resources.{k}"), QUANTITY_KEYS);
    }
    let quantity = |k: &str| text(get(get(res, "limits"), k)).or_else(|| text(get(get(res, "requests"), k)));
    let gpus = quantity("nvidia.com/gpu")
        .map(|g| g.parse::<u32>().map_err(|_| format!("{at}: nvidia.com/gpu \"{g}\" is not a whole number")))
        .transpose()?
        .unwrap_or(0);
    Ok(pb::JobSpec {
        argv,
        env: env.into_iter().collect(),
        resources: Some(pb::Resources {
            gpus,
            tasks: 1,
            cpus: quantity("cpu").map(|q| cpus(&q)).transpose()?.unwrap_or(0),
            memory_mib: quantity("memory").map(|q| mem_mib(&q)).transpose()?.unwrap_or(0),
            ..Default::default()
        }),
        container: Some(pb::ContainerSpec { image, mounts: Vec::new(), workdir: text_of(c, "workingDir") }),
        ..Default::default()
    })
}

/// Pods of one group become one gang job of the group's size; the others stay single jobs.
fn gangs(pods: Vec<Pod>, sizes: &BTreeMap<String, u32>) -> Result<Vec<pb::JobSpec>, String> {
    let mut out = Vec::new();
    let mut groups: BTreeMap<String, (Vec<Pod>, Option<u32>)> = BTreeMap::new();
    for p in pods {
        match p.group.clone() {
            None => out.push(p.spec),
            Some((g, total)) => {
                let entry = groups.entry(g.clone()).or_default();
                entry.1 = total.or(entry.1).or_else(|| sizes.get(&g).copied());
                entry.0.push(p);
            }
        }
    }
    for (name, (members, total)) in groups {
        let total = total.ok_or(format!(
            "pod group \"{name}\": its size is not given (a PodGroup's minMember, or {KUEUE_TOTAL})"
        ))?;
        if members.len() as u32 != total {
            return Err(format!(
                "pod group \"{name}\" has {} pods in the file but a size of {total}",
                members.len()
            ));
        }
        let first = &members[0].spec;
        if let Some(other) = members.iter().find(|m| m.spec != *first && !same_but_name(&m.spec, first)) {
            return Err(format!(
                "pod group \"{name}\": pod \"{}\" differs from \"{}\" (a kairos gang runs one command on every node)",
                other.name, members[0].name
            ));
        }
        let mut gang = first.clone();
        gang.name = name;
        if let Some(r) = gang.resources.as_mut() {
            r.tasks = total;
        }
        out.push(gang);
    }
    Ok(out)
}

fn same_but_name(a: &pb::JobSpec, b: &pb::JobSpec) -> bool {
    pb::JobSpec { name: String::new(), ..a.clone() } == pb::JobSpec { name: String::new(), ..b.clone() }
}

#[cfg(test)]
#[path = "manifest_tests.rs"]
mod tests;
