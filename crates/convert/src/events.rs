//! The cluster's event log (`kairos_scheduler::events`) as `ListClusterEvents` answers it.

use kairos_proto::v1 as pb;
use kairos_scheduler::events::{ClusterEvent, ClusterEventKind};

pub fn cluster_event_to_pb(e: &ClusterEvent) -> pb::ClusterEvent {
    let mut out = pb::ClusterEvent {
        time_ms: e.time_ms,
        kind: e.kind.name().to_string(),
        node: e.node.clone(),
        ..Default::default()
    };
    match &e.kind {
        ClusterEventKind::NodeJoined { shape } => {
            out.gpus = shape.gpus;
            out.gpu_model = shape.model.clone();
            out.cpus = shape.cpus;
            out.memory_mib = shape.memory_mib;
            out.labels = shape.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        }
        ClusterEventKind::NodeDraining { reason } | ClusterEventKind::NodeDown { reason } => {
            out.reason = reason.clone();
        }
        ClusterEventKind::NodeUp | ClusterEventKind::NodeRemoved => {}
        ClusterEventKind::PolicyApplied { audit } => {
            out.token_id = audit.token_id.clone();
            out.user = audit.user.clone();
            out.what_if_hash = audit.what_if.clone();
        }
        ClusterEventKind::Reservation { name, what } => {
            out.reservation = name.clone();
            out.reason = what.clone();
        }
    }
    out
}
