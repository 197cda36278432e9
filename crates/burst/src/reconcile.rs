//! One round of the leader's burst reconciler: compares what the cluster recorded with what
//! the cloud reports (by tag) and returns the commands that bring them together. The caller
//! (kairosd's leader) proposes them through Raft; nothing here writes state directly.
//!
//! ```text
//!   decide(state)            ──▶ BurstLaunch (intents committed first) / BurstTerminate
//!   Requested, tag found     ──▶ BurstLaunched (adopt: a new leader never launches twice)
//!   Requested, not found     ──▶ RunInstances(ClientToken) ──▶ BurstLaunched | BurstLaunchFailed
//!   Launched, gone from cloud (after a grace) ──▶ BurstGone (its node goes down, jobs requeue)
//!   Terminating              ──▶ TerminateInstances until the cloud says terminated ──▶ BurstGone
//!   tagged, unknown, alive   ──▶ (after a grace) TerminateInstances   [leaks, duplicates]
//! ```

use std::collections::BTreeMap;

use kairos_scheduler::burst::{BurstInstance, BurstState, InstanceState};
use kairos_scheduler::Op;

use crate::decision::Decision;
use crate::provider::{Cloud, CloudError, CloudInstance, LaunchSpec};

/// Prefix of the decisions that say why burst holds back.
const HELD_BACK: &str = "held back: ";
/// Prefix of the decisions that report a cloud API error.
pub const CLOUD_ERROR: &str = "cloud error: ";

/// A launch failing this many times for other reasons than capacity is given up.
const LAUNCH_ATTEMPTS_MAX: u32 = 3;

/// What the reconciler needs to know that is not in the replicated state.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Value of the `kairos:cluster` tag of this cluster's instances.
    pub cluster: String,
    /// Controller addresses a burst node's agent connects to.
    pub controllers: Vec<String>,
    /// An unknown instance carrying this cluster's tag is terminated after this long.
    pub leak_grace_ms: i64,
    /// A launched instance missing from the cloud's answer this long is considered gone
    /// (the EC2 API is eventually consistent right after RunInstances).
    pub vanish_grace_ms: i64,
    /// The join token burst nodes' agents register with (written into the user-data).
    pub join_token: String,
}

/// The reconciler's memory between rounds (lost on failover, which only delays a leak's end).
#[derive(Debug, Default)]
pub struct Memory {
    /// Instance id → when an unknown tagged instance was first seen.
    leaks: BTreeMap<String, i64>,
    /// Intent → launch failures other than capacity.
    failures: BTreeMap<u64, u32>,
}

/// What one round did, for logs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub launched: Vec<(u64, String)>,
    pub adopted: Vec<(u64, String)>,
    pub terminated: Vec<String>,
    pub leaks: Vec<String>,
    pub errors: Vec<String>,
}

/// Where an instance reads its metadata (spot interruption notices), IMDSv2.
pub const IMDS_URL: &str = "http://169.254.169.254";

/// The agent's systemd unit (deploy/systemd/kairos-agent.service), installed by the user-data.
pub const AGENT_UNIT: &str = include_str!("../../../deploy/systemd/kairos-agent.service");
/// Where the user-data writes the agent's config file and unit.
pub const AGENT_CONFIG_PATH: &str = "/etc/kairos/kairos-agent.toml";
pub const AGENT_UNIT_PATH: &str = "/etc/systemd/system/kairos-agent.service";
/// The port a burst node's agent serves logs on (the burst security group opens it to the
/// controllers).
pub const AGENT_PORT: u16 = 7101;
/// The user-data line that starts the agent's config file (a here-document ending at `EOF`);
/// `$ip` in it is the instance's private address, read from IMDS at first boot.
pub const AGENT_CONFIG_LINE: &str = "cat > /etc/kairos/kairos-agent.toml <<EOF";

/// The boot script of intent `intent`'s instance (run once, at first boot): it writes the join
/// token, the agent's config — advertising the instance's private address, read from the
/// instance metadata service (IMDSv2) — and the agent's systemd unit, and starts the unit. The
/// unit starts the agent again after a reboot, so a rebooted burst node rejoins as the same
/// node (its credential is kept in its state directory).
pub fn user_data(settings: &Settings, intent: u64, spot: bool) -> String {
    let node = kairos_scheduler::burst::node_name(intent);
    let spot = if spot { format!("spot_imds = \"{IMDS_URL}\"\n") } else { String::new() };
    // Single-quoted for the shell; a quote inside is closed, escaped and reopened.
    let token = settings.join_token.replace('\'', r"'\''");
    format!(
        "#!/bin/sh\n\
         # kairos burst node: cluster {cluster}, intent {intent}\n\
         set -eu\n\
         umask 077\n\
         mkdir -p {dir}\n\
         {JOIN_TOKEN_LINE}'{token}' > {path}\n\
         imds_token=$(curl -sf -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' {IMDS_URL}/latest/api/token)\n\
         ip=$(curl -sf -H \"X-aws-ec2-metadata-token: $imds_token\" {IMDS_URL}/latest/meta-data/local-ipv4)\n\
         {AGENT_CONFIG_LINE}\n\
         controllers = \"{controllers}\"\n\
         name = \"{node}\"\n\
         label = [\"{label}={intent}\"]\n\
         join_token_file = \"{path}\"\n\
         addr = \"0.0.0.0:{AGENT_PORT}\"\n\
         advertise_addr = \"$ip:{AGENT_PORT}\"\n\
         state_dir = \"/var/lib/kairos-agent\"\n\
         {spot}\
         EOF\n\
         cat > {AGENT_UNIT_PATH} <<'EOF'\n\
         {AGENT_UNIT}\
         EOF\n\
         systemctl daemon-reload\n\
         systemctl enable --now kairos-agent.service\n",
        cluster = settings.cluster,
        controllers = settings.controllers.join(","),
        label = kairos_scheduler::burst::BURST_LABEL,
        dir = JOIN_TOKEN_DIR,
        path = JOIN_TOKEN_PATH,
    )
}

/// Where a burst node's user-data puts the join token.
pub const JOIN_TOKEN_DIR: &str = "/etc/kairos";
pub const JOIN_TOKEN_PATH: &str = "/etc/kairos/join.token";
/// The user-data line that writes the join token starts with this.
pub const JOIN_TOKEN_LINE: &str = "printf '%s\\n' ";

fn spec(settings: &Settings, burst: &BurstState, i: &BurstInstance) -> LaunchSpec {
    LaunchSpec {
        cluster: settings.cluster.clone(),
        intent: i.intent,
        instance_type: i.instance_type.clone(),
        spot: i.spot,
        subnet: i.subnet.clone(),
        launch_template: burst.config.launch_template.clone(),
        user_data: user_data(settings, i.intent, i.spot),
        max_price_milli: i.spot.then_some(i.price_milli),
    }
}

/// What the policy decided, as commands: launches, terminations, and why burstable work still
/// waits (a limit, no fitting type) — noted once per change.
fn decision_ops(burst: &BurstState, decision: &Decision) -> Vec<Op> {
    let mut ops = Vec::new();
    if !decision.launches.is_empty() {
        ops.push(Op::BurstLaunch {
            launches: decision.launches.clone(),
            reason: decision.launch_reason.clone(),
        });
    }
    for (intent, reason) in &decision.terminate {
        ops.push(Op::BurstTerminate { intent: *intent, reason: reason.clone() });
    }
    if let Some(why) = decision.held_back.as_ref().filter(|w| !w.starts_with("on-prem GPUs are only")) {
        ops.extend(note_once(burst, HELD_BACK, format!("{HELD_BACK}{why}")));
    }
    ops
}

/// A note for the burst log, unless the latest one of its kind (`prefix`) says the same.
fn note_once(burst: &BurstState, prefix: &str, note: String) -> Option<Op> {
    let last = burst.decisions.iter().rev().find(|(_, m)| m.starts_with(prefix));
    last.is_none_or(|(_, m)| *m != note).then_some(Op::BurstNote { message: note })
}

/// Launches a requested instance: launched, failed for capacity, or (another error) retried
/// next round until `LAUNCH_ATTEMPTS_MAX`.
async fn launch<C: Cloud>(
    cloud: &C,
    burst: &BurstState,
    i: &BurstInstance,
    settings: &Settings,
    memory: &mut Memory,
    report: &mut Report,
) -> Option<Op> {
    match cloud.launch(&spec(settings, burst, i)).await {
        Ok(id) => {
            report.launched.push((i.intent, id.clone()));
            Some(Op::BurstLaunched { intent: i.intent, instance_id: id })
        }
        Err(CloudError::Capacity(why)) => {
            Some(Op::BurstLaunchFailed { intent: i.intent, reason: why, capacity: true })
        }
        Err(CloudError::Other(why) | CloudError::Invalid(why)) => {
            let n = memory.failures.entry(i.intent).or_default();
            *n += 1;
            report.errors.push(format!("launching intent {}: {why}", i.intent));
            (*n >= LAUNCH_ATTEMPTS_MAX).then(|| Op::BurstLaunchFailed {
                intent: i.intent,
                reason: format!("{why} ({n} attempts)"),
                capacity: false,
            })
        }
    }
}

/// Leaks: instances alive, tagged with this cluster, that no live intent knows — once seen so
/// for the leak grace. Remembers when each unknown one was first seen.
fn leaks(
    alive: &[&CloudInstance],
    burst: &BurstState,
    settings: &Settings,
    memory: &mut Memory,
    now: i64,
) -> Vec<String> {
    let known: Vec<&str> = burst.live().filter_map(|i| i.instance_id.as_deref()).collect();
    let live_intents: Vec<u64> = burst.live().map(|i| i.intent).collect();
    let mut still_unknown = BTreeMap::new();
    let mut leaked = Vec::new();
    for i in alive {
        let claimed = known.contains(&i.id.as_str()) || i.intent.is_some_and(|n| live_intents.contains(&n));
        if claimed {
            continue;
        }
        let first = *memory.leaks.get(&i.id).unwrap_or(&now);
        if now - first >= settings.leak_grace_ms {
            leaked.push(i.id.clone());
        }
        still_unknown.insert(i.id.clone(), first);
    }
    memory.leaks = still_unknown;
    leaked
}

/// One round at `now`, given the applied burst state and the policy's decision on the same
/// state (`decision::decide`): returns the commands to propose and what was done.
pub async fn round<C: Cloud>(
    cloud: &C,
    burst: &BurstState,
    decision: &Decision,
    settings: &Settings,
    memory: &mut Memory,
    now: i64,
) -> (Vec<Op>, Report) {
    let mut ops = decision_ops(burst, decision);
    let mut report = Report::default();
    if !burst.config.enabled && burst.live().next().is_none() && memory.leaks.is_empty() {
        // Nothing of ours should exist; an occasional leak scan still runs while enabled or
        // while instances live.
        return (ops, report);
    }
    let listed = match cloud.list(&settings.cluster).await {
        Ok(l) => l,
        Err(e) => {
            let error = format!("listing instances: {e}");
            // Surfaced in `burst status` (once per distinct error), retried next round.
            let note = format!("{CLOUD_ERROR}{}", error.chars().take(200).collect::<String>());
            ops.extend(note_once(burst, CLOUD_ERROR, note));
            report.errors.push(error);
            return (ops, report);
        }
    };
    let alive: Vec<&CloudInstance> = listed.iter().filter(|i| i.is_alive()).collect();
    let by_intent = by_intent(&alive);
    let mut to_terminate: Vec<String> = Vec::new();
    for i in burst.live() {
        let found: Vec<&CloudInstance> = by_intent.get(&i.intent).cloned().unwrap_or_default();
        match i.state {
            InstanceState::Requested => {
                if let Some(first) = found.first() {
                    // Launched by us or a predecessor whose answer never got committed.
                    ops.push(Op::BurstLaunched { intent: i.intent, instance_id: first.id.clone() });
                    report.adopted.push((i.intent, first.id.clone()));
                    to_terminate.extend(found.iter().skip(1).map(|d| d.id.clone()));
                    continue;
                }
                ops.extend(launch(cloud, burst, i, settings, memory, &mut report).await);
            }
            InstanceState::Launched => {
                let (gone, duplicates) = check_launched(i, &found, settings, now);
                ops.extend(gone);
                to_terminate.extend(duplicates);
            }
            InstanceState::Terminating => {
                let (gone, remaining) = check_terminating(i, &found, &alive, settings, now);
                ops.extend(gone);
                to_terminate.extend(remaining);
            }
            InstanceState::Gone => {}
        }
    }
    report.leaks = leaks(&alive, burst, settings, memory, now);
    to_terminate.extend(report.leaks.iter().cloned());
    memory
        .failures
        .retain(|intent, _| burst.instances.get(intent).is_some_and(|i| i.state == InstanceState::Requested));
    terminate(cloud, to_terminate, &mut report).await;
    (ops, report)
}

/// The alive instances by the intent they carry (instances without one are left out).
fn by_intent<'a>(alive: &[&'a CloudInstance]) -> BTreeMap<u64, Vec<&'a CloudInstance>> {
    let mut by_intent: BTreeMap<u64, Vec<&CloudInstance>> = BTreeMap::new();
    for i in alive {
        if let Some(intent) = i.intent {
            by_intent.entry(intent).or_default().push(i);
        }
    }
    by_intent
}

/// A launched instance against the cloud's `found` instances of its intent: gone when its own
/// is missing for longer than the vanish grace, and the duplicates to terminate (a launch
/// answered twice).
fn check_launched(
    i: &BurstInstance,
    found: &[&CloudInstance],
    settings: &Settings,
    now: i64,
) -> (Option<Op>, Vec<String>) {
    let id = i.instance_id.as_deref().unwrap_or_default();
    let duplicates = found.iter().filter(|d| d.id != id).map(|d| d.id.clone()).collect();
    let present = found.iter().any(|d| d.id == id);
    let since = i.launched_ms.unwrap_or(i.requested_ms);
    let gone = (!present && now - since >= settings.vanish_grace_ms)
        .then(|| Op::BurstGone { intent: i.intent, reason: format!("instance {id} vanished") });
    (gone, duplicates)
}

/// A terminating instance: gone once nothing of it is alive (an unknown id waits out a launch
/// in flight for the vanish grace), else what of it is alive, to terminate (again).
fn check_terminating(
    i: &BurstInstance,
    found: &[&CloudInstance],
    alive: &[&CloudInstance],
    settings: &Settings,
    now: i64,
) -> (Option<Op>, Vec<String>) {
    let mut ids: Vec<String> = found.iter().map(|d| d.id.clone()).collect();
    if let Some(id) = &i.instance_id {
        if alive.iter().any(|a| &a.id == id) && !ids.contains(id) {
            ids.push(id.clone());
        }
    }
    if !ids.is_empty() {
        return (None, ids);
    }
    // Known id and not alive: confirmed; unknown id: wait out a launch in flight.
    let confirmed = i.instance_id.is_some() || now - i.requested_ms >= settings.vanish_grace_ms;
    (confirmed.then(|| Op::BurstGone { intent: i.intent, reason: "terminated".into() }), Vec::new())
}

/// Terminates `ids` (each once) in one call, recording the outcome in `report`.
async fn terminate<C: Cloud>(cloud: &C, mut ids: Vec<String>, report: &mut Report) {
    ids.sort();
    ids.dedup();
    if ids.is_empty() {
        return;
    }
    match cloud.terminate(&ids).await {
        Ok(()) => report.terminated = ids,
        Err(e) => report.errors.push(format!("terminating {ids:?}: {e}")),
    }
}
