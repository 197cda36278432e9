//! The burst reconciler on the leader: every round, decide (pure) on the applied state, run one
//! reconcile round against the cloud, and propose its commands through Raft. Runs on every
//! replica, acts only while this replica leads; its memory (leak first-seen times) is local.
//!
//! The cloud client is made only once burst is configured (enabled, or instances still live),
//! and again when the region changes.

use std::time::Duration;

use kairos_burst::reconcile::{round, Memory, Settings};
use kairos_burst::Ec2Cloud;
use kairos_scheduler::Command;

use crate::context::Ctx;

/// How the reconciler reaches the cloud and how patient it is.
#[derive(Clone, Debug)]
pub struct BurstOptions {
    pub cluster: String,
    /// EC2 endpoint override (tests: moto); None = the AWS configuration chain's.
    pub endpoint: Option<String>,
    pub interval: Duration,
    pub leak_grace: Duration,
    pub vanish_grace: Duration,
    /// Fault injection for tests: die right after the cloud accepted a launch, before its
    /// instance id is committed (the window a new leader must cover by adopting, not relaunching).
    pub crash_after_launch: bool,
    /// The join token burst nodes register with (goes into their user-data).
    pub join_token: String,
}

pub async fn run(ctx: Ctx, options: BurstOptions) {
    let mut memory = Memory::default();
    let mut cloud: Option<(String, Ec2Cloud)> = None;
    // Consecutive rounds with cloud errors: the next round waits 2^n intervals (at most 30 s).
    let mut failing: u32 = 0;
    loop {
        let backoff = options
            .interval
            .saturating_mul(1 << failing.min(5))
            .min(Duration::from_secs(30).max(options.interval));
        tokio::time::sleep(backoff).await;
        // A leader a quorum no longer answers (cut off, or deaf while another leads) must not
        // reconcile the cloud from a state that may be stale: it could take a new leader's
        // launches for leaks.
        if !ctx.replica.leads_confirmed().await {
            memory = Memory::default();
            continue;
        }
        let now = ctx.cluster_now();
        let (burst, decision) =
            ctx.replica.read(|a| (a.state.burst.clone(), kairos_burst::decide(&a.state, now)));
        if !burst.config.enabled && burst.live().next().is_none() {
            continue;
        }
        let region = burst.config.region.clone();
        if cloud.as_ref().is_none_or(|(r, _)| *r != region) {
            cloud = Some((region.clone(), Ec2Cloud::new(&region, options.endpoint.as_deref()).await));
        }
        let Some((_, ec2)) = cloud.as_ref() else { continue };
        // Burst nodes' agents connect to every controller of the cluster.
        let controllers: Vec<String> =
            ctx.replica.status().replicas.into_iter().map(|(_, addr, _)| addr).collect();
        let settings = Settings {
            cluster: options.cluster.clone(),
            controllers,
            leak_grace_ms: options.leak_grace.as_millis() as i64,
            vanish_grace_ms: options.vanish_grace.as_millis() as i64,
            join_token: options.join_token.clone(),
        };
        let (ops, report) = round(ec2, &burst, &decision, &settings, &mut memory, now).await;
        if options.crash_after_launch && !report.launched.is_empty() {
            tracing::error!(launched = ?report.launched, "fault injection: exiting before the launch is committed");
            std::process::exit(86);
        }
        for e in &report.errors {
            tracing::warn!(error = %e, "burst reconcile");
        }
        failing = if report.errors.is_empty() { 0 } else { failing.saturating_add(1) };
        for (intent, id) in &report.launched {
            tracing::info!(intent, instance = %id, "burst instance launched");
        }
        for (intent, id) in &report.adopted {
            tracing::info!(intent, instance = %id, "burst instance adopted by its intent tag");
        }
        for id in &report.leaks {
            tracing::warn!(instance = %id, "terminating an instance tagged with this cluster that no intent knows");
        }
        if ops.is_empty() {
            continue;
        }
        let commands: Vec<Command> = ctx.stamped(ops);
        match ctx.replica.write(commands).await {
            Ok(outcomes) => {
                tracing::debug!(?outcomes, "burst round committed");
                ctx.kick.notify_one();
            }
            Err(e) => tracing::warn!(error = %e, "burst round not committed"),
        }
    }
}
