//! Team guarantees with borrowing and reclaim (Kueue's `nominalQuota` in a cohort, with
//! `borrowingLimit`, `lendingLimit` and `reclaimWithinCohort`; KAI's deserved quota).
//!
//! An account's guarantee covers the jobs of it and of its children (a cohort); a job whose
//! nearest guaranteed account still has room for it is *guaranteed*, any other *borrows* idle
//! GPUs of others. Guaranteed jobs are queued before borrowers (`queue::scan`); a guaranteed
//! job that fits nowhere takes back borrowed GPUs by preempting borrowers through their
//! preempt mode (`planner::preempt`); no preemption by another team ever takes an account
//! below its guarantee (`lendable`, re-checked in apply); borrowing stops at `borrow_limit`,
//! and `lend_limit` keeps the rest of an idle guarantee free for its owner.
//!
//! ```text
//!   policy accounts ──▶ Guarantees::of(state) { per guaranteed account: GPUs held } ──▶
//!       within (mark, queue tier) · borrow_check (admission) · lendable (reclaim budget)
//! ```
//!
//! What an account holds: the GPUs of its (and its children's) runs that are not being
//! stopped, plus what preemptors of it were promised (they are about to hold them).

use std::collections::BTreeMap;

use crate::model::{Job, JobState};
use crate::policy::Policy;
use crate::reasons::PendingReason;

/// The guaranteed accounts of a policy and the GPUs each holds now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Guarantees {
    /// By guaranteed account (index): name, guarantee, borrow and lend limits, GPUs held.
    names: Vec<String>,
    gpus: Vec<u64>,
    borrow_limit: Vec<Option<u64>>,
    lend_limit: Vec<Option<u64>>,
    held: Vec<u64>,
    /// GPUs held by accounts under no guarantee (all borrowed).
    unguaranteed: u64,
    /// Every account → the guaranteed accounts of its chain (itself and its ancestors),
    /// nearest first.
    chains: BTreeMap<String, Vec<usize>>,
}

/// The chain of an account the policy does not name: no guarantee.
const NONE: &[usize] = &[];

impl Guarantees {
    /// The guarantees of `policy`, holding nothing.
    pub fn new(policy: &Policy) -> Guarantees {
        let mut g = Guarantees::default();
        let mut index = BTreeMap::new();
        for a in policy.accounts.values() {
            if let Some(q) = &a.guarantee {
                index.insert(a.name.clone(), g.names.len());
                g.names.push(a.name.clone());
                g.gpus.push(u64::from(q.gpus));
                g.borrow_limit.push(q.borrow_limit.map(u64::from));
                g.lend_limit.push(q.lend_limit.map(u64::from));
                g.held.push(0);
            }
        }
        if g.names.is_empty() {
            return g;
        }
        for name in policy.accounts.keys() {
            let chain = policy.account_chain(name).iter().filter_map(|a| index.get(a).copied()).collect();
            g.chains.insert(name.clone(), chain);
        }
        g
    }

    /// Counts what `job` holds for its account (a run not being stopped, or a preemptor's
    /// claim).
    pub fn count(&mut self, job: &Job) {
        if let Some(gpus) = holding(job) {
            self.add(&job.spec.account, gpus);
        }
    }

    /// Per guaranteed account: (name, guarantee, held).
    pub fn teams(&self) -> impl Iterator<Item = (&str, u64, u64)> + '_ {
        (0..self.names.len()).map(|i| (self.names[i].as_str(), self.gpus[i], self.held[i]))
    }

    /// Some account has a guarantee (else nothing here changes what the planner does).
    pub fn active(&self) -> bool {
        !self.names.is_empty()
    }

    fn chain(&self, account: &str) -> &[usize] {
        self.chains.get(account).map_or(NONE, Vec::as_slice)
    }

    /// `gpus` more held by `account`'s jobs.
    pub fn add(&mut self, account: &str, gpus: u64) {
        let chain = self.chains.get(account).map_or(NONE, Vec::as_slice);
        if chain.is_empty() {
            self.unguaranteed += gpus;
        }
        for i in chain {
            self.held[*i] += gpus;
        }
    }

    /// `gpus` fewer held by `account`'s jobs.
    pub fn remove(&mut self, account: &str, gpus: u64) {
        let chain = self.chains.get(account).map_or(NONE, Vec::as_slice);
        if chain.is_empty() {
            self.unguaranteed = self.unguaranteed.saturating_sub(gpus);
        }
        for i in chain {
            self.held[*i] = self.held[*i].saturating_sub(gpus);
        }
    }

    /// The nearest guaranteed account of `account`'s chain (itself or an ancestor).
    pub fn nearest(&self, account: &str) -> Option<&str> {
        self.chain(account).first().map(|&i| self.names[i].as_str())
    }

    /// Whether a job of `account` asking `gpus` more is within its nearest guarantee.
    pub fn within(&self, account: &str, gpus: u64) -> bool {
        self.chain(account).first().is_some_and(|&i| self.held[i] + gpus <= self.gpus[i])
    }

    /// Whether `gpus` more for `account` stay within every borrow limit of its chain.
    pub fn borrow_check(&self, account: &str, gpus: u64) -> Result<(), PendingReason> {
        for &i in self.chain(account) {
            if let Some(limit) = self.borrow_limit[i] {
                if self.held[i] + gpus > self.gpus[i] + limit {
                    return Err(PendingReason::AccountBorrowLimit(self.names[i].clone()));
                }
            }
        }
        Ok(())
    }

    /// GPUs kept idle for their owners from a borrower of `account`: per guaranteed account
    /// outside its chain with a lend limit, what of its idle guarantee it does not lend.
    pub fn kept_from(&self, account: &str) -> u64 {
        let chain = self.chain(account);
        (0..self.names.len())
            .filter(|i| !chain.contains(i))
            .filter_map(|i| {
                Some(self.gpus[i].saturating_sub(self.held[i]).saturating_sub(self.lend_limit[i]?))
            })
            .sum()
    }

    /// How many GPUs a preemptor of account `to` may take from jobs of account `from`: what
    /// `from` holds beyond its guarantee, at each guaranteed account of its chain that `to`
    /// is not in (the cohort they share gives nothing up); unbounded where none is (a team
    /// without a guarantee only borrows, and inside one cohort its QoS rules decide).
    pub fn lendable(&self, from: &str, to: &str) -> u64 {
        let to = self.chain(to);
        self.chain(from)
            .iter()
            .filter(|i| !to.contains(i))
            .map(|&i| self.held[i].saturating_sub(self.gpus[i]))
            .min()
            .unwrap_or(u64::MAX)
    }

    /// Counts `gpus` more given up by a victim of account `from` to a preemptor of account
    /// `to` in one preemption (`taken`: what it took so far, per guaranteed account), if every
    /// guaranteed account of `from`'s chain outside `to`'s keeps its guarantee; else false and
    /// nothing counted. The planner and apply both judge a preemption's victims with it.
    pub fn take(&self, taken: &mut BTreeMap<usize, u64>, from: &str, to: &str, gpus: u64) -> bool {
        let to = self.chain(to);
        let outside: Vec<usize> = self.chain(from).iter().copied().filter(|i| !to.contains(i)).collect();
        let room = |i: usize| self.held[i].saturating_sub(self.gpus[i]);
        if outside.iter().any(|&i| taken.get(&i).copied().unwrap_or(0) + gpus > room(i)) {
            return false;
        }
        for i in outside {
            *taken.entry(i).or_default() += gpus;
        }
        true
    }

    /// Whether taking from `from` for `to` is reclaim across teams (some guaranteed account of
    /// `from`'s chain is not `to`'s, or `from` has none while `to` has one).
    pub fn across(&self, from: &str, to: &str) -> bool {
        let to_chain = self.chain(to);
        let from_chain = self.chain(from);
        from_chain.iter().any(|i| !to_chain.contains(i)) || (from_chain.is_empty() && !to_chain.is_empty())
    }

    /// Some team holds more than its guarantee, or some account without one holds GPUs: there
    /// is something to reclaim.
    pub fn borrowed_anywhere(&self) -> bool {
        self.unguaranteed > 0 || (0..self.names.len()).any(|i| self.held[i] > self.gpus[i])
    }

    /// GPUs `account` holds beyond its nearest guarantee (all it holds without one).
    pub fn over(&self, account: &str) -> u64 {
        match self.chain(account).first() {
            Some(&i) => self.held[i].saturating_sub(self.gpus[i]),
            None => u64::MAX,
        }
    }

    /// For a borrower's event: its team's guarantee and what it holds with the borrower
    /// ("account a holds 6 GPUs, 4 guaranteed"; "account x has no guarantee").
    pub fn borrow_note(&self, account: &str) -> String {
        match self.chain(account).first() {
            Some(&i) => {
                format!("account {} holds {} GPUs, {} guaranteed", self.names[i], self.held[i], self.gpus[i])
            }
            None => format!("account {account} has no guarantee"),
        }
    }

    /// Per guaranteed account: what it is guaranteed, holds, borrows and lends. The teams at
    /// the top (no guaranteed ancestor) lend what borrowers hold, shared among their idle
    /// (lendable) guarantees pro rata; inside a cohort lending is not apportioned (0).
    pub fn report(&self) -> Vec<TeamReport> {
        let top = |i: usize| self.chain(&self.names[i]) == [i];
        let lendable = |i: usize| {
            let idle = self.gpus[i].saturating_sub(self.held[i]);
            self.lend_limit[i].map_or(idle, |l| idle.min(l))
        };
        let tops = (0..self.names.len()).filter(|i| top(*i));
        let borrowed: u64 =
            tops.clone().map(|i| self.held[i].saturating_sub(self.gpus[i])).sum::<u64>() + self.unguaranteed;
        let idle: u64 = tops.map(lendable).sum();
        let lent_all = borrowed.min(idle);
        (0..self.names.len())
            .map(|i| TeamReport {
                account: self.names[i].clone(),
                guaranteed: self.gpus[i],
                in_use: self.held[i],
                borrowed: self.held[i].saturating_sub(self.gpus[i]),
                lent: if top(i) && idle > 0 { lent_all * lendable(i) / idle } else { 0 },
            })
            .collect()
    }
}

/// One team's guarantee and use (`Guarantees::report`), in GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TeamReport {
    pub account: String,
    pub guaranteed: u64,
    pub in_use: u64,
    pub borrowed: u64,
    pub lent: u64,
}

/// GPUs a job holds for its account: a run not being stopped, or a preemptor's claim.
fn holding(job: &Job) -> Option<u64> {
    match job.state {
        // A suspended run's lent GPUs are the preemptor's meanwhile.
        JobState::Running | JobState::Suspended => job
            .allocation
            .as_ref()
            .filter(|a| a.stop.is_none())
            .map(|a| u64::from(job.total_gpus()).saturating_sub(a.lent.len() as u64)),
        JobState::Pending => job.claim.as_ref().map(|c| c.tasks().map(|(_, g)| g.len() as u64).sum()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Account, Guarantee};

    /// (name, parent, (guaranteed GPUs, borrow limit, lend limit)).
    type Spec<'a> = (&'a str, Option<&'a str>, Option<(u32, Option<u32>, Option<u32>)>);

    fn policy(accounts: &[Spec]) -> Policy {
        let mut p = Policy::default();
        for (name, parent, g) in accounts {
            let mut a: Account = p.accounts["root"].clone();
            a.name = name.to_string();
            a.parent = parent.map(str::to_string);
            a.guarantee =
                g.map(|(gpus, borrow_limit, lend_limit)| Guarantee { gpus, borrow_limit, lend_limit });
            p.accounts.insert(a.name.clone(), a);
        }
        p.validate().unwrap();
        p
    }

    #[test]
    fn a_cohort_shares_its_parent_guarantee_and_reclaim_stops_at_each_guarantee() {
        let p = policy(&[
            ("a", Some("root"), Some((4, None, None))),
            ("b", Some("root"), Some((4, Some(2), None))),
            ("b1", Some("b"), None),
            ("free", Some("root"), None),
        ]);
        let mut g = Guarantees::new(&p);
        assert!(g.active());
        g.add("a", 6);
        g.add("b1", 2);
        // a is 2 over; b1 shares b's 4 and has 2 of them left.
        assert!(!g.within("a", 1));
        assert!(g.within("b1", 2) && !g.within("b1", 3));
        assert_eq!(g.lendable("a", "b1"), 2);
        // Inside one cohort nothing is reclaimed by guarantee; a team without one lends all.
        assert!(!g.across("b1", "b"));
        assert!(g.across("a", "b1") && g.across("free", "a") && !g.across("free", "root"));
        g.add("free", 3);
        assert_eq!(g.lendable("free", "a"), u64::MAX);
        // b may hold 4 + 2: b1 can borrow 4 more, not 5.
        assert_eq!(g.borrow_check("b1", 4), Ok(()));
        assert_eq!(g.borrow_check("b1", 5), Err(PendingReason::AccountBorrowLimit("b".into())));
        // a borrows 2, free 3: both borrow from b's idle 2 (b lends all it has idle).
        let report = g.report();
        let (a, b) = (&report[0], &report[1]);
        assert_eq!((a.account.as_str(), a.in_use, a.borrowed, a.lent), ("a", 6, 2, 0));
        assert_eq!((b.account.as_str(), b.in_use, b.borrowed, b.lent), ("b", 2, 0, 2));
        g.remove("a", 6);
        assert_eq!(g.lendable("a", "b1"), 0);
    }

    #[test]
    fn a_lend_limit_keeps_the_rest_of_an_idle_guarantee_for_its_owner() {
        let p = policy(&[("a", Some("root"), Some((8, None, Some(2)))), ("b", Some("root"), None)]);
        let mut g = Guarantees::new(&p);
        assert_eq!(g.kept_from("b"), 6);
        assert_eq!(g.kept_from("a"), 0);
        g.add("a", 5);
        assert_eq!(g.kept_from("b"), 1);
    }

    #[test]
    fn guarantees_that_do_not_fit_are_refused() {
        let mut p = policy(&[("a", Some("root"), Some((4, None, None)))]);
        p.accounts.get_mut("a").unwrap().guarantee.as_mut().unwrap().lend_limit = Some(5);
        assert!(matches!(p.validate(), Err(crate::policy::PolicyError::LendOverGuarantee { .. })));
        let mut p =
            policy(&[("a", Some("root"), Some((4, None, None))), ("a1", Some("a"), Some((3, None, None)))]);
        assert_eq!(p.validate(), Ok(()));
        let mut a2 = p.accounts["a1"].clone();
        a2.name = "a2".into();
        p.accounts.insert("a2".into(), a2);
        assert!(matches!(p.validate(), Err(crate::policy::PolicyError::ChildrenOverGuarantee { .. })));
        // Without guarantees nothing is active.
        assert!(!Guarantees::new(&Policy::default()).active());
    }
}
