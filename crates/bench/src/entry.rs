//! `kairos-bench entry-path`: the per-submit work of the replicated log's data path, in one
//! process, without sockets, disks or threads — so it measures to a few percent where the
//! cluster benches move by tens.
//!
//! Submits shaped as kairosd makes them (the bench's spec, a request id, a trace context,
//! the submit limits) go through each step of a log entry's life, `per_entry` to an entry:
//! - `leader_encode`: each command encoded (the batcher), the entry made from those encodings,
//!   the `AppendEntries` message encoded (the replication client);
//! - `follower_decode`: the message decoded (the Raft service);
//! - `log_record`: the entry's log record encoded (`LogStore::append`, on every replica);
//! - `apply`: every command applied to a state that grows to `submits` jobs (every replica);
//! - `answer`: the new job's priority as the Submit answer reports it (the leader).
//!
//! With `accounts` > 1 the policy has that many fairshare accounts under the root, the users
//! spread over them (a site's account tree), so costs that grow with the policy show.
//!
//! Prints the time of each per submit, as JSON.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use kairos_consensus::{Request, TypeConfig};
use kairos_scheduler::policy::{Account, Policy, ROOT_ACCOUNT};
use kairos_scheduler::priority::Prioritizer;
use kairos_scheduler::quota::SubmitLimits;
use kairos_scheduler::{ClusterState, Command, JobSpec, Op, Outcome};
use openraft::raft::AppendEntriesRequest;
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, Vote};
use serde_json::json;

/// A submit command as kairosd writes it for `kairos-bench submit`'s spec.
fn submit(client: usize, seq: usize, now_ms: i64) -> Command {
    let mut spec = JobSpec::new("bench", &format!("bench-{client}"), vec!["true".into()], 1);
    spec.traceparent = Some(format!("00-{:032x}-{:016x}-01", seq + 1, client + 1).into());
    Command {
        skipped_ms: 0,
        now_ms,
        op: Op::Submit {
            spec,
            request_id: Some(format!("bench-{client}-{seq}")),
            hold: false,
            limits: Some(SubmitLimits { max_jobs_per_user: 1_000_000, max_jobs: 10_000_000, any_qos: false }),
        },
    }
}

fn per_submit_us(d: Duration, submits: usize) -> f64 {
    (d.as_secs_f64() * 1e6 / submits.max(1) as f64 * 100.0).round() / 100.0
}

/// The default policy with `accounts` accounts under the root (none added for 1), users
/// `bench-0..users` spread over them, every account with at least one user.
fn policy(accounts: usize, users: usize) -> Policy {
    let mut policy = Policy::default();
    if accounts <= 1 {
        return policy;
    }
    for i in 0..accounts {
        let members: std::collections::BTreeSet<String> =
            (i..users).step_by(accounts).map(|u| format!("bench-{u}")).collect();
        let members = if members.is_empty() { [format!("idle-{i}")].into() } else { members };
        let name = format!("acct-{i}");
        let account = Account {
            name: name.clone(),
            parent: Some(ROOT_ACCOUNT.into()),
            shares: 1 + (i % 7) as u32,
            users: members,
            qos: Default::default(),
            user_qos: Default::default(),
            guarantee: None,
        };
        policy.accounts.insert(name, account);
    }
    policy
}

pub fn run(
    submits: usize,
    per_entry: usize,
    clients: usize,
    accounts: usize,
) -> anyhow::Result<serde_json::Value> {
    let clients = clients.max(1);
    let commands: Vec<Command> =
        (0..submits).map(|i| submit(i % clients, i / clients, 1_000 + i as i64)).collect();
    let mut out = measure(policy(accounts, clients), &commands, per_entry)?;
    out["users"] = json!(clients);
    out["accounts"] = json!(accounts.max(1));
    Ok(out)
}

/// Takes `commands` (submits, every one of which must be admitted) through the data path in
/// entries of `per_entry`.
fn measure(policy: Policy, commands: &[Command], per_entry: usize) -> anyhow::Result<serde_json::Value> {
    let per_entry = per_entry.max(1);
    let submits = commands.len();
    let batches: Vec<Vec<Command>> = commands.chunks(per_entry).map(<[Command]>::to_vec).collect();

    let t = Instant::now();
    let messages = leader_appends(&batches)?;
    let leader_encode = t.elapsed();

    let t = Instant::now();
    let entries = follower_entries(&messages)?;
    let follower_decode = t.elapsed();

    let t = Instant::now();
    let record_bytes = log_records(&entries)?;
    let log_record = t.elapsed();

    let applied = apply_and_answer(policy, &entries, submits)?;
    // A new job each: a refused submit or a retry answered with an earlier job is not the work.
    let submitted = applied.jobs;
    if submitted != submits {
        bail!("{submitted} of {submits} submits were admitted: the bench's commands are not what kairosd writes");
    }

    Ok(json!({
        "bench": "entry-path",
        "submits": submits,
        "per_entry": per_entry,
        "us_per_submit": {
            "leader_encode": per_submit_us(leader_encode, submits),
            "follower_decode": per_submit_us(follower_decode, submits),
            "log_record": per_submit_us(log_record, submits),
            "apply": per_submit_us(applied.apply, submits),
            "answer": per_submit_us(applied.answer, submits),
        },
        "priority_sum": applied.priorities,
        "append_bytes_per_submit": messages.iter().map(Vec::len).sum::<usize>() / submits.max(1),
        "log_bytes_per_submit": record_bytes / submits.max(1),
    }))
}

/// The leader's step: each batch made an entry (from its commands' encodings, as the batcher
/// does) and the append carrying it encoded, one per entry.
fn leader_appends(batches: &[Vec<Command>]) -> anyhow::Result<Vec<Vec<u8>>> {
    let vote = Vote::new_committed(1, 1);
    let log_id = |index: u64| LogId::new(CommittedLeaderId::new(1, 1), index);
    let mut messages = Vec::with_capacity(batches.len());
    for (i, batch) in batches.iter().enumerate() {
        let encoded: Vec<Vec<u8>> = batch
            .iter()
            .map(|c| serde_json::to_vec(c).context("encoding a command"))
            .collect::<Result<_, _>>()?;
        let entry = Entry::<TypeConfig> {
            log_id: log_id(i as u64 + 2),
            payload: EntryPayload::Normal(Request::with_encoded(batch.clone(), &encoded)),
        };
        let append = AppendEntriesRequest::<TypeConfig> {
            vote,
            prev_log_id: Some(log_id(i as u64 + 1)),
            entries: vec![entry],
            leader_commit: Some(log_id(i as u64)),
        };
        messages.push(serde_json::to_vec(&append).context("encoding an append")?);
    }
    Ok(messages)
}

/// The follower's step: the appends decoded, their entries in order.
fn follower_entries(messages: &[Vec<u8>]) -> anyhow::Result<Vec<Entry<TypeConfig>>> {
    let mut entries = Vec::with_capacity(messages.len());
    for m in messages {
        let append: AppendEntriesRequest<TypeConfig> =
            serde_json::from_slice(m).context("decoding an append")?;
        entries.extend(append.entries);
    }
    Ok(entries)
}

/// The log's step: each entry encoded as its record; the bytes of them all.
fn log_records(entries: &[Entry<TypeConfig>]) -> anyhow::Result<usize> {
    let mut record_bytes = 0;
    for e in entries {
        record_bytes += serde_json::to_vec(e).context("encoding a log record")?.len();
    }
    Ok(record_bytes)
}

/// What applying the entries took and gave.
struct Applied {
    /// Time in `ClusterState::apply`.
    apply: Duration,
    /// Time making the answers (each new job's priority, as a submit's reply has it).
    answer: Duration,
    /// Jobs newly submitted.
    jobs: usize,
    /// The sum of their priorities (so the answers are not optimised away).
    priorities: i64,
}

/// The state machine's step: `policy` set, then the entries' commands applied in order and
/// each new job answered with its priority.
fn apply_and_answer(
    policy: Policy,
    entries: &[Entry<TypeConfig>],
    submits: usize,
) -> anyhow::Result<Applied> {
    let mut state = ClusterState::new();
    if let outcome @ Outcome::Rejected(_) =
        state.apply(&Command { skipped_ms: 0, now_ms: 1, op: Op::SetPolicy { policy, audit: None } })
    {
        bail!("the bench's policy was refused: {outcome:?}");
    }
    let (mut apply, mut answer) = (Duration::ZERO, Duration::ZERO);
    let mut jobs = std::collections::HashSet::with_capacity(submits);
    let mut priorities = 0i64;
    for e in entries {
        if let EntryPayload::Normal(req) = &e.payload {
            let t = Instant::now();
            let outcomes: Vec<Outcome> = req.commands.iter().map(|cmd| state.apply(cmd)).collect();
            apply += t.elapsed();
            let t = Instant::now();
            for outcome in outcomes {
                if let Outcome::Submitted { job } = outcome {
                    if jobs.insert(job) {
                        let job = state.jobs.get(&job).context("a submitted job is missing")?;
                        priorities = priorities
                            .wrapping_add(Prioritizer::for_account(&state, &job.spec.account).priority(job));
                    }
                }
            }
            answer += t.elapsed();
        }
    }
    Ok(Applied { apply, answer, jobs: jobs.len(), priorities })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_submit_goes_through_every_step_and_is_admitted() {
        let out = super::run(300, 22, 8, 5).unwrap();
        assert_eq!(out["submits"], 300);
        for step in ["leader_encode", "follower_decode", "log_record", "apply", "answer"] {
            assert!(out["us_per_submit"][step].as_f64().unwrap() > 0.0, "{step}: {out}");
        }
        assert!(out["append_bytes_per_submit"].as_u64().unwrap() > 100, "{out}");
    }

    #[test]
    fn a_submit_the_state_refuses_fails_the_bench() {
        let mut commands: Vec<_> = (0..5).map(|i| super::submit(0, i, 1_000)).collect();
        // The same request id again: answered with the first job, not admitted as a new one.
        commands.push(super::submit(0, 0, 1_000));
        let err = super::measure(super::policy(1, 1), &commands, 2).unwrap_err().to_string();
        assert!(err.contains("5 of 6 submits"), "{err}");
    }
}
