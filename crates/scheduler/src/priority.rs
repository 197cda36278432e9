//! Multifactor priority (Slurm's priority/multifactor) and fairshare, in fixed-point integers
//! so every replica computes the same numbers.
//!
//! ```text
//!   priority = ( w_qos·qos + w_age·age + w_fairshare·fairshare + w_size·size + w_part·partition ) / ONE
//!   each factor in [0, ONE]:  qos = qos priority / highest qos priority
//!                             age = min(waited, age_max) / age_max
//!                             fairshare = 2^(−usage_share / shares_share)   (account tree aware)
//!                             size = gpus / largest node's gpus
//!                             partition = its priority tier / highest tier
//! ```
//!
//! Usage is GPU-milliseconds charged to a job's account and every ancestor when a run ends,
//! decayed with a half-life: `usage · 2^(−Δt / half_life)`. Both powers of two use `pow2_neg`,
//! an integer approximation (table of 2^(−i/16) plus linear interpolation).

use std::collections::BTreeMap;

use crate::model::Job;
use crate::policy::{Policy, Qos};
use crate::state::ClusterState;

pub use crate::policy::PriorityWeights;
pub use crate::state::usage::{pow2_neg, AccountUsage, ONE};

/// A job's priority and its factors, for `kairos priority`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Factors {
    pub priority: i64,
    pub qos: u64,
    pub age: u64,
    pub fairshare: u64,
    pub job_size: u64,
    pub partition: u64,
}

/// The fairshare factor of every account, in Q16.
///
/// Account tree aware: an account's normalised shares are its share of its siblings' shares
/// times its parent's normalised shares; its normalised usage is its usage over the whole
/// cluster's usage. Factor = 2^(−usage_norm / shares_norm). An account not reachable from a
/// root (a missing parent; a cycle, which validation refuses) has none (`Prioritizer` then
/// uses ONE). O(accounts · log accounts): every sibling sum is made once.
pub fn fairshare_factors(state: &ClusterState) -> BTreeMap<String, u64> {
    let policy = &state.policy;
    let mut sums: BTreeMap<Option<&str>, u128> = BTreeMap::new();
    for a in policy.accounts.values() {
        *sums.entry(a.parent.as_deref()).or_default() += u128::from(a.shares);
    }
    let siblings = |parent: Option<&str>| sums.get(&parent).copied().unwrap_or(0).max(1);
    let total = TotalUsage::of(state);
    let mut norm: BTreeMap<&str, u128> = BTreeMap::new();
    policy
        .accounts
        .keys()
        .filter_map(|name| {
            let shares = normalised_shares(policy, name, &siblings, &mut norm)?;
            Some((name.clone(), total.factor(state, name, shares)))
        })
        .collect()
}

/// The fairshare factor of `account` alone (ONE when it has none), equal to its entry in
/// `fairshare_factors` but O(depth · accounts): for one job's priority (an API answer), not a
/// planning pass.
pub fn fairshare_factor(state: &ClusterState, account: &str) -> u64 {
    let policy = &state.policy;
    let siblings = |parent: Option<&str>| {
        policy
            .accounts
            .values()
            .filter(|s| s.parent.as_deref() == parent)
            .map(|s| u128::from(s.shares))
            .sum::<u128>()
            .max(1)
    };
    match normalised_shares(policy, account, &siblings, &mut BTreeMap::new()) {
        Some(shares) => TotalUsage::of(state).factor(state, account, shares),
        None => ONE,
    }
}

/// The normalised shares of `name` (Q16): `norm(parent) · shares / siblings(parent)`, a root's
/// parent counting ONE, truncated level by level from the root down. Remembers every account
/// it computes in `memo`. None for an account not reachable from a root.
fn normalised_shares<'p>(
    policy: &'p crate::policy::Policy,
    name: &str,
    siblings: &dyn Fn(Option<&str>) -> u128,
    memo: &mut BTreeMap<&'p str, u128>,
) -> Option<u128> {
    // Up from `name` to a root or to an ancestor already known.
    let mut chain = Vec::new();
    let mut at = name;
    let mut above = u128::from(ONE);
    loop {
        if let Some(known) = memo.get(at) {
            above = *known;
            break;
        }
        let (key, account) = policy.accounts.get_key_value(at)?;
        if chain.len() >= policy.accounts.len() {
            return None; // a cycle
        }
        chain.push((key.as_str(), account));
        match &account.parent {
            None => break,
            Some(parent) => at = parent,
        }
    }
    for (key, account) in chain.into_iter().rev() {
        above = above * u128::from(account.shares) / siblings(account.parent.as_deref());
        memo.insert(key, above);
    }
    Some(above)
}

/// The whole cluster's decayed usage (its roots'), which every account's is normalised by.
struct TotalUsage(u128);

impl TotalUsage {
    fn of(state: &ClusterState) -> TotalUsage {
        let roots = state.policy.accounts.values().filter(|a| a.parent.is_none());
        TotalUsage(roots.map(|a| usage_of(state, &a.name)).sum())
    }

    /// 2^(−usage_norm / shares_norm) in Q16; ONE while nothing was used anywhere.
    fn factor(&self, state: &ClusterState, account: &str, shares: u128) -> u64 {
        match (usage_of(state, account) * u128::from(ONE)).checked_div(self.0) {
            None => ONE,
            Some(usage_norm) => {
                let x = usage_norm * u128::from(ONE) / shares.max(1);
                pow2_neg(x.min(u128::from(u64::MAX)) as u64)
            }
        }
    }
}

fn usage_of(state: &ClusterState, account: &str) -> u128 {
    let half_life = state.policy.weights.fairshare_half_life_s;
    state.usage.get(account).map(|u| u.at(state.now_ms, half_life)).unwrap_or(0)
}

/// What priority depends on, for one job.
pub(crate) struct Of<'a> {
    pub qos: Option<&'a Qos>,
    /// The priority tier of the partition the job names (None when it names none).
    pub tier: Option<u32>,
    /// Its account's fairshare factor.
    pub fairshare: u64,
    pub submit_time_ms: i64,
    /// GPUs of all tasks as submitted.
    pub gpus: u32,
}

/// Computes job priorities for one planning pass.
pub struct Prioritizer<'a> {
    policy: &'a Policy,
    now_ms: i64,
    qos_max: i64,
    largest_node_gpus: u32,
    fairshare: BTreeMap<String, u64>,
    tier_max: u32,
}

impl<'a> Prioritizer<'a> {
    /// For any job: every account's fairshare factor (a planning pass, a list of jobs).
    pub fn new(state: &'a ClusterState) -> Self {
        Self::with_fairshare(state, fairshare_factors(state))
    }

    /// For jobs of `account` only (others get ONE for fairshare): one job's priority in an
    /// answer, without every account's factor.
    pub fn for_account(state: &'a ClusterState, account: &str) -> Self {
        Self::with_fairshare(state, [(account.to_string(), fairshare_factor(state, account))].into())
    }

    fn with_fairshare(state: &'a ClusterState, fairshare: BTreeMap<String, u64>) -> Self {
        let qos_max = state.policy.qos.values().map(|q| q.priority).max().unwrap_or(1).max(1);
        Prioritizer {
            policy: &state.policy,
            now_ms: state.now_ms,
            qos_max,
            largest_node_gpus: state.largest_node_gpus().max(1),
            fairshare,
            tier_max: state.policy.partitions.values().map(|p| p.priority_tier).max().unwrap_or(1).max(1),
        }
    }

    pub fn factors(&self, job: &Job) -> Factors {
        let tier = self.policy.partitions.get(&job.spec.partition).map(|p| p.priority_tier);
        let of = Of {
            qos: self.policy.qos(&job.spec.qos),
            tier,
            fairshare: self.fairshare_of(&job.spec.account),
            submit_time_ms: job.submit_time_ms,
            gpus: job.spec.total_gpus(),
        };
        self.compute(&of)
    }

    /// The fairshare factor of `account` (ONE for an account without one).
    pub(crate) fn fairshare_of(&self, account: &str) -> u64 {
        self.fairshare.get(account).copied().unwrap_or(ONE)
    }

    /// The factors of a job described by `of` (its names already looked up).
    pub(crate) fn compute(&self, of: &Of) -> Factors {
        let (job_qos, tier) = (of.qos, of.tier);
        let w = &self.policy.weights;
        let qos_priority = job_qos.map(|q| q.priority).unwrap_or(0).max(0);
        let qos = (qos_priority as u64 * ONE) / self.qos_max as u64;
        let waited = self.now_ms.saturating_sub(of.submit_time_ms).max(0) as u64;
        let age_max_ms = w.age_max_s.max(1) * 1000;
        let age = waited.min(age_max_ms) * ONE / age_max_ms;
        let fairshare = of.fairshare;
        let job_size = (u64::from(of.gpus).min(u64::from(self.largest_node_gpus)) * ONE)
            / u64::from(self.largest_node_gpus);
        let tier = tier.unwrap_or(0);
        let partition = u64::from(tier.min(self.tier_max)) * ONE / u64::from(self.tier_max);
        let sum = u64::from(w.qos) * qos
            + u64::from(w.age) * age
            + u64::from(w.fairshare) * fairshare
            + u64::from(w.job_size) * job_size
            + u64::from(w.partition) * partition;
        Factors { priority: (sum / ONE) as i64, qos, age, fairshare, job_size, partition }
    }

    pub fn priority(&self, job: &Job) -> i64 {
        self.factors(job).priority
    }

    /// The priority a job shows: its multifactor priority now while it waits, else the one it
    /// started with.
    pub fn shown(&self, job: &Job) -> i64 {
        if job.state == crate::model::JobState::Pending {
            self.priority(job)
        } else {
            job.priority
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pow2_neg_is_close_to_the_real_thing() {
        for i in 0..400u64 {
            let x = i * ONE / 37;
            let exact = 2f64.powf(-(x as f64) / ONE as f64) * ONE as f64;
            let got = pow2_neg(x) as f64;
            assert!((got - exact).abs() <= 2.0 + exact * 0.0005, "2^-{x}: {got} vs {exact}");
        }
        assert_eq!(pow2_neg(0), ONE);
        assert_eq!(pow2_neg(ONE), ONE / 2);
        assert_eq!(pow2_neg(100 * ONE), 0);
    }

    #[test]
    fn usage_halves_every_half_life() {
        let mut u = AccountUsage::default();
        u.charge(1_000_000, 0, 3600);
        assert_eq!(u.at(0, 3600), 1_000_000);
        assert_eq!(u.at(3_600_000, 3600), 500_000);
        assert_eq!(u.at(7_200_000, 3600), 250_000);
        u.charge(250_000, 7_200_000, 3600);
        assert_eq!(u.at(7_200_000, 3600), 500_000);
    }

    /// The factors as first written (every account's sibling sum rescanned, passes over the
    /// accounts until no more resolve): the meaning `fairshare_factors` must keep.
    fn reference_factors(state: &ClusterState) -> BTreeMap<String, u64> {
        let policy = &state.policy;
        let usage = |name: &str| usage_of(state, name);
        let total: u128 =
            policy.accounts.values().filter(|a| a.parent.is_none()).map(|a| usage(&a.name)).sum();
        let mut norm: BTreeMap<String, u128> = BTreeMap::new();
        let mut pending: Vec<&str> = policy.accounts.values().map(|a| a.name.as_str()).collect();
        while !pending.is_empty() {
            let before = pending.len();
            pending.retain(|name| {
                let a = &policy.accounts[*name];
                let parent_norm = match &a.parent {
                    None => u128::from(ONE),
                    Some(p) => match norm.get(p) {
                        Some(n) => *n,
                        None => return true,
                    },
                };
                let siblings: u128 = policy
                    .accounts
                    .values()
                    .filter(|s| s.parent == a.parent)
                    .map(|s| u128::from(s.shares))
                    .sum::<u128>()
                    .max(1);
                norm.insert(a.name.clone(), parent_norm * u128::from(a.shares) / siblings);
                false
            });
            if pending.len() == before {
                break;
            }
        }
        norm.iter()
            .map(|(name, shares)| {
                let factor = match (usage(name) * u128::from(ONE)).checked_div(total) {
                    None => ONE,
                    Some(usage_norm) => {
                        let x = usage_norm * u128::from(ONE) / (*shares).max(1);
                        pow2_neg(x.min(u128::from(u64::MAX)) as u64)
                    }
                };
                (name.clone(), factor)
            })
            .collect()
    }

    /// Accounts `a0..`: each names as parent nothing (a root), an account (possibly itself or a
    /// later one: cycles), or one that does not exist; some with usage.
    fn accounts_state(accounts: &[(Option<usize>, u32, u64)]) -> ClusterState {
        let mut state = ClusterState::new();
        state.policy.accounts.clear();
        state.now_ms = 5_000_000;
        for (i, (parent, shares, used)) in accounts.iter().enumerate() {
            let name = format!("a{i}");
            let parent =
                parent.map(|p| if p >= accounts.len() + 2 { "ghost".to_string() } else { format!("a{p}") });
            let account = crate::policy::Account {
                name: name.clone(),
                parent,
                shares: *shares,
                users: Default::default(),
                qos: Default::default(),
                user_qos: Default::default(),
                guarantee: None,
            };
            state.policy.accounts.insert(name.clone(), account);
            if *used > 0 {
                let mut u = AccountUsage::default();
                u.charge(u128::from(*used), 1_000_000 + i as i64 * 1000, 3600);
                state.usage.insert(name, u);
            }
        }
        state
    }

    proptest::proptest! {
        /// Every account's factor is the first algorithm's, and one account's alone is its
        /// entry in the whole table (ONE for an account without one, or unknown).
        #[test]
        fn factors_keep_their_meaning_and_one_account_s_is_its_entry(
            accounts in proptest::collection::vec(
                (proptest::option::weighted(0.8, 0usize..14), 0u32..6, proptest::prop_oneof![proptest::strategy::Just(0u64), 0u64..50_000_000]),
                1..12,
            )
        ) {
            let state = accounts_state(&accounts);
            let all = fairshare_factors(&state);
            proptest::prop_assert_eq!(&all, &reference_factors(&state));
            for name in state.policy.accounts.keys().map(String::as_str).chain(["ghost", "a99"]) {
                proptest::prop_assert_eq!(fairshare_factor(&state, name), all.get(name).copied().unwrap_or(ONE), "{}", name);
            }
        }
    }

    #[test]
    fn a_child_s_factor_falls_with_its_usage_against_its_share_of_its_parent() {
        // root ─┬─ a (3 shares, used 3/4 of all) ── a's only child c
        //       └─ b (1 share, used 1/4)
        let state = accounts_state(&[(None, 1, 0), (Some(0), 3, 0), (Some(0), 1, 0), (Some(1), 1, 0)]);
        let mut state = state;
        for (name, used) in [("a0", 4_000_000u128), ("a1", 3_000_000), ("a2", 1_000_000), ("a3", 3_000_000)] {
            state.usage.insert(name.into(), AccountUsage { gpu_ms: used, as_of_ms: state.now_ms });
        }
        let all = fairshare_factors(&state);
        // a1: usage 3/4 over shares 3/4 → 2^-1; a2: 1/4 over 1/4 → 2^-1; a3 as its parent a1.
        assert_eq!(all["a1"], ONE / 2);
        assert_eq!(all["a2"], ONE / 2);
        assert_eq!(all["a3"], ONE / 2);
        assert_eq!(all["a0"], ONE / 2);
        assert_eq!(fairshare_factor(&state, "a3"), ONE / 2);
    }
}
