//! The job table: a map by id that remembers which jobs apply changed.
//!
//! Reads go straight to the map (`Deref`). Every mutable access (`get_mut`, `insert`,
//! `values_mut`) records the ids it hands out, so apply can bring the planner's compact index
//! (`crate::brief`) up to date for exactly the jobs a command touched — no hook per field, and
//! no way to change a job without it being seen.

use std::collections::BTreeMap;
use std::ops::Deref;

use serde::{Deserialize, Serialize};

use crate::model::{Job, JobId};

/// Jobs by id (serialized as the plain map).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Jobs {
    map: BTreeMap<JobId, Job>,
    /// Ids handed out mutably since the last `take_touched`.
    #[serde(skip)]
    touched: Vec<JobId>,
}

impl PartialEq for Jobs {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl Eq for Jobs {}

impl Deref for Jobs {
    type Target = BTreeMap<JobId, Job>;

    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl Jobs {
    pub fn get_mut(&mut self, id: &JobId) -> Option<&mut Job> {
        let job = self.map.get_mut(id)?;
        self.touched.push(*id);
        Some(job)
    }

    pub fn insert(&mut self, id: JobId, job: Job) -> Option<Job> {
        self.touched.push(id);
        self.map.insert(id, job)
    }

    /// Removes a job (counts as touched: its brief goes).
    pub fn remove(&mut self, id: &JobId) -> Option<Job> {
        self.touched.push(*id);
        self.map.remove(id)
    }

    /// Every job, mutably (all count as touched).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut Job> {
        self.touched.extend(self.map.keys().copied());
        self.map.values_mut()
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

impl FromIterator<(JobId, Job)> for Jobs {
    fn from_iter<I: IntoIterator<Item = (JobId, Job)>>(iter: I) -> Self {
        Jobs { map: iter.into_iter().collect(), touched: Vec::new() }
    }
}
