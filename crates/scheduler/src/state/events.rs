//! The cluster's own event log (replicated, bounded): nodes joining, draining, going down,
//! coming back and leaving, and every policy change with who made it and the what-if its
//! operator saw. It is the audit trail of operators' changes and the node half of a history
//! trace (`kairos history --export-trace`): a replay needs the nodes that existed and when.
//!
//! Recorded in one place, `ClusterState::apply`, by comparing a node's state before and after
//! the node-changing operations (`note_node`), so no handler can forget it.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::model::{NodeInfo, NodeState};
use crate::state::ClusterState;

/// Most events kept (the oldest go first): a month of a busy 1,000-node cluster's changes.
pub const CLUSTER_EVENTS_MAX: usize = 20_000;

/// Who changed the policy and what they were shown first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyAudit {
    /// The operator's token id (`bootstrap` for the bootstrap admin token).
    pub token_id: String,
    pub user: String,
    /// The SHA-256 of the what-if summary the operator confirmed (empty: none was shown).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub what_if: String,
}

/// What a node offered when it joined (what a replay needs of it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeShape {
    pub gpus: u32,
    /// The model of its first GPU (a node holds one model).
    pub model: String,
    pub cpus: u32,
    pub memory_mib: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl NodeShape {
    pub fn of(info: &NodeInfo) -> NodeShape {
        NodeShape {
            gpus: info.gpus.len() as u32,
            model: info.gpus.first().map(|g| g.model.clone()).unwrap_or_default(),
            cpus: info.cpus,
            memory_mib: info.memory_mib,
            labels: info.labels.clone(),
        }
    }
}

/// One change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClusterEventKind {
    /// Registered (first time, or again after it was removed), or re-registered with another
    /// shape.
    NodeJoined {
        shape: NodeShape,
    },
    NodeDraining {
        reason: String,
    },
    NodeDown {
        reason: String,
    },
    /// Up again (resumed after a drain, or back after being down).
    NodeUp,
    NodeRemoved,
    PolicyApplied {
        audit: PolicyAudit,
    },
    /// A reservation was created, changed or deleted, or its window opened or closed.
    Reservation {
        name: String,
        what: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterEvent {
    pub time_ms: i64,
    /// The node it is about (empty for policy changes).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    pub kind: ClusterEventKind,
}

impl ClusterEventKind {
    /// Its name in the API and the CLI.
    pub fn name(&self) -> &'static str {
        match self {
            ClusterEventKind::NodeJoined { .. } => "node joined",
            ClusterEventKind::NodeDraining { .. } => "node draining",
            ClusterEventKind::NodeDown { .. } => "node down",
            ClusterEventKind::NodeUp => "node up",
            ClusterEventKind::NodeRemoved => "node removed",
            ClusterEventKind::PolicyApplied { .. } => "policy applied",
            ClusterEventKind::Reservation { .. } => "reservation",
        }
    }
}

/// The log, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ClusterEvents {
    events: VecDeque<ClusterEvent>,
}

impl ClusterEvents {
    pub fn iter(&self) -> impl Iterator<Item = &ClusterEvent> {
        self.events.iter()
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    pub(crate) fn push(&mut self, event: ClusterEvent) {
        if self.events.len() >= CLUSTER_EVENTS_MAX {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }
}

/// A node as the log compares it before and after an operation.
pub(crate) type NodeSeen = Option<(NodeState, NodeShape, u64)>;

impl ClusterState {
    /// How node `name` looks now (state, shape, registration epoch).
    pub(crate) fn node_seen(&self, name: &str) -> NodeSeen {
        self.nodes.get(name).map(|n| (n.state, NodeShape::of(&n.info), n.epoch))
    }

    /// Records what changed of node `name` since it looked like `before`.
    pub(crate) fn note_node(&mut self, name: &str, before: NodeSeen, now: i64) {
        let after = self.node_seen(name);
        let reason = || self.nodes.get(name).map(|n| n.reason.clone()).unwrap_or_default();
        let mut kinds = Vec::new();
        match (&before, &after) {
            (None, None) => {}
            (Some(_), None) => kinds.push(ClusterEventKind::NodeRemoved),
            (None, Some((state, shape, _))) => {
                kinds.push(ClusterEventKind::NodeJoined { shape: shape.clone() });
                if *state == NodeState::Draining {
                    kinds.push(ClusterEventKind::NodeDraining { reason: reason() });
                }
            }
            (Some((s0, shape0, e0)), Some((s1, shape1, e1))) => {
                if shape0 != shape1 || e0 != e1 {
                    kinds.push(ClusterEventKind::NodeJoined { shape: shape1.clone() });
                }
                if s0 != s1 {
                    kinds.push(match s1 {
                        NodeState::Up => ClusterEventKind::NodeUp,
                        NodeState::Draining => ClusterEventKind::NodeDraining { reason: reason() },
                        NodeState::Down => ClusterEventKind::NodeDown { reason: reason() },
                    });
                }
            }
        }
        for kind in kinds {
            self.events.push(ClusterEvent { time_ms: now, node: name.to_string(), kind });
        }
    }

    /// Records a policy change.
    pub(crate) fn note_policy(&mut self, audit: &Option<PolicyAudit>, now: i64) {
        let audit = audit.clone().unwrap_or_default();
        self.events.push(ClusterEvent {
            time_ms: now,
            node: String::new(),
            kind: ClusterEventKind::PolicyApplied { audit },
        });
    }
}
