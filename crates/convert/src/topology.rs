//! The topology above the nodes (`kairos_scheduler::topology`) and a job's ask of it, on the
//! wire: `kairos topology apply|show`, `GetTopology`/`SetTopology`, `Resources.topology`.

use std::collections::BTreeMap;

use kairos_proto::v1 as pb;
use kairos_scheduler::topology::{Topology, TopologyAsk};
use kairos_scheduler::Node;

/// A job's ask as submitted (validated with the spec).
pub fn ask_from_pb(t: pb::TopologyRequest) -> Box<TopologyAsk> {
    Box::new(TopologyAsk {
        level: t.level,
        required: t.required,
        max_domains: t.max_domains.max(1),
        relax_after_s: (t.relax_after_s != 0).then_some(t.relax_after_s),
    })
}

pub fn ask_to_pb(t: &TopologyAsk) -> pb::TopologyRequest {
    pb::TopologyRequest {
        level: t.level.clone(),
        required: t.required,
        max_domains: t.max_domains,
        relax_after_s: t.relax_after_s.unwrap_or(0),
    }
}

/// A SetTopology request as the domain's (checked by apply: `Topology::validate`). Requests
/// past the bounds are refused before anything is built.
pub fn topology_from_pb(t: pb::Topology) -> Result<Topology, String> {
    if t.levels.len() > kairos_scheduler::topology::LEVELS_MAX {
        return Err(format!("topology: at most {} levels", kairos_scheduler::topology::LEVELS_MAX));
    }
    if t.nodes.len() > kairos_scheduler::topology::NODES_MAX {
        return Err(format!("topology: at most {} nodes", kairos_scheduler::topology::NODES_MAX));
    }
    let mut nodes = BTreeMap::new();
    for n in t.nodes {
        if nodes.insert(n.node.clone(), n.domains.into_iter().collect()).is_some() {
            return Err(format!("topology: node \"{}\" is placed twice", n.node));
        }
    }
    Ok(Topology { levels: t.levels, nodes })
}

/// The topology as answered: the file's placements, every registered node's resolved domains,
/// and the file's nodes that are not registered.
pub fn topology_to_pb<'a>(
    t: &Topology,
    registered: impl Iterator<Item = (&'a String, &'a Node)>,
) -> pb::Topology {
    let mut resolved = Vec::new();
    let mut known = std::collections::BTreeSet::new();
    for (name, node) in registered {
        known.insert(name.as_str());
        let domains = t
            .levels
            .iter()
            .filter_map(|l| Some((l.clone(), t.domain(name, &node.info.labels, l)?.to_string())))
            .collect();
        resolved.push(pb::TopologyNode { node: name.clone(), domains });
    }
    let placed = |(node, d): (&String, &BTreeMap<String, String>)| pb::TopologyNode {
        node: node.clone(),
        domains: d.clone().into_iter().collect(),
    };
    pb::Topology {
        levels: t.levels.clone(),
        nodes: t.nodes.iter().map(placed).collect(),
        resolved,
        unknown_nodes: t.nodes.keys().filter(|n| !known.contains(n.as_str())).cloned().collect(),
    }
}
