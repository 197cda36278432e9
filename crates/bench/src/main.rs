//! kairos-bench: benchmarks against a fresh multi-replica cluster of real `kairosd` processes on
//! loopback (their real write-ahead logs, fsync on; `cluster`). Each prints one JSON object on
//! stdout.
//!
//! - `submit` (`load`): C concurrent gRPC clients submit jobs that stay pending (no agents) for
//!   S seconds; prints throughput and latency percentiles of acknowledged submits.
//! - `failover`: under a steady submit stream, SIGKILLs the leader each round and measures the
//!   gap from the kill to the first acknowledged submit.
//! - `preempt`: an urgent job's start when it must preempt, through real agents.
//! - `agents`: thousands of agents (the agent's session code, fake runs) against a 3-replica
//!   cluster: all UP from cold, steady-state leader CPU and latencies, re-admission after the
//!   leader's kill, silent agents judged DOWN (`agents`).
//! - `replay`: a what-if's replay of a synthetic 30-day history (`kairos_sim`), time and memory.
//! - `schedule`: planning passes of the pure core on a large synthetic cluster.
//! - `entry-path`: a log entry's data path per submit (encode, decode, log record, apply) in one
//!   process, steady to a few percent where the cluster benches move by tens.
//! - `etcd-put`: the `submit` load against a running etcd cluster's `KV.Put` (`etcd`), for
//!   `scripts/bench-vs-etcd.sh`.
//!
//! Each bench has its module: `load` (submit), `failover`, `preempt`, `schedule`, `entry`
//! (entry-path), `etcd` (etcd-put), `floor` (grpc-floor); `cluster` starts the replicas.
//!
//! Build in release first: `cargo build --release --bins`; kairosd is taken from beside this
//! binary.

use clap::{Parser, Subcommand};

mod agents;
mod cluster;
mod cpu;
mod entry;
mod etcd;
mod failover;
mod floor;
mod load;
mod preempt;
mod replay;
mod schedule;
mod session;
mod usage;

#[derive(Parser)]
#[command(name = "kairos-bench", about = "kairos benchmarks (JSON on stdout)")]
struct Args {
    #[command(subcommand)]
    command: Bench,
}

/// The closed-loop load of `submit`, `etcd-put` and `grpc-floor`.
#[derive(clap::Args)]
struct LoadArgs {
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// HTTP/2 connections to each server, shared by the clients (default: one per client).
    #[arg(long)]
    conns: Option<usize>,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

impl LoadArgs {
    /// Clients, connections per server, seconds (at least one client and connection).
    fn get(&self) -> (usize, usize, u64) {
        let clients = self.clients.max(1);
        (clients, self.conns.unwrap_or(clients).max(1), self.seconds)
    }
}

#[derive(Subcommand)]
enum Bench {
    /// Submit throughput and latency on a fresh cluster.
    Submit {
        #[arg(long, default_value_t = 3)]
        controllers: u64,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// Urgent-job time to start under preemption: agents full of REQUEUE jobs (grace 0).
    Preempt {
        #[arg(long, default_value_t = 3)]
        controllers: u64,
        #[arg(long, default_value_t = 2)]
        agents: u32,
        #[arg(long, default_value_t = 8)]
        gpus_per_agent: u32,
        #[arg(long, default_value_t = 50)]
        rounds: usize,
    },
    /// Full scheduling passes of the pure core on a large synthetic cluster.
    Schedule {
        #[arg(long, default_value_t = 10_000)]
        nodes: u32,
        #[arg(long, default_value_t = 8)]
        gpus_per_node: u32,
        #[arg(long, default_value_t = 100_000)]
        pending: u32,
        #[arg(long, default_value_t = 50_000)]
        running: u32,
        #[arg(long, default_value_t = 10)]
        passes: usize,
        /// Pending one-GPU inference jobs ask a fraction of a GPU (100, 250 or 500 thousandths,
        /// as the trace's `gpu_milli`) instead of a whole one.
        #[arg(long)]
        fractions: bool,
        /// Nodes in this many racks (topology level `rack`, named by the cluster): placement
        /// then goes by it (0: no topology).
        #[arg(long, default_value_t = 0)]
        racks: u32,
    },
    /// The submit load (closed loop) as puts to a running etcd.
    EtcdPut {
        /// etcd client addresses, comma-separated (host:port).
        #[arg(long, value_delimiter = ',', required = true)]
        endpoints: Vec<String>,
        #[command(flatten)]
        load: LoadArgs,
        /// Bytes per value (default: about an encoded submit request).
        #[arg(long, default_value_t = 256)]
        value_bytes: usize,
        /// The members' process ids, comma-separated, to report their CPU time per put.
        #[arg(long, value_delimiter = ',')]
        pids: Vec<u32>,
    },
    /// The log entry's data path per submit, in one process: encode, decode, log record, apply.
    EntryPath {
        #[arg(long, default_value_t = 60_000)]
        submits: usize,
        /// Submits per log entry (the group commit's size under `submit`'s load).
        #[arg(long, default_value_t = 22)]
        per_entry: usize,
        /// Distinct users (one per client, as `submit`).
        #[arg(long, default_value_t = 64)]
        users: usize,
        /// Fairshare accounts in the policy (under the root, the users spread over them).
        #[arg(long, default_value_t = 1)]
        accounts: usize,
    },
    /// The submit load against a server that answers at once: the gRPC edge's own cost.
    GrpcFloor {
        #[command(flatten)]
        load: LoadArgs,
    },
    /// The server `grpc-floor` starts (in a process of its own).
    #[command(hide = true)]
    FloorServe {
        #[arg(long)]
        addr: String,
    },
    /// A what-if's replay: a synthetic history of JOBS jobs over DAYS days on NODES nodes, read
    /// from its trace file and replayed once (time, CPU, peak memory).
    Replay {
        #[arg(long, default_value_t = 200_000)]
        jobs: u32,
        #[arg(long, default_value_t = 30)]
        days: u32,
        #[arg(long, default_value_t = 1000)]
        nodes: u32,
        #[arg(long, default_value_t = 8)]
        gpus: u32,
    },
    /// The agent's cost of measuring runs: one sampler tick for RUNS runs on GPUS fake GPUs, in
    /// process CPU per tick and as a share of a core at the sampling interval.
    Usage {
        #[arg(long, default_value_t = 8)]
        gpus: u32,
        #[arg(long, default_value_t = 32)]
        runs: u32,
        #[arg(long, default_value_t = 2000)]
        ticks: u32,
        /// The agent's --usage-interval (default 10 s).
        #[arg(long, default_value_t = 10)]
        interval_s: u64,
    },
    /// An interactive session's throughput (port-forward tunnel, exec output) and keystroke
    /// echo, through a controller and an agent on loopback.
    Session {
        /// Megabytes sent through the tunnel and through exec.
        #[arg(long, default_value_t = 256)]
        mb: u64,
        /// Keystrokes whose echo is timed.
        #[arg(long, default_value_t = 200)]
        keys: usize,
    },
    /// Thousands of agents (the agent's own session code, fake runs that end on time) against
    /// a real 3-replica cluster: cold start, steady state, the leader's kill, silent agents.
    Agents {
        #[arg(long, default_value_t = 10_000)]
        nodes: usize,
        /// GPUs per node.
        #[arg(long, default_value_t = 8)]
        gpus: u32,
        #[arg(long, default_value_t = 3)]
        controllers: u64,
        /// Agents sharing one connection to a controller.
        #[arg(long, default_value_t = 100)]
        agents_per_connection: usize,
        /// Seconds of steady state measured.
        #[arg(long, default_value_t = 60)]
        steady_s: u64,
        /// Submits per second during the steady state.
        #[arg(long, default_value_t = 20)]
        submit_rate: u32,
        /// How long each job's fake run runs (s).
        #[arg(long, default_value_t = 600)]
        run_s: u64,
        /// Jobs submitted (and started) before the steady state (default: one per node).
        #[arg(long)]
        fill: Option<usize>,
        /// Agents killed at the end, to be judged DOWN.
        #[arg(long, default_value_t = 100)]
        kill_agents: usize,
        /// Agents' heartbeat interval (kairosd --heartbeat-ms; the production default).
        #[arg(long, default_value_t = 2000)]
        heartbeat_ms: u64,
        /// kairosd --node-timeout-ms (the production default).
        #[arg(long, default_value_t = 20_000)]
        node_timeout_ms: u64,
        /// Fail unless no run was fenced, every agent was re-admitted and no replica's memory
        /// grew (the test suite's run).
        #[arg(long)]
        check: bool,
    },
    /// Leader-failover gap under a steady submit stream.
    Failover {
        #[arg(long, default_value_t = 3)]
        controllers: u64,
        #[arg(long, default_value_t = 10)]
        rounds: usize,
        /// Concurrent submitters during the test.
        #[arg(long, default_value_t = 4)]
        clients: usize,
    },
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    // What the harness's agents log (`kairos-bench agents`), when RUST_LOG asks for it.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let result = match args.command {
        Bench::Submit { controllers, load } => {
            let (clients, conns, seconds) = load.get();
            load::bench_submit(controllers, clients, conns, seconds).await
        }
        Bench::Session { mb, keys } => session::bench_session(mb.max(1), keys.max(1)).await,
        Bench::Preempt { controllers, agents, gpus_per_agent, rounds } => {
            preempt::bench_preempt(controllers, agents, gpus_per_agent, rounds.max(1)).await
        }
        Bench::Schedule { nodes, gpus_per_node, pending, running, passes, fractions, racks } => {
            schedule::bench_schedule(nodes, gpus_per_node, pending, running, passes.max(1), fractions, racks)
        }
        Bench::EtcdPut { endpoints, load, value_bytes, pids } => {
            let (clients, conns, seconds) = load.get();
            etcd::bench_etcd_put(endpoints, clients, conns, seconds, value_bytes, pids).await
        }
        Bench::EntryPath { submits, per_entry, users, accounts } => {
            entry::run(submits.max(1), per_entry, users, accounts)
        }
        Bench::GrpcFloor { load } => {
            let (clients, conns, seconds) = load.get();
            floor::bench(clients, conns, seconds).await
        }
        Bench::FloorServe { addr } => floor::serve(addr).await,
        Bench::Replay { jobs, days, nodes, gpus } => replay::run(jobs, days, nodes.max(1), gpus.clamp(1, 64)),
        Bench::Usage { gpus, runs, ticks, interval_s } => {
            usage::run(gpus, runs, ticks, std::time::Duration::from_secs(interval_s.max(1)))
        }
        Bench::Agents {
            nodes,
            gpus,
            controllers,
            agents_per_connection,
            steady_s,
            submit_rate,
            run_s,
            fill,
            kill_agents,
            heartbeat_ms,
            node_timeout_ms,
            check,
        } => {
            let o = agents::Options {
                nodes: nodes.max(1),
                gpus: gpus.clamp(1, 64),
                controllers,
                agents_per_connection,
                steady_s,
                submit_rate,
                run_s,
                fill: fill.unwrap_or(nodes),
                kill_agents,
                heartbeat_ms,
                node_timeout_ms,
                check,
            };
            agents::bench_agents(o).await
        }
        Bench::Failover { controllers, rounds, clients } => {
            if controllers < 3 {
                eprintln!("kairos-bench: failover needs at least 3 controllers");
                std::process::exit(2);
            }
            failover::bench_failover(controllers, rounds.max(1), clients.max(1)).await
        }
    };
    match result {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!("kairos-bench: {e:#}");
            std::process::exit(1);
        }
    }
}
