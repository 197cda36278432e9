//! The job table: a map by id that remembers which jobs apply changed.
//!
//! Reads go straight to the map (`Deref`). Every mutable access (`get_mut`, `insert`,
//! `values_mut`) records the ids it hands out, so apply can bring the planner's compact index
//! (`crate::state::brief`) up to date for exactly the jobs a command touched — no hook per field, and
//! no way to change a job without it being seen.
//!
//! Each job is shared (`Arc`) and copied on write (`Arc::make_mut` on every mutable access): a
//! copy of the table — what a snapshot takes under the state's lock — copies pointers, not jobs,
//! and a job is copied only if it changes while such a copy still holds it.

use std::collections::BTreeMap;
use std::ops::Deref;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::{Job, JobId};

/// Jobs by id (serialized as the plain map).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Jobs {
    map: BTreeMap<JobId, Arc<Job>>,
    /// Ids handed out mutably since the last `take_touched`.
    #[serde(skip)]
    touched: Vec<JobId>,
    /// The nodes the jobs handed out mutably had runs on before (their allocations' nodes),
    /// since the last `take_nodes_before` (`crate::state::changed`); None: every job was.
    #[serde(skip)]
    nodes_before: Option<Vec<String>>,
}

impl PartialEq for Jobs {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl Eq for Jobs {}

impl Deref for Jobs {
    type Target = BTreeMap<JobId, Arc<Job>>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl Jobs {
    // Reads hand out `&Job` (the sharing stays inside): these shadow the map's own.

    pub fn get(&self, id: &JobId) -> Option<&Job> {
        self.map.get(id).map(Arc::as_ref)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Job> + Clone {
        self.map.values().map(Arc::as_ref)
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&JobId, &Job)> + Clone {
        self.map.iter().map(|(id, job)| (id, job.as_ref()))
    }

    pub fn range<R: std::ops::RangeBounds<JobId>>(
        &self,
        range: R,
    ) -> impl DoubleEndedIterator<Item = (&JobId, &Job)> + Clone {
        self.map.range(range).map(|(id, job)| (id, job.as_ref()))
    }

    pub fn get_mut(&mut self, id: &JobId) -> Option<&mut Job> {
        let job = self.map.get_mut(id)?;
        if self.touched.last() != Some(id) {
            note_nodes(&mut self.nodes_before, job);
        }
        self.touched.push(*id);
        Some(Arc::make_mut(job))
    }

    pub fn insert(&mut self, id: JobId, job: Job) -> Option<Job> {
        self.touched.push(id);
        let old = self.map.insert(id, Arc::new(job))?;
        note_nodes(&mut self.nodes_before, &old);
        Some(Arc::unwrap_or_clone(old))
    }

    /// Removes a job (counts as touched: its brief goes).
    pub fn remove(&mut self, id: &JobId) -> Option<Job> {
        self.touched.push(*id);
        let old = self.map.remove(id)?;
        note_nodes(&mut self.nodes_before, &old);
        Some(Arc::unwrap_or_clone(old))
    }

    /// Every job, mutably (all count as touched).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Job> {
        self.touched.extend(self.map.keys().copied());
        self.nodes_before = None;
        self.map.values_mut().map(Arc::make_mut)
    }

    /// The ids handed out mutably since the last `take_touched` (in the order handed out,
    /// possibly repeated).
    pub(crate) fn touched(&self) -> &[JobId] {
        &self.touched
    }

    /// The nodes the jobs handed out mutably since the last call had runs on before (None:
    /// every job was handed out).
    pub(crate) fn take_nodes_before(&mut self) -> Option<Vec<String>> {
        self.nodes_before.replace(Vec::new())
    }

    /// Whether some job was handed out mutably since the last `take_touched`.
    pub fn any_touched(&self) -> bool {
        !self.touched.is_empty()
    }

    /// The ids handed out mutably since the last call (ascending, once each).
    pub(crate) fn take_touched(&mut self) -> Vec<JobId> {
        let mut ids = std::mem::take(&mut self.touched);
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

/// Records the nodes `job`'s allocation has runs on (nothing once every job counts).
fn note_nodes(nodes: &mut Option<Vec<String>>, job: &Job) {
    if let (Some(nodes), Some(a)) = (nodes.as_mut(), job.allocation.as_ref()) {
        nodes.extend(a.tasks().map(|(_, n, _)| n.to_string()));
    }
}

impl FromIterator<(JobId, Job)> for Jobs {
    fn from_iter<I: IntoIterator<Item = (JobId, Job)>>(iter: I) -> Self {
        Jobs {
            map: iter.into_iter().map(|(id, job)| (id, Arc::new(job))).collect(),
            touched: Vec::new(),
            nodes_before: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{ClusterState, Command, Op};

    #[test]
    fn a_copy_of_the_table_shares_its_jobs_until_one_changes() {
        let mut state = ClusterState::new();
        for _ in 0..2 {
            let spec = crate::testing::spec(1, "batch");
            state.apply(&Command {
                skipped_ms: 0,
                now_ms: 1,
                op: Op::Submit { spec, request_id: None, hold: false, limits: None },
            });
        }
        let copy = state.jobs.clone();
        assert!(Arc::ptr_eq(&state.jobs.map[&1], &copy.map[&1]), "a copy copies pointers, not jobs");
        if let Some(job) = state.jobs.get_mut(&1) {
            job.held = true;
        }
        assert!(state.jobs.get(&1).is_some_and(|j| j.held));
        assert!(copy.get(&1).is_some_and(|j| !j.held), "the copy keeps the job as it was");
        assert!(!Arc::ptr_eq(&state.jobs.map[&1], &copy.map[&1]), "the changed job was copied");
        assert!(Arc::ptr_eq(&state.jobs.map[&2], &copy.map[&2]), "the unchanged one is still shared");
        assert_eq!(state.jobs.take_touched(), vec![1], "mutable access is still recorded");
    }
}
