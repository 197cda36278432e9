//! Conversions between the scheduling core's policy types and `kairos.v1` messages:
//! one mapping for the controller (`kairos policy apply`) and the CLI (`kairos sim
//! --policy`, which reads the same file).

use std::collections::BTreeMap;

use kairos_proto::v1 as pb;
use kairos_scheduler::policy::{
    Account, Guarantee, IdleAction, IdleGpu, Partition, Policy, PreemptMode, Qos, QosAccess,
};
use kairos_scheduler::priority::PriorityWeights;
use kairos_scheduler::Profile;
use tonic::Status;

fn mode_from_pb(mode: i32, qos: &str) -> Result<PreemptMode, Status> {
    match pb::PreemptMode::try_from(mode) {
        Ok(pb::PreemptMode::Unspecified) | Ok(pb::PreemptMode::Off) => Ok(PreemptMode::Off),
        Ok(pb::PreemptMode::Cancel) => Ok(PreemptMode::Cancel),
        Ok(pb::PreemptMode::Requeue) => Ok(PreemptMode::Requeue),
        Ok(pb::PreemptMode::Suspend) => Ok(PreemptMode::Suspend),
        Err(_) => Err(Status::invalid_argument(format!("qos \"{qos}\": unknown preempt_mode {mode}"))),
    }
}

fn mode_to_pb(mode: PreemptMode) -> pb::PreemptMode {
    match mode {
        PreemptMode::Off => pb::PreemptMode::Off,
        PreemptMode::Cancel => pb::PreemptMode::Cancel,
        PreemptMode::Requeue => pb::PreemptMode::Requeue,
        PreemptMode::Suspend => pb::PreemptMode::Suspend,
    }
}

/// An idle GPU rule from the API (`what` names its owner in the error).
pub fn idle_gpu_from_pb(r: Option<pb::IdleGpu>, what: &str) -> Result<Option<IdleGpu>, Status> {
    let Some(r) = r else { return Ok(None) };
    let action = IdleAction::parse(&r.action).ok_or_else(|| {
        Status::invalid_argument(format!(
            "{what}: idle_gpu action \"{}\" is not notify, requeue or cancel",
            r.action.chars().take(32).collect::<String>()
        ))
    })?;
    Ok(Some(IdleGpu { after_s: r.after_s, below_milli: r.below_milli, action }))
}

pub fn idle_gpu_to_pb(r: &Option<IdleGpu>) -> Option<pb::IdleGpu> {
    r.map(|r| pb::IdleGpu {
        after_s: r.after_s,
        below_milli: r.below_milli,
        action: r.action.as_str().into(),
    })
}

pub fn qos_from_pb(q: pb::Qos) -> Result<Qos, Status> {
    let preempt_mode = mode_from_pb(q.preempt_mode, &q.name)?;
    let idle_gpu = idle_gpu_from_pb(q.idle_gpu, &format!("qos \"{}\"", q.name))?;
    Ok(Qos {
        idle_gpu,
        preempt: q.preempt.into_iter().collect(),
        preempt_mode,
        priority: q.priority,
        grace_s: q.grace_s,
        preempt_exempt_s: q.preempt_exempt_s,
        max_wall_s: q.max_wall_s,
        grp_gpus: q.grp_gpus,
        user_gpus: q.user_gpus,
        user_jobs: q.user_jobs,
        burstable: q.burstable,
        headroom_gpus: q.headroom_gpus,
        resources: resources_from_pb(q.resources),
        gpu_sharing: q.gpu_sharing,
        name: q.name,
    })
}

fn resources_from_pb(r: Option<pb::ResourceDefaults>) -> kairos_scheduler::policy::ResourceDefaults {
    let r = r.unwrap_or_default();
    kairos_scheduler::policy::ResourceDefaults {
        def_cpus_per_gpu: r.def_cpus_per_gpu,
        def_mem_per_gpu_mib: r.def_mem_per_gpu_mib,
        max_cpus_per_node: r.max_cpus_per_node,
        max_mem_per_node_mib: r.max_mem_per_node_mib,
    }
}

fn resources_to_pb(r: &kairos_scheduler::policy::ResourceDefaults) -> Option<pb::ResourceDefaults> {
    (!r.is_empty()).then_some(pb::ResourceDefaults {
        def_cpus_per_gpu: r.def_cpus_per_gpu,
        def_mem_per_gpu_mib: r.def_mem_per_gpu_mib,
        max_cpus_per_node: r.max_cpus_per_node,
        max_mem_per_node_mib: r.max_mem_per_node_mib,
    })
}

pub fn qos_to_pb(q: &Qos) -> pb::Qos {
    pb::Qos {
        name: q.name.clone(),
        priority: q.priority,
        preempt: q.preempt.iter().cloned().collect(),
        preempt_mode: mode_to_pb(q.preempt_mode) as i32,
        grace_s: q.grace_s,
        preempt_exempt_s: q.preempt_exempt_s,
        max_wall_s: q.max_wall_s,
        grp_gpus: q.grp_gpus,
        user_gpus: q.user_gpus,
        user_jobs: q.user_jobs,
        burstable: q.burstable,
        headroom_gpus: q.headroom_gpus,
        resources: resources_to_pb(&q.resources),
        gpu_sharing: q.gpu_sharing,
        idle_gpu: idle_gpu_to_pb(&q.idle_gpu),
    }
}

fn profile_from_name(name: &str) -> Result<Profile, Status> {
    match name {
        "training" => Ok(Profile::Training),
        "inference" => Ok(Profile::Inference),
        "batch" => Ok(Profile::Batch),
        "interactive" => Ok(Profile::Interactive),
        other => Err(Status::invalid_argument(format!(
            "submit_rules: unknown profile \"{}\" (training, inference, batch, interactive)",
            other.chars().take(64).collect::<String>()
        ))),
    }
}

fn weights_from_pb(w: Option<pb::PriorityWeights>) -> PriorityWeights {
    match w {
        None => PriorityWeights::default(),
        Some(w) => PriorityWeights {
            qos: w.qos,
            age: w.age,
            fairshare: w.fairshare,
            job_size: w.job_size,
            partition: w.partition,
            age_max_s: w.age_max_s,
            fairshare_half_life_s: w.fairshare_half_life_s,
            billing: w
                .billing
                .map(|b| kairos_scheduler::policy::BillingWeights {
                    gpu_milli: b.gpu_milli,
                    cpu_milli: b.cpu_milli,
                    mem_gb_milli: b.mem_gb_milli,
                })
                .unwrap_or_default(),
        },
    }
}

pub fn weights_to_pb(w: &PriorityWeights) -> pb::PriorityWeights {
    pb::PriorityWeights {
        qos: w.qos,
        age: w.age,
        fairshare: w.fairshare,
        job_size: w.job_size,
        partition: w.partition,
        age_max_s: w.age_max_s,
        fairshare_half_life_s: w.fairshare_half_life_s,
        billing: Some(pb::BillingWeights {
            gpu_milli: w.billing.gpu_milli,
            cpu_milli: w.billing.cpu_milli,
            mem_gb_milli: w.billing.mem_gb_milli,
        }),
    }
}

pub fn account_from_pb(a: pb::Account) -> Account {
    let access = |allowed: Vec<String>, default: String| QosAccess {
        allowed: allowed.into_iter().collect(),
        default: (!default.is_empty()).then_some(default),
    };
    Account {
        parent: (!a.parent.is_empty()).then_some(a.parent),
        shares: a.shares,
        users: a.users.into_iter().collect(),
        name: a.name,
        qos: access(a.allowed_qos, a.default_qos),
        user_qos: a.user_qos.into_iter().map(|u| (u.user, access(u.allowed_qos, u.default_qos))).collect(),
        guarantee: a.guarantee.map(|g| Guarantee {
            gpus: g.gpus,
            borrow_limit: g.borrow_limit,
            lend_limit: g.lend_limit,
        }),
    }
}

pub fn account_to_pb(a: &Account) -> pb::Account {
    pb::Account {
        name: a.name.clone(),
        parent: a.parent.clone().unwrap_or_default(),
        shares: a.shares,
        users: a.users.iter().cloned().collect(),
        allowed_qos: a.qos.allowed.iter().cloned().collect(),
        default_qos: a.qos.default.clone().unwrap_or_default(),
        user_qos: a
            .user_qos
            .iter()
            .map(|(user, q)| pb::UserQos {
                user: user.clone(),
                allowed_qos: q.allowed.iter().cloned().collect(),
                default_qos: q.default.clone().unwrap_or_default(),
            })
            .collect(),
        guarantee: a.guarantee.as_ref().map(|g| pb::Guarantee {
            gpus: g.gpus,
            borrow_limit: g.borrow_limit,
            lend_limit: g.lend_limit,
        }),
    }
}

pub fn partition_from_pb(part: pb::Partition) -> Result<Partition, Status> {
    let idle_gpu = idle_gpu_from_pb(part.idle_gpu, &format!("partition \"{}\"", part.name))?;
    Ok(Partition {
        idle_gpu,
        nodes: part.nodes.into_iter().collect(),
        selector: part.selector.into_iter().collect(),
        priority_tier: part.priority_tier,
        allowed_qos: part.allowed_qos.into_iter().collect(),
        default_qos: (!part.default_qos.is_empty()).then_some(part.default_qos),
        max_wall_s: part.max_wall_s,
        resources: resources_from_pb(part.resources),
        name: part.name,
    })
}

pub fn partition_to_pb(part: &Partition) -> pb::Partition {
    pb::Partition {
        name: part.name.clone(),
        nodes: part.nodes.iter().cloned().collect(),
        selector: part.selector.clone().into_iter().collect(),
        priority_tier: part.priority_tier,
        allowed_qos: part.allowed_qos.iter().cloned().collect(),
        default_qos: part.default_qos.clone().unwrap_or_default(),
        max_wall_s: part.max_wall_s,
        resources: resources_to_pb(&part.resources),
        idle_gpu: idle_gpu_to_pb(&part.idle_gpu),
    }
}

pub fn policy_from_pb(p: pb::Policy) -> Result<Policy, Status> {
    let mut qos = BTreeMap::new();
    for q in p.qos {
        let q = qos_from_pb(q)?;
        if qos.insert(q.name.clone(), q).is_some() {
            return Err(Status::invalid_argument("qos: a name appears twice"));
        }
    }
    let mut profile_qos = BTreeMap::new();
    for (profile, q) in p.submit_rules {
        profile_qos.insert(profile_from_name(&profile)?, q);
    }
    let mut accounts = BTreeMap::new();
    for a in p.accounts {
        let account = account_from_pb(a);
        if accounts.insert(account.name.clone(), account).is_some() {
            return Err(Status::invalid_argument("accounts: a name appears twice"));
        }
    }
    if accounts.is_empty() {
        accounts = kairos_scheduler::policy::default_accounts_for(&qos, &profile_qos);
    }
    let mut partitions = BTreeMap::new();
    for part in p.partitions {
        let partition = partition_from_pb(part)?;
        if partitions.insert(partition.name.clone(), partition).is_some() {
            return Err(Status::invalid_argument("partitions: a name appears twice"));
        }
    }
    let defaults = Policy::default();
    if partitions.is_empty() {
        partitions = defaults.partitions;
    }
    let default_partition =
        if p.default_partition.is_empty() { defaults.default_partition } else { p.default_partition };
    Ok(Policy {
        qos,
        profile_qos,
        accounts,
        weights: weights_from_pb(p.weights),
        partitions,
        default_partition,
        priority_classes: p.priority_classes.into_iter().collect(),
    })
}

pub fn policy_to_pb(p: &Policy) -> pb::Policy {
    pb::Policy {
        qos: p.qos.values().map(qos_to_pb).collect(),
        submit_rules: p.profile_qos.iter().map(|(k, v)| (k.as_str().to_string(), v.clone())).collect(),
        accounts: p.accounts.values().map(account_to_pb).collect(),
        weights: Some(weights_to_pb(&p.weights)),
        partitions: p.partitions.values().map(partition_to_pb).collect(),
        default_partition: p.default_partition.clone(),
        priority_classes: p.priority_classes.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        what_if_hash: String::new(),
    }
}
