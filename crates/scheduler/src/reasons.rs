//! Why a pending job waits: the vocabulary the planner, the limits, the queue scan and apply
//! share (its own module, so none of them imports it from the planner).

use crate::model::JobId;

/// Why a pending job is not starting now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PendingReason {
    /// It fits no node's free GPUs right now.
    Resources,
    /// Its GPUs are free somewhere, but not this resource ("CPUs", "memory") beside them.
    ResourcesShort(&'static str),
    /// A higher-priority job is waiting ahead of it.
    Priority,
    /// No Up node has enough GPUs in total.
    ReqNodeNotAvail(String),
    /// Starting it would exceed its QoS's GPU limit for all jobs together.
    QosGrpGpuLimit,
    /// Starting it would exceed its QoS's per-user GPU limit.
    QosUserGpuLimit,
    /// Starting it would exceed its QoS's per-user running-job limit.
    QosUserJobLimit,
    /// Held by a user (`kairos hold`); `kairos release` lets it start.
    JobHeldUser,
    /// Free GPUs would take it, but they are held for a job ahead of it (`job`), which starts on
    /// them in `start_in_s`: with a time limit under that, it would start now (backfill).
    PriorityHeld { job: JobId, start_in_s: u64 },
    /// Its preemption victims are stopping; the GPUs they free are claimed for it.
    Preempting,
    /// Waiting for the jobs it depends on to complete.
    Dependency,
    /// The job's array already runs as many tasks as its `%N` allows.
    JobArrayTaskLimit,
    /// A job it depends on (`afterok`; a task of an array) ended without completing: it can
    /// never start.
    DependencyNeverSatisfied(JobId),
    /// Every job it depends on with `afternotok` completed: it can never start.
    DependencyCompleted(JobId),
    /// Its time limit is longer than its partition allows.
    PartitionTimeLimit,
    /// Starting it would leave fewer GPUs free than the QoS headrooms keep idle (for
    /// inference); it starts as GPUs free up beyond them.
    Headroom,
    /// A required topology: no domain of `level` has `tasks` nodes free for it now; `largest`
    /// is the domain with the most (and how many).
    Topology { level: String, tasks: u32, largest: Option<(String, u32)> },
    /// The account (of its chain) named would borrow beyond its `borrow_limit`.
    AccountBorrowLimit(String),
    /// The free GPUs are other teams' idle guarantees they do not lend (`lend_limit`).
    LendLimit,
    /// It runs in a reservation (`--reservation`) whose window is not open, or that no longer
    /// exists (the text says which), or whose resources are busy.
    Reservation(String),
}

impl std::fmt::Display for PendingReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PendingReason::Resources => f.write_str("Resources"),
            PendingReason::ResourcesShort(what) => write!(f, "Resources: not enough free {what}"),
            PendingReason::Priority => f.write_str("Priority"),
            PendingReason::PriorityHeld { job, start_in_s } => write!(
                f,
                "Priority: the free GPUs are held for job {job}, which starts on them in {start_in_s} s; \
                 with a time limit under that (--time) this job would start now"
            ),
            PendingReason::ReqNodeNotAvail(why) => write!(f, "ReqNodeNotAvail: {why}"),
            PendingReason::QosGrpGpuLimit => f.write_str("QosGrpGpuLimit"),
            PendingReason::QosUserGpuLimit => f.write_str("QosUserGpuLimit"),
            PendingReason::QosUserJobLimit => f.write_str("QosUserJobLimit"),
            PendingReason::JobHeldUser => f.write_str("JobHeldUser"),
            PendingReason::Preempting => f.write_str("Preempting"),
            PendingReason::Dependency => f.write_str("Dependency"),
            PendingReason::JobArrayTaskLimit => f.write_str("JobArrayTaskLimit"),
            PendingReason::PartitionTimeLimit => f.write_str("PartitionTimeLimit"),
            PendingReason::Headroom => f.write_str("Headroom"),
            PendingReason::AccountBorrowLimit(account) => {
                write!(f, "AccountBorrowLimit: account {account} borrows all its borrow limit allows")
            }
            PendingReason::LendLimit => {
                f.write_str("LendLimit: the free GPUs are other teams' guarantees, kept for them")
            }
            PendingReason::Reservation(why) => write!(f, "Reservation: {why}"),
            PendingReason::Topology { level, tasks, largest } => {
                write!(f, "Topology: no {level} has {tasks} nodes free for it")?;
                match largest {
                    Some((domain, n)) => write!(f, " (the most: {level} {domain}, {n})"),
                    None => write!(f, " (no free node has a {level})"),
                }
            }
            PendingReason::DependencyNeverSatisfied(dep) => {
                write!(f, "DependencyNeverSatisfied: job {dep} did not complete")
            }
            PendingReason::DependencyCompleted(dep) => {
                write!(f, "DependencyNeverSatisfied: job {dep} completed (the job runs after a failure)")
            }
        }
    }
}
