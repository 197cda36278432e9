//! Policy operations: the whole policy replaced, one QoS or policy item put or deleted — each
//! validated whole, and nothing an unfinished job (or the rest of the policy) refers to may
//! disappear.

use super::*;
use crate::policy::PolicyItem;

impl ClusterState {
    /// Replaces the policy after validating it whole; a QoS still used by an unfinished job
    /// cannot disappear.
    /// `must_exist`: Some(true) refuses a missing piece (NOT_FOUND), Some(false) an existing one.
    pub(super) fn check_exists(
        &self,
        kind: PolicyKind,
        name: &str,
        must_exist: Option<bool>,
    ) -> Option<Outcome> {
        let what = kind.as_str();
        match (must_exist, self.policy.has(kind, name)) {
            (Some(true), false) => {
                Some(Outcome::Rejected(Rejection::NotFound(format!("{what} \"{name}\" not found"))))
            }
            (Some(false), true) => Some(Outcome::Rejected(Rejection::FailedPrecondition(format!(
                "{what} \"{name}\" already exists"
            )))),
            _ => None,
        }
    }

    pub(super) fn set_policy(&mut self, policy: &Policy) -> Outcome {
        if let Err(e) = policy.validate() {
            return Outcome::Rejected(Rejection::Invalid(e.to_string()));
        }
        // Nothing an unfinished job refers to may disappear.
        let unfinished = || self.jobs.values().filter(|j| !j.state.is_terminal());
        let missing = unfinished()
            .find_map(|j| (!policy.qos.contains_key(&j.spec.qos)).then_some(("qos", &j.spec.qos, j.id)))
            .or_else(|| {
                unfinished().find_map(|j| {
                    (!policy.accounts.contains_key(&j.spec.account)).then_some((
                        "account",
                        &j.spec.account,
                        j.id,
                    ))
                })
            })
            .or_else(|| {
                unfinished().find_map(|j| {
                    let gone =
                        !j.spec.partition.is_empty() && !policy.partitions.contains_key(&j.spec.partition);
                    gone.then_some(("partition", &j.spec.partition, j.id))
                })
            });
        if let Some((what, name, job)) = missing {
            return Outcome::Rejected(Rejection::FailedPrecondition(format!(
                "{what} \"{name}\" is in use by job {job}"
            )));
        }
        self.policy = policy.clone();
        // Priorities follow the QoS; pending and running jobs take the new values.
        for job in self.jobs.values_mut().filter(|j| !j.state.is_terminal()) {
            if let Some(q) = self.policy.qos.get(&job.spec.qos) {
                job.priority = q.priority;
            }
        }
        Outcome::PolicyChanged
    }

    pub(super) fn put_qos(&mut self, qos: &Qos, must_exist: Option<bool>) -> Outcome {
        if let Some(refused) = self.check_exists(PolicyKind::Qos, &qos.name, must_exist) {
            return refused;
        }
        let mut policy = self.policy.clone();
        policy.qos.insert(qos.name.clone(), qos.clone());
        self.set_policy(&policy)
    }

    pub(super) fn put_policy_item(&mut self, item: &PolicyItem, must_exist: Option<bool>) -> Outcome {
        if let Some(refused) = self.check_exists(item.kind(), item.name(), must_exist) {
            return refused;
        }
        let mut policy = self.policy.clone();
        policy.put(item);
        self.set_policy(&policy)
    }

    pub(super) fn delete_policy_item(&mut self, kind: PolicyKind, name: &str) -> Outcome {
        if let Some(refused) = self.check_exists(kind, name, Some(true)) {
            return refused;
        }
        let mut policy = self.policy.clone();
        policy.remove(kind, name);
        self.set_policy(&policy)
    }

    /// A QoS goes only when no profile's submit rule, account and other QoS names it.
    pub(super) fn delete_qos(&mut self, name: &str) -> Outcome {
        if let Some(refused) = self.check_exists(PolicyKind::Qos, name, Some(true)) {
            return refused;
        }
        let mut policy = self.policy.clone();
        policy.qos.remove(name);
        let refused = |why: String| Outcome::Rejected(Rejection::FailedPrecondition(why));
        if let Some((profile, _)) = policy.profile_qos.iter().find(|(_, q)| *q == name) {
            return refused(format!(
                "qos \"{name}\" is the default of profile {}; change the submit rule first",
                profile.as_str()
            ));
        }
        if let Some((class, _)) = policy.priority_classes.iter().find(|(_, q)| *q == name) {
            return refused(format!(
                "qos \"{name}\" is what priority class \"{class}\" maps to; change priority_classes first"
            ));
        }
        let lists = |a: &crate::policy::Account| {
            let mut named = std::iter::once(&a.qos).chain(a.user_qos.values());
            named.any(|q| q.allowed.contains(name) || q.default.as_deref() == Some(name))
        };
        if let Some(account) = policy.accounts.values().find(|a| lists(a)) {
            return refused(format!(
                "qos \"{name}\" is allowed by account \"{}\"; change that first",
                account.name
            ));
        }
        if let Some(user) = policy.qos.values().find(|q| q.preempt.iter().any(|p| p == name)) {
            return refused(format!(
                "qos \"{name}\" is preempted by qos \"{}\"; change that first",
                user.name
            ));
        }
        self.set_policy(&policy)
    }
}
