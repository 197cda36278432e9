//! Chaos scenarios: a cluster on separate hosts, the workload from the client host, a seeded
//! schedule of faults while it runs, then healing, recovery and every checker.
//!
//! The seed fixes the schedule (which faults, when, how long) and the workload's choices, so a
//! failing scenario is rerun with the seed its summary line prints (`KAIROS_CHAOS_SEED`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::{ChaosCluster, ClusterError, Topology, ADMIN_TOKEN};
use std::sync::atomic::Ordering;

use crate::proxy::{self, Faults, Rng};
use crate::workload::{self, in_namespace, Client};
use crate::{check_all, parse_process_log, Run, Summary, Violation};

/// What goes wrong during a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL the leader; restart it (data intact) after the fault's duration.
    KillLeader,
    /// SIGSTOP the leader; SIGCONT it later (it wakes believing it still leads).
    PauseLeader,
    /// Take the leader's link down (two-way partition), then up.
    IsolateLeader,
    /// The leader drops everything it receives (one-way partition), then heals.
    DeafLeader,
    /// SIGKILL an agent (its watchdog fences its jobs if it stays away); restart it.
    KillAgent,
    /// SIGSTOP an agent for longer than the node timeout, then SIGCONT it: the leader requeues
    /// its jobs elsewhere meanwhile, so its watchdog must have stopped them first.
    StallAgent,
    /// SIGTERM a follower controller and start it again with its data.
    RestartFollower,
    /// The client's links to every controller get 40-120 ms of delay per chunk and reordering
    /// across connections (through the fault proxies).
    SlowClientLinks,
    /// The leader's replies to the client are lost (one-way, on the client's link): submits
    /// commit but the client never hears, so it retries with the same request id.
    LostReplies,
    /// Every link into every controller — Raft, agents, clients — gets 20-60 ms of delay per
    /// chunk and reordering across connections.
    SlowRaft,
    /// The links into the leader break every few hundred milliseconds (bursts of loss).
    FlakyLeader,
}

impl Fault {
    pub const ALL: [Fault; 11] = [
        Fault::KillLeader,
        Fault::PauseLeader,
        Fault::IsolateLeader,
        Fault::DeafLeader,
        Fault::KillAgent,
        Fault::StallAgent,
        Fault::RestartFollower,
        Fault::SlowClientLinks,
        Fault::LostReplies,
        Fault::SlowRaft,
        Fault::FlakyLeader,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillLeader => "kill -9 leader + restart",
            Fault::PauseLeader => "SIGSTOP/SIGCONT leader",
            Fault::IsolateLeader => "isolate leader (two-way)",
            Fault::DeafLeader => "leader deaf (one-way)",
            Fault::KillAgent => "kill -9 agent + restart",
            Fault::StallAgent => "agent stalled past node timeout",
            Fault::RestartFollower => "restart follower",
            Fault::SlowClientLinks => "slow, reordering links",
            Fault::LostReplies => "leader's replies lost",
            Fault::SlowRaft => "slow, reordering raft links",
            Fault::FlakyLeader => "flaky links to the leader",
        }
    }
}

/// One scenario's settings.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub name: String,
    pub seed: u64,
    /// Faults drawn (in order) from this list, one after another while the workload runs.
    pub faults: Vec<Fault>,
    pub workload: Duration,
    pub topology: Topology,
    /// After healing, a leader must be seen within this bound.
    pub leader_bound: Duration,
    /// And the queue must drain within this.
    pub drain_bound: Duration,
}

/// A finished scenario: its summary line and what the checkers found.
pub struct Outcome {
    pub summary: Summary,
    pub violations: Vec<Violation>,
    /// Where the run's logs are (kept when it failed).
    pub dir: Option<std::path::PathBuf>,
}

/// Runs `f` with a client in the client host and waits for its result.
fn from_client<T: Send + 'static>(
    c: &ChaosCluster,
    f: impl FnOnce(Client) -> std::pin::Pin<Box<dyn std::future::Future<Output = T>>> + Send + 'static,
) -> Result<T, ClusterError> {
    let client = Client::new(c.controller_addrs(), ADMIN_TOKEN);
    let handle = in_namespace(&c.net.host(c.client_host()), move || workload::runtime().block_on(f(client)));
    handle.join().map_err(|_| ClusterError::Io("a client thread panicked".into()))?.map_err(ClusterError::Io)
}

/// The index of the controller that reports itself leader (asked from the client host).
fn leader_of(c: &ChaosCluster, within: Duration) -> Option<usize> {
    from_client(c, move |client| {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + within;
            loop {
                let statuses = client.statuses().await;
                if let Some(i) =
                    statuses.iter().position(|s| s.as_ref().is_some_and(|s| s.leader == Some(s.id)))
                {
                    return Some(i);
                }
                if tokio::time::Instant::now() >= deadline {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    })
    .ok()
    .flatten()
}

/// Waits (at most `within`) until a write commits; returns how long that took.
fn first_commit(c: &ChaosCluster, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    from_client(c, move |client| {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + within;
            while tokio::time::Instant::now() < deadline {
                if client.probe_write().await {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            false
        })
    })
    .ok()
    .filter(|ok| *ok)
    .map(|_| started.elapsed())
}

/// Sets delay and reordering on both directions of `links`.
fn shape(links: &[Arc<Faults>], delay_ms: u64, reorder_per_mille: u64) {
    for l in links {
        for d in [&l.forward, &l.backward] {
            d.delay_ms.store(delay_ms, Ordering::SeqCst);
            d.reorder_per_mille.store(reorder_per_mille, Ordering::SeqCst);
        }
    }
}

/// Injects one fault, waits `hold`, heals it. Returns a description for the log.
fn inject(
    c: &mut ChaosCluster,
    links: &[Arc<Faults>],
    fault: Fault,
    hold: Duration,
    rng: &mut Rng,
) -> Result<String, ClusterError> {
    let leader = leader_of(c, Duration::from_secs(10)).unwrap_or(0);
    let what = match fault {
        Fault::KillLeader => {
            c.kill(c.controller(leader));
            std::thread::sleep(hold);
            c.restart(c.controller(leader))?;
            format!("killed controller {} for {hold:?}", leader + 1)
        }
        Fault::PauseLeader => {
            c.pause(c.controller(leader));
            std::thread::sleep(hold);
            c.resume(c.controller(leader));
            format!("paused controller {} for {hold:?}", leader + 1)
        }
        Fault::IsolateLeader => {
            c.net.isolate(leader, true)?;
            std::thread::sleep(hold);
            c.net.isolate(leader, false)?;
            format!("isolated controller {} for {hold:?}", leader + 1)
        }
        Fault::DeafLeader => {
            let others: Vec<usize> = (0..c.net.hosts()).filter(|h| *h != leader).collect();
            for h in &others {
                c.net.drop_from(leader, *h, true)?;
            }
            std::thread::sleep(hold);
            for h in &others {
                c.net.drop_from(leader, *h, false)?;
            }
            format!("controller {} deaf for {hold:?}", leader + 1)
        }
        Fault::KillAgent => {
            let a = rng.below(c.topology.agents as u64) as usize;
            c.kill(c.agent(a));
            std::thread::sleep(hold.min(Duration::from_millis(1500)));
            c.restart(c.agent(a))?;
            format!("killed agent node-{a}")
        }
        Fault::StallAgent => {
            let a = rng.below(c.topology.agents as u64) as usize;
            // Past the node timeout (5 s): the node is declared down and its jobs requeue
            // while its processes may still run, unless fencing stopped them.
            let stall = hold.max(Duration::from_millis(8000));
            c.pause(c.agent(a));
            std::thread::sleep(stall);
            c.resume(c.agent(a));
            format!("stalled agent node-{a} for {stall:?}")
        }
        Fault::SlowClientLinks => {
            let delay = 40 + rng.below(80);
            shape(links, delay, 300);
            std::thread::sleep(hold);
            shape(links, 0, 0);
            format!("client links slowed by {delay} ms with reordering for {hold:?}")
        }
        Fault::LostReplies => {
            let link = &links[leader.min(links.len() - 1)];
            link.backward.blocked.store(true, Ordering::SeqCst);
            std::thread::sleep(hold);
            link.backward.blocked.store(false, Ordering::SeqCst);
            format!("replies of controller {} to the client lost for {hold:?}", leader + 1)
        }
        Fault::SlowRaft => {
            let delay = 20 + rng.below(40);
            shape(&c.links, delay, 300);
            std::thread::sleep(hold);
            shape(&c.links, 0, 0);
            format!("every controller link slowed by {delay} ms with reordering for {hold:?}")
        }
        Fault::FlakyLeader => {
            let link = c.links[leader].clone();
            let until = Instant::now() + hold;
            let mut breaks = 0;
            while Instant::now() < until {
                link.partition(true);
                std::thread::sleep(Duration::from_millis(50 + rng.below(150)));
                link.partition(false);
                breaks += 1;
                std::thread::sleep(Duration::from_millis(100 + rng.below(300)));
            }
            format!("links to controller {} broken {breaks} times in {hold:?}", leader + 1)
        }
        Fault::RestartFollower => {
            let f =
                (leader + 1 + rng.below(c.topology.controllers as u64 - 1) as usize) % c.topology.controllers;
            c.kill(c.controller(f));
            std::thread::sleep(hold);
            c.restart(c.controller(f))?;
            format!("restarted controller {}", f + 1)
        }
    };
    Ok(what)
}

/// Runs one scenario end to end. `prefix` names its network namespaces.
pub fn run(prefix: &str, s: &Scenario) -> Result<Outcome, ClusterError> {
    let mut c = ChaosCluster::start(prefix, s.topology)?;
    let mut rng = Rng::new(s.seed);
    if leader_of(&c, Duration::from_secs(30)).is_none() {
        return Err(ClusterError::Io("the cluster elected no leader at start".into()));
    }
    // The workload runs on its own thread in the client host, its links to the controllers
    // through fault proxies there, while faults are injected here.
    let links: Vec<Arc<Faults>> = (0..s.topology.controllers).map(|_| Arc::new(Faults::default())).collect();
    let (duration, seed, addrs) = (s.workload, s.seed, c.controller_addrs());
    let worker = {
        let links = links.clone();
        in_namespace(&c.net.host(c.client_host()), move || {
            workload::runtime().block_on(async move {
                let mut via = std::collections::BTreeMap::new();
                for (i, addr) in addrs.iter().enumerate() {
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                        .await
                        .map_err(|e| format!("binding a proxy: {e}"))?;
                    let local = listener.local_addr().map_err(|e| format!("proxy address: {e}"))?;
                    via.insert(addr.clone(), local.to_string());
                    tokio::spawn(proxy::run(listener, addr.clone(), links[i].clone(), seed ^ i as u64));
                }
                let client = Arc::new(Client::new(addrs, ADMIN_TOKEN).through(via));
                Ok::<_, String>(workload::run(client, duration, 2, seed).await)
            })
        })
    };
    let started = Instant::now();
    // The slowest recovery: from healing a fault until a write commits again (None: never).
    let mut slowest: Option<Duration> = Some(Duration::ZERO);
    let mut injected = 0;
    let mut faults = s.faults.iter().cycle();
    // Faults one after another, each after a calm gap, until the workload's end nears.
    loop {
        let gap = Duration::from_millis(800 + rng.below(1200));
        let hold = Duration::from_millis(1500 + rng.below(2000));
        if started.elapsed() + gap + hold + Duration::from_secs(1) > s.workload {
            break;
        }
        std::thread::sleep(gap);
        let Some(fault) = faults.next() else { break };
        let what = inject(&mut c, &links, *fault, hold, &mut rng)?;
        let recovery = first_commit(&c, s.leader_bound);
        eprintln!("chaos {}: {what}; writes again after {recovery:?}", s.name);
        slowest = slowest.zip(recovery).map(|(a, b)| a.max(b));
        injected += 1;
    }
    let recorded = worker
        .join()
        .map_err(|_| ClusterError::Io("the workload panicked".into()))?
        .map_err(ClusterError::Io)?
        .map_err(ClusterError::Io)?;
    let history = recorded.history;

    // Recovered from every fault within the bound (above); now the queue must drain.
    let recover_ms = slowest.map(|d| d.as_millis() as i64).unwrap_or(-1);
    let drain_bound = s.drain_bound;
    let addrs = c.controller_addrs();
    let reader = in_namespace(&c.net.host(c.client_host()), move || {
        let client = Client::new(addrs, ADMIN_TOKEN);
        workload::runtime().block_on(async {
            let deadline = tokio::time::Instant::now() + drain_bound;
            let jobs = loop {
                let jobs = client.jobs().await.unwrap_or_default();
                let open = jobs.iter().filter(|j| !is_terminal(j.state)).count();
                if (open == 0 && !jobs.is_empty()) || tokio::time::Instant::now() >= deadline {
                    break jobs;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            };
            // Replicas converge: wait (bounded) until all report the same applied index.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            let statuses = loop {
                let st: Vec<_> = client.statuses().await.into_iter().flatten().collect();
                let same = st.windows(2).all(|w| w[0].applied_index == w[1].applied_index);
                if (same && st.len() == 3) || tokio::time::Instant::now() >= deadline {
                    break st;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            };
            (jobs, statuses)
        })
    });
    let (jobs, statuses) = reader
        .join()
        .map_err(|_| ClusterError::Io("the reader panicked".into()))?
        .map_err(ClusterError::Io)?;
    // Stop the agents gracefully so every process end is logged, then read the logs.
    c.stop();
    let (processes, unparsed) = parse_process_log(&c.process_logs());
    let finals = workload::final_jobs(&jobs);
    let pending = jobs.iter().filter(|j| !is_terminal(j.state)).count();

    let leader_ms = slowest.map(|_| recover_ms);
    // Replicas that did not answer or converge within the reader's bound are a violation (the
    // checker needs all three), not skipped.
    let replicas: Vec<(u64, u64, String)> =
        statuses.iter().map(|s| (s.id, s.applied_index, s.state_digest.clone())).collect();
    let mut violations = check_all(&Run {
        history: &history,
        processes: &processes,
        finals: &finals,
        replicas: &replicas,
        expected_replicas: s.topology.controllers,
        leader_after_ms: leader_ms,
        bound_ms: s.leader_bound.as_millis() as i64,
        unfinished: pending,
        invariants: &[],
        time_limit_stops: &[],
        allocations: &[],
        stop_orders: &[],
        stop_bound_ms: 0,
        end_ms: 0,
        timeline_lag_ms: None,
        owed: &[],
        owed_bound_ms: 0,
    });
    if unparsed > 0 {
        violations.push(Violation::Harness { what: format!("{unparsed} process log lines did not parse") });
    }
    let acked: Vec<u64> = history
        .iter()
        .filter_map(|o| match o {
            crate::Operation::Submit { acked, .. } => *acked,
            _ => None,
        })
        .collect();
    let known: std::collections::BTreeSet<u64> = finals.iter().map(|j| j.id).collect();
    let summary = Summary {
        scenario: s.name.clone(),
        seed: s.seed,
        faults: injected,
        operations: history.len(),
        acknowledged: acked.len(),
        lost: acked.iter().filter(|j| !known.contains(j)).count(),
        double_allocations: violations
            .iter()
            .filter(|v| matches!(v, Violation::GpuDoubleHeld { .. }))
            .count(),
        recover_ms,
        longest_gap_ms: recorded.longest_gap.as_millis() as i64,
        preempted: finals.iter().filter(|j| j.events.iter().any(|e| e == "preempted")).count(),
    };
    let dir = if violations.is_empty() { None } else { Some(keep_logs(&c, &s.name, s.seed)) };
    Ok(Outcome { summary, violations, dir })
}

/// Copies a failed run's logs where they outlive the run.
fn keep_logs(c: &ChaosCluster, name: &str, seed: u64) -> std::path::PathBuf {
    let slug: String = name.chars().map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '-' }).collect();
    let dest = std::env::temp_dir().join(format!("kairos-chaos-{slug}-{seed}"));
    let _ = std::fs::create_dir_all(&dest);
    if let Ok(entries) = std::fs::read_dir(c.dir.path()) {
        for e in entries.flatten().filter(|e| e.path().is_file()) {
            let _ = std::fs::copy(e.path(), dest.join(e.file_name()));
        }
    }
    dest
}

fn is_terminal(state: i32) -> bool {
    use kairos_proto::v1::JobState as S;
    matches!(S::try_from(state), Ok(S::Completed | S::Failed | S::Cancelled | S::Timeout | S::NodeFail))
}
