//! A leader that sends but hears no replies (`kairos_consensus::quorumcheck`), on the simulated
//! network: the others replace it, and it follows once it hears them again.

use std::time::Duration;

use kairos_consensus::ReplicaId;

use super::{world, Config};

/// The leader no replica has moved past, its term, and whether it applied an entry of that term
/// (its election's blank entry committed).
fn leading(w: &super::World) -> Option<(ReplicaId, u64, bool)> {
    let (id, r) = w.current_leader()?;
    let m = r.raft.metrics().borrow().clone();
    let committed = m.last_applied.is_some_and(|l| l.leader_id.term == m.current_term);
    Some((id, m.current_term, committed))
}

async fn until<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if let Some(v) = f() {
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

#[test]
fn a_leader_whose_replies_are_cut_is_replaced_and_follows_when_they_return() {
    // Without the quorum check no other replica leads within 10 s in any of these: the cut-off
    // leader's appends (each a timeout, retried at once, as over `kairos_consensus::network`)
    // keep resetting the others' election timers. With it, about 1.7 s.
    for (seed, replicas) in [(2, 3), (1, 5)] {
        replace_the_deaf_leader(seed, replicas);
    }
}

fn replace_the_deaf_leader(seed: u64, replicas: ReplicaId) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build();
    let Ok(rt) = rt else { panic!("a runtime") };
    rt.block_on(async {
        let w = world(seed, Config { replicas: replicas as usize, ..Config::default() });
        for id in 1..=replicas {
            w.start_replica(id, false).await.expect("replica starts");
        }
        let first = until(Duration::from_secs(10), || leading(&w).filter(|l| l.2)).await;
        let (old, term, _) = first.expect("a leader is elected");
        // Everything sent to the leader is lost; what it sends still arrives.
        let cut_at = w.elapsed_ms();
        {
            let mut net = super::net::lock(&w.net);
            for other in (1..=replicas).filter(|o| *o != old) {
                net.cut.insert((other, old));
            }
        }
        let next = until(Duration::from_secs(10), || leading(&w).filter(|l| l.0 != old && l.2)).await;
        let (new, new_term, _) =
            next.unwrap_or_else(|| panic!("seed {seed}: no other replica led within 10 s"));
        let took_ms = w.elapsed_ms() - cut_at;
        assert!(new_term > term);
        // Deaf for eight leases (1.2 s), then the others' lease and election run out.
        assert!(took_ms <= 2_500, "seed {seed}: replaced after {took_ms} ms");
        let r_old = w.running().into_iter().find(|(id, _)| *id == old).map(|(_, r)| r).expect("old");
        assert!(r_old.is_leader(), "the cut-off replica still believes it leads (it heard nothing newer)");
        // The replies return: the old leader hears the newer term and follows.
        super::net::lock(&w.net).cut.clear();
        let follows = until(Duration::from_secs(5), || {
            let m = r_old.raft.metrics().borrow().clone();
            (m.current_leader == Some(new) && !r_old.is_leader()).then_some(())
        })
        .await;
        assert!(follows.is_some(), "seed {seed}: the old leader follows {new} after healing");
        for id in 1..=replicas {
            w.crash_replica(id, usize::MAX, false).await;
        }
    });
}
