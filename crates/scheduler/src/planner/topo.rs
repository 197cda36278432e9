//! Topology (Kueue's topology-aware scheduling, Slurm's `--switches`): which nodes of a gang's
//! candidates share a domain, the domain a gang goes into — the fullest one that holds it, at
//! the lowest level that can — and, for a preferred ask that fits no one domain, the fewest
//! domains. A required ask never spreads past its `max_domains`; the job waits (`Topology`).

use std::cmp::Reverse;

use super::*;

/// What a job's placement must or should respect, resolved for this pass.
#[derive(Clone, Debug)]
pub(super) struct TopoWant<'a> {
    /// Levels to try, lowest first: the asked one and those above it (default: every level).
    pub(super) levels: Vec<&'a str>,
    /// The asked level binds (a required ask, not yet relaxed by its wait).
    pub(super) required: bool,
    pub(super) max_domains: usize,
}

/// Candidates (free GPUs, node position) grouped by their domain at one level; nodes without
/// one are each their own group (never inside a required domain).
/// A reservation's option: (when it could start, node position, the GPUs it would hold).
/// A place a job could start: (when, node position, GPUs, what frees the last of them).
pub(super) type ResOption = (i64, usize, Vec<GpuIndex>, super::estimate::Cause);

type Groups<'a> = (BTreeMap<&'a str, Vec<(usize, usize)>>, Vec<(usize, usize)>);

impl<'a> Pass<'a> {
    /// The topology a job's placement goes by now, if any: its own ask, else — for a gang on a
    /// cluster with named levels — preferred at the lowest level that fits.
    pub(super) fn topo_want(&self, job: &'a Job) -> Option<TopoWant<'a>> {
        let topo = &self.state.topology;
        match job.spec.topology.as_deref() {
            Some(ask) => {
                // `--switches` on a cluster that names no level: nothing to go by.
                let level = topo.level_of(ask)?;
                let levels = std::iter::once(level).chain(topo.above(level).iter().map(String::as_str));
                Some(TopoWant {
                    levels: levels.collect(),
                    required: ask.binds(job.submit_time_ms, self.state.now_ms),
                    max_domains: ask.max_domains.max(1) as usize,
                })
            }
            None if job.tasks() > 1 && !topo.levels.is_empty() => Some(TopoWant {
                levels: topo.levels.iter().map(String::as_str).collect(),
                required: false,
                max_domains: 1,
            }),
            None => None,
        }
    }

    /// The domain of the node at `pos` at `level`.
    pub(super) fn domain_of(&self, pos: usize, level: &str) -> Option<&'a str> {
        let n = &self.nodes[pos];
        self.state.topology.domain(n.name, n.labels, level)
    }

    fn group(&self, candidates: &[(usize, usize)], level: &str) -> Groups<'a> {
        let mut groups: BTreeMap<&'a str, Vec<(usize, usize)>> = BTreeMap::new();
        let mut alone = Vec::new();
        for &c in candidates {
            match self.domain_of(c.1, level) {
                Some(d) => groups.entry(d).or_default().push(c),
                None => alone.push(c),
            }
        }
        (groups, alone)
    }

    /// `tasks` of `candidates` (sorted tightest first) as `want` allows: inside the fullest
    /// domain that holds them at the lowest level that has one; else (preferred, or required
    /// over several domains) the fewest domains.
    pub(super) fn choose_in_domains(
        &self,
        candidates: &[(usize, usize)],
        tasks: usize,
        want: &TopoWant,
    ) -> Option<Vec<usize>> {
        for level in &want.levels {
            let (groups, _) = self.group(candidates, level);
            let fullest = groups
                .iter()
                .filter(|(_, v)| v.len() >= tasks)
                .min_by_key(|(d, v)| (v.len(), v.iter().map(|c| c.0).sum::<usize>(), **d));
            if let Some((_, v)) = fullest {
                return Some(v[..tasks].iter().map(|c| c.1).collect());
            }
            if want.required {
                break;
            }
        }
        if want.required && want.max_domains <= 1 {
            return None;
        }
        let (groups, alone) = self.group(candidates, want.levels.first()?);
        // A node in no domain of the level is never inside a required one.
        let alone = if want.required { Vec::new() } else { alone };
        let mut domains: Vec<Vec<(usize, usize)>> =
            groups.into_values().chain(alone.into_iter().map(|c| vec![c])).collect();
        let limit = if want.required { want.max_domains } else { usize::MAX };
        let mut chosen = Vec::with_capacity(tasks);
        let mut used = 0;
        while chosen.len() < tasks && used < limit {
            let left = tasks - chosen.len();
            // The fullest domain that holds the rest, else the largest (fewest domains).
            let pick = domains
                .iter()
                .enumerate()
                .filter(|(_, v)| v.len() >= left)
                .min_by_key(|(_, v)| v.len())
                .or_else(|| domains.iter().enumerate().max_by_key(|(i, v)| (v.len(), Reverse(*i))))
                .map(|(i, _)| i)?;
            let d = domains.swap_remove(pick);
            chosen.extend(d.iter().take(left).map(|c| c.1));
            used += 1;
        }
        (chosen.len() == tasks).then_some(chosen)
    }

    /// For a required ask: its level, and the domain with the most nodes the job may use at
    /// all, free or not (and how many) — whether any domain could ever hold it.
    pub(super) fn largest_domain_ever(
        &self,
        ask: &Ask,
        want: &TopoWant,
    ) -> Option<(String, Option<(String, usize)>)> {
        let level = *want.levels.first()?;
        let mut sizes: BTreeMap<&str, usize> = BTreeMap::new();
        for (pos, n) in self.nodes.iter().enumerate() {
            if !n.admits(ask.part, ask.cloud_ok, ask.ends_ms) {
                continue;
            }
            if let Some(d) = self.domain_of(pos, level) {
                *sizes.entry(d).or_default() += 1;
            }
        }
        let largest =
            sizes.into_iter().max_by_key(|(d, n)| (*n, Reverse(*d))).map(|(d, n)| (d.to_string(), n));
        Some((level.to_string(), largest))
    }

    /// For a required ask that did not fit: its level, and the domain with the most candidate
    /// nodes (and how many) — what the `Topology` reason names.
    pub(super) fn largest_domain(
        &self,
        candidates: &[(usize, usize)],
        want: &TopoWant,
    ) -> Option<(String, Option<(String, usize)>)> {
        let level = *want.levels.first()?;
        let (groups, _) = self.group(candidates, level);
        let largest =
            groups.iter().max_by_key(|(d, v)| (v.len(), Reverse(**d))).map(|(d, v)| (d.to_string(), v.len()));
        Some((level.to_string(), largest))
    }

    /// A reservation's nodes for a required ask: of `options` (start, position, GPUs), the
    /// `tasks` earliest inside one domain (the domain that can start soonest), or inside at
    /// most `max_domains` (earliest first).
    pub(super) fn reserve_in_domains(
        &self,
        mut options: Vec<ResOption>,
        tasks: usize,
        want: &TopoWant,
    ) -> Vec<ResOption> {
        let Some(level) = want.levels.first() else { return options };
        options.sort_unstable();
        let mut by_domain: BTreeMap<&str, Vec<ResOption>> = BTreeMap::new();
        for o in options {
            if let Some(d) = self.domain_of(o.1, level) {
                by_domain.entry(d).or_default().push(o);
            }
        }
        if want.max_domains <= 1 {
            let soonest = by_domain
                .into_values()
                .filter(|v| v.len() >= tasks)
                .min_by_key(|v| (v[tasks - 1].0, v.len()));
            return soonest
                .map(|mut v| {
                    v.truncate(tasks);
                    v
                })
                .unwrap_or_default();
        }
        // Several domains: the domains by when their share could start, taken whole.
        let mut domains: Vec<Vec<ResOption>> = by_domain.into_values().collect();
        domains.sort_by_key(|v| (Reverse(v.len()), v[0].0));
        let picked: Vec<_> = domains.into_iter().take(want.max_domains).flatten().collect();
        let mut picked = picked;
        picked.sort_unstable();
        picked.truncate(tasks);
        picked
    }
}
