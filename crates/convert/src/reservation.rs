//! Reservations between the wire and the core (`kairos_scheduler::reservation`).

use kairos_proto::v1 as pb;
use kairos_scheduler::model::TaskPlacement;
use kairos_scheduler::reservation::{Repeat, Reservation};
use tonic::Status;

/// A put's reservation; what only answers carry (window now, bound GPUs) is ignored. The
/// core validates the rest.
pub fn reservation_from_pb(r: pb::Reservation, created_by: &str) -> Result<Reservation, Status> {
    let repeat = Repeat::parse(&r.repeat).ok_or_else(|| {
        Status::invalid_argument(format!("repeat: {:?} is not once, daily, weekdays or weekly", r.repeat))
    })?;
    let out = Reservation {
        name: r.name,
        nodes: r.nodes,
        gpus: r.gpus,
        partition: r.partition,
        gpu_model: (!r.gpu_model.is_empty()).then_some(r.gpu_model),
        start_ms: r.start_ms,
        end_ms: r.end_ms,
        repeat,
        accounts: r.accounts,
        users: r.users,
        qos: r.qos,
        maint: r.maint,
        ignore_jobs: r.ignore_jobs,
        overlap: r.overlap,
        created_by: created_by.to_string(),
        opened_ms: None,
        bound: Vec::new(),
    };
    // Refused at the edge, before it costs a log entry (apply checks it again).
    out.validate().map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(out)
}

/// The wire form of a reservation at `now` (its window open now or next).
pub fn reservation_to_pb(r: &Reservation, now: i64) -> pb::Reservation {
    let window = r.window_at(now);
    pb::Reservation {
        name: r.name.clone(),
        nodes: r.nodes.clone(),
        gpus: r.gpus,
        partition: r.partition.clone(),
        gpu_model: r.gpu_model.clone().unwrap_or_default(),
        start_ms: r.start_ms,
        end_ms: r.end_ms,
        repeat: r.repeat.as_str().to_string(),
        accounts: r.accounts.clone(),
        users: r.users.clone(),
        qos: r.qos.clone(),
        maint: r.maint,
        ignore_jobs: r.ignore_jobs,
        overlap: r.overlap,
        created_by: r.created_by.clone(),
        next_start_ms: window.map_or(0, |w| w.0),
        next_end_ms: window.map_or(0, |w| w.1),
        open: r.open_at(now).is_some_and(|(start, _)| r.opened_ms == Some(start)),
        bound: r
            .bound
            .iter()
            .map(|t: &TaskPlacement| pb::ReservedGpus { node: t.node.clone(), gpus: t.gpus.clone() })
            .collect(),
    }
}
