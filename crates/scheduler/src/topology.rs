//! The cluster's topology above the node: levels the operator names (lowest first, e.g. `rack`,
//! `block`), and the domain each node is in at each level — from the operator's topology file
//! (`kairos topology apply`), else the node's label of the level's name (`kairos-agent --label
//! rack=r3`). A job asks to be placed inside one domain of a level (`TopologyAsk`); the planner
//! (`planner::gang`, `planner::backfill`) places by it and apply re-checks a required one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Most levels a topology may name.
pub const LEVELS_MAX: usize = 8;
/// Most nodes a topology file may place.
pub const NODES_MAX: usize = 100_000;
/// Longest level or domain name.
pub const NAME_MAX: usize = 64;

/// Levels and the file's placement of nodes (replicated).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Level names, lowest (closest links) first.
    #[serde(default)]
    pub levels: Vec<String>,
    /// node → level → domain, from the topology file; a node's labels fill in the rest.
    #[serde(default)]
    pub nodes: BTreeMap<String, BTreeMap<String, String>>,
}

/// What a job asks of the topology (Kueue's required/preferred topology, Slurm's `--switches`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologyAsk {
    /// The level whose domains the job's tasks should share, e.g. "rack" ("": the cluster's
    /// lowest named level, as Slurm's `--switches` means the leaf switches).
    pub level: String,
    /// Required: never placed across more domains than `max_domains` (it waits instead);
    /// preferred: the fewest domains it can get now.
    #[serde(default)]
    pub required: bool,
    /// Required across at most this many domains (Slurm's `--switches=N`; at least 1).
    #[serde(default = "one")]
    pub max_domains: u32,
    /// A required ask relaxes to preferred once the job has waited this long
    /// (`--switches=N@wait`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relax_after_s: Option<u64>,
}

fn one() -> u32 {
    1
}

/// Why a topology or a job's ask of it is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("topology: at most {LEVELS_MAX} levels")]
    TooManyLevels,
    #[error("topology: at most {NODES_MAX} nodes")]
    TooManyNodes,
    #[error("topology: level \"{0}\" is named twice")]
    DuplicateLevel(String),
    #[error(
        "topology: name {0:?} must be 1 to {NAME_MAX} characters of letters, digits, '-', '_', '.', '/'"
    )]
    BadName(String),
    #[error("topology: node \"{node}\" is placed at level \"{level}\", which the levels do not name")]
    UnknownLevel { node: String, level: String },
    #[error(
        "topology: {level} \"{domain}\" lies in two {upper}s (\"{a}\" and \"{b}\"): each domain must lie inside one domain of every higher level"
    )]
    Split { level: String, domain: String, upper: String, a: String, b: String },
    #[error("topology: node names are 1 to 128 bytes without NUL")]
    BadNodeName,
    #[error("--topology: max domains must be 1 to 64")]
    MaxDomains,
}

/// A level or domain name: short, plain characters.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

impl Topology {
    /// Whether nothing is known above the node (no levels, no placements).
    pub fn is_empty(&self) -> bool {
        self.levels.is_empty() && self.nodes.is_empty()
    }

    /// The domain of `node` (with `labels`) at `level`: the file's, else the label's.
    pub fn domain<'a>(
        &'a self,
        node: &str,
        labels: &'a BTreeMap<String, String>,
        level: &str,
    ) -> Option<&'a str> {
        self.nodes.get(node).and_then(|l| l.get(level)).or_else(|| labels.get(level)).map(String::as_str)
    }

    /// The level an ask names: its own, or ("") the lowest named level.
    pub fn level_of<'a>(&'a self, ask: &'a TopologyAsk) -> Option<&'a str> {
        match ask.level.as_str() {
            "" => self.levels.first().map(String::as_str),
            level => Some(level),
        }
    }

    /// The levels above `level`, lowest first (none when `level` is not a named level).
    pub fn above(&self, level: &str) -> &[String] {
        match self.levels.iter().position(|l| l == level) {
            Some(i) => &self.levels[i + 1..],
            None => &[],
        }
    }

    /// Checks names, bounds, and that each domain lies inside one domain of every higher level.
    pub fn validate(&self) -> Result<(), TopologyError> {
        if self.levels.len() > LEVELS_MAX {
            return Err(TopologyError::TooManyLevels);
        }
        if self.nodes.len() > NODES_MAX {
            return Err(TopologyError::TooManyNodes);
        }
        for (i, level) in self.levels.iter().enumerate() {
            if !valid_name(level) {
                return Err(TopologyError::BadName(level.clone()));
            }
            if self.levels[..i].contains(level) {
                return Err(TopologyError::DuplicateLevel(level.clone()));
            }
        }
        for (node, placed) in &self.nodes {
            if node.is_empty() || node.len() > 128 || node.contains('\0') {
                return Err(TopologyError::BadNodeName);
            }
            if placed.len() > LEVELS_MAX {
                return Err(TopologyError::TooManyLevels);
            }
            for (level, domain) in placed {
                if !self.levels.contains(level) {
                    return Err(TopologyError::UnknownLevel { node: node.clone(), level: level.clone() });
                }
                if !valid_name(domain) {
                    return Err(TopologyError::BadName(domain.clone()));
                }
            }
        }
        self.check_nesting()
    }

    /// Each domain of a level lies inside one domain of each higher level (where nodes say).
    fn check_nesting(&self) -> Result<(), TopologyError> {
        for (i, level) in self.levels.iter().enumerate() {
            for upper in &self.levels[i + 1..] {
                let mut inside: BTreeMap<&str, &str> = BTreeMap::new();
                for placed in self.nodes.values() {
                    let (Some(d), Some(u)) = (placed.get(level), placed.get(upper)) else { continue };
                    match inside.insert(d, u) {
                        Some(other) if other != u => {
                            let (a, b) = (other.min(u.as_str()), other.max(u.as_str()));
                            return Err(TopologyError::Split {
                                level: level.clone(),
                                domain: d.clone(),
                                upper: upper.clone(),
                                a: a.to_string(),
                                b: b.to_string(),
                            });
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(())
    }
}

impl TopologyAsk {
    /// Parses `LEVEL[=required|preferred]` (preferred when not said).
    pub fn parse(text: &str) -> Result<TopologyAsk, String> {
        let (level, how) = text.split_once('=').unwrap_or((text, "preferred"));
        let required = match how {
            "required" => true,
            "preferred" => false,
            other => return Err(format!("--topology {text}: \"{other}\" must be required or preferred")),
        };
        if !valid_name(level) {
            return Err(format!("--topology {text}: the level must be a name, e.g. rack=required"));
        }
        Ok(TopologyAsk { level: level.to_string(), required, max_domains: 1, relax_after_s: None })
    }

    pub fn validate(&self) -> Result<(), TopologyError> {
        if !self.level.is_empty() && !valid_name(&self.level) {
            return Err(TopologyError::BadName(self.level.clone()));
        }
        if !(1..=64).contains(&self.max_domains) {
            return Err(TopologyError::MaxDomains);
        }
        Ok(())
    }

    /// Whether the ask still binds a job pending since `since_ms` at `now_ms` (a required ask
    /// with a wait relaxes to preferred when the wait is over).
    pub fn binds(&self, since_ms: i64, now_ms: i64) -> bool {
        self.required
            && self.relax_after_s.is_none_or(|s| {
                now_ms.saturating_sub(since_ms) < i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX)
            })
    }

    /// As the user writes it: `rack=required`, `rack=preferred`, with `/N@WAIT` when set.
    pub fn describe(&self) -> String {
        let mut s = format!("{}={}", self.level, if self.required { "required" } else { "preferred" });
        if self.max_domains > 1 {
            s.push_str(&format!(" (at most {} domains)", self.max_domains));
        }
        if let Some(wait) = self.relax_after_s {
            s.push_str(&format!(", preferred after {wait} s"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(l, d)| (l.to_string(), d.to_string())).collect()
    }

    #[test]
    fn the_file_wins_over_labels_and_labels_fill_in() {
        let mut t = Topology { levels: vec!["rack".into(), "block".into()], ..Default::default() };
        t.nodes.insert("n1".into(), placed(&[("rack", "r1")]));
        let labels = placed(&[("rack", "r9"), ("block", "b1")]);
        assert_eq!(t.domain("n1", &labels, "rack"), Some("r1"));
        assert_eq!(t.domain("n1", &labels, "block"), Some("b1"));
        assert_eq!(t.domain("n2", &labels, "rack"), Some("r9"));
        assert_eq!(t.domain("n2", &BTreeMap::new(), "rack"), None);
        assert_eq!(t.above("rack"), ["block".to_string()]);
        assert!(t.above("pod").is_empty());
    }

    #[test]
    fn a_rack_in_two_blocks_a_repeated_level_and_an_unnamed_level_are_refused() {
        let mut t = Topology { levels: vec!["rack".into(), "block".into()], ..Default::default() };
        t.nodes.insert("n1".into(), placed(&[("rack", "r1"), ("block", "b1")]));
        t.nodes.insert("n2".into(), placed(&[("rack", "r1"), ("block", "b2")]));
        assert!(matches!(t.validate(), Err(TopologyError::Split { .. })), "{:?}", t.validate());
        t.nodes.insert("n2".into(), placed(&[("rack", "r1"), ("block", "b1")]));
        assert_eq!(t.validate(), Ok(()));
        t.nodes.insert("n3".into(), placed(&[("pod", "p1")]));
        assert!(matches!(t.validate(), Err(TopologyError::UnknownLevel { .. })));
        t.nodes.remove("n3");
        t.nodes.insert(String::new(), placed(&[("rack", "r1")]));
        assert_eq!(t.validate(), Err(TopologyError::BadNodeName));
        t.nodes.remove("");
        t.levels.push("rack".into());
        assert_eq!(t.validate(), Err(TopologyError::DuplicateLevel("rack".into())));
    }

    #[test]
    fn asks_parse_and_a_required_wait_relaxes() {
        let a = TopologyAsk::parse("rack=required").unwrap();
        assert!(a.required && a.level == "rack");
        assert!(!TopologyAsk::parse("rack").unwrap().required);
        assert!(TopologyAsk::parse("rack=maybe").unwrap_err().contains("required or preferred"));
        assert!(TopologyAsk::parse("=required").is_err());
        let waits = TopologyAsk { relax_after_s: Some(60), ..a.clone() };
        assert!(waits.binds(0, 59_999) && !waits.binds(0, 60_000));
        assert!(a.binds(0, i64::MAX));
        assert!(!TopologyAsk { required: false, ..a }.binds(0, 0));
    }
}
