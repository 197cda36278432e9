//! Quality-of-service classes shipped with every cluster, and the profile → QoS default.
//!
//! Today only a QoS's priority and maximum wall time are acted on; the replicated, editable QoS
//! objects (preempt lists, limits) arrive with the policy engine.

use crate::model::Profile;

/// A QoS class as the core uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Qos {
    pub name: &'static str,
    pub priority: i64,
    /// Longest wall time a job of this QoS may ask for, and its default time limit.
    pub max_wall_s: u64,
}

const HOUR_S: u64 = 3600;

/// The defaults from the source articles (SPEC "Defaults shipped").
pub const BUILTIN_QOS: &[Qos] = &[
    Qos { name: "urgent", priority: 300, max_wall_s: 4 * HOUR_S },
    Qos { name: "premium", priority: 250, max_wall_s: 48 * HOUR_S },
    Qos { name: "inference", priority: 200, max_wall_s: 2 * HOUR_S },
    Qos { name: "training", priority: 100, max_wall_s: 48 * HOUR_S },
    Qos { name: "batch", priority: 10, max_wall_s: 24 * HOUR_S },
];

/// Looks a QoS up by name.
pub fn find_qos(name: &str) -> Option<&'static Qos> {
    BUILTIN_QOS.iter().find(|q| q.name == name)
}

/// The QoS a job of this profile gets when the user names none.
pub fn default_qos(profile: Profile) -> &'static Qos {
    let name = match profile {
        Profile::Training => "training",
        Profile::Inference => "inference",
        Profile::Batch => "batch",
    };
    find_qos(name).expect("every profile's default QoS is built in")
}
