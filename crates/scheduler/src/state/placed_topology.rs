//! A placement against the topology: the domains a gang's nodes are in at its level, the
//! re-check of a required ask apply makes (`check_placement`), what the `allocated` event says,
//! and the replicated count of gangs placed across more domains than they needed.

use serde::{Deserialize, Serialize};

use super::*;

/// Gangs placed against a topology level, and those across more of its domains than the
/// fewest that could hold them (`kairos_gangs_placed_total`, `kairos_gangs_spread_total`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GangSpread {
    pub placed: u64,
    pub spread: u64,
}

impl GangSpread {
    pub fn is_empty(&self) -> bool {
        self.placed == 0
    }
}

/// Where a placement lies at its topology level.
pub(crate) struct Placed {
    /// As the `allocated` event says it: `rack r1`, `racks r1, r2 (...)`.
    pub(crate) note: String,
    pub(crate) level: String,
    pub(crate) domains: usize,
}

impl ClusterState {
    /// A gang's domains at its topology level (its ask's, else the lowest named level), as
    /// its `allocated` event says them; an error where a required ask that still binds is
    /// broken (a node outside any domain of the level, or more domains than it allows).
    pub(super) fn placement_domains(&self, job: &Job, p: &Placement) -> Result<Option<Placed>, String> {
        let ask = job.spec.topology.as_deref();
        let level = match ask {
            Some(a) => match self.topology.level_of(a) {
                Some(l) => l,
                None => return Ok(None),
            },
            None if p.more.is_empty() => return Ok(None),
            None => match self.topology.levels.first() {
                Some(l) => l.as_str(),
                None => return Ok(None),
            },
        };
        let mut domains: Vec<&str> = Vec::new();
        for (name, _) in p.tasks() {
            let labels = self.nodes.get(name).map(|n| &n.info.labels);
            let domain = labels.and_then(|l| self.topology.domain(name, l, level));
            // One node is one place: only a gang's nodes must share a domain.
            let binds = !p.more.is_empty() && ask.is_some_and(|a| a.binds(job.submit_time_ms, self.now_ms));
            match domain {
                None if binds => return Err(format!("node \"{name}\" is in no {level}, which it requires")),
                None => {}
                Some(d) if !domains.contains(&d) => domains.push(d),
                Some(_) => {}
            }
        }
        if let Some(a) = ask.filter(|a| a.binds(job.submit_time_ms, self.now_ms)) {
            if domains.len() > a.max_domains as usize {
                return Err(format!(
                    "its tasks span {} {level}s, it requires at most {}",
                    domains.len(),
                    a.max_domains
                ));
            }
        }
        let mut note = match domains.as_slice() {
            [] => return Ok(None),
            [one] => format!("{level} {one}"),
            many if ask.is_some_and(|a| a.binds(job.submit_time_ms, self.now_ms)) => {
                format!(
                    "{level}s {} (at most {} required)",
                    many.join(", "),
                    ask.map_or(1, |a| a.max_domains)
                )
            }
            many => format!("{level}s {} (preferred: no one {level} had room)", many.join(", ")),
        };
        if ask.is_some_and(|a| a.required && !a.binds(job.submit_time_ms, self.now_ms)) {
            note.push_str(&format!("; required {level} relaxed to preferred after its wait"));
        }
        Ok(Some(Placed { note, level: level.to_string(), domains: domains.len() }))
    }

    /// Counts a gang of `tasks` placed across `placed.domains` domains against the fewest that
    /// could hold it (ceil(tasks / the largest domain's nodes)).
    pub(super) fn count_gang(&mut self, placed: &Placed, tasks: usize) {
        if tasks < 2 {
            return;
        }
        let mut sizes: BTreeMap<&str, usize> = BTreeMap::new();
        for (name, n) in &self.nodes {
            if let Some(d) = self.topology.domain(name, &n.info.labels, &placed.level) {
                *sizes.entry(d).or_default() += 1;
            }
        }
        let largest = sizes.into_values().max().unwrap_or(1).max(1);
        self.gang_spread.placed += 1;
        if placed.domains > tasks.div_ceil(largest) {
            self.gang_spread.spread += 1;
        }
    }
}
