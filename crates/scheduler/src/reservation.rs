//! Reservations (Slurm's `scontrol create reservation`): named nodes, or a count of GPUs, held
//! for a time window that may repeat, for an access list of users, accounts or a QoS.
//!
//! Semantics (enforced by the planner, re-checked by apply, `crate::state::reservations`):
//! - before a window, a job that does not name the reservation starts on its nodes only if its
//!   time limit ends before the window opens (backfill into the gap);
//! - when the window opens, the jobs still on its resources are checkpointed and requeued
//!   (unless `ignore_jobs`), a GPU-count reservation is bound to concrete GPUs (those whose
//!   taking stops the fewest runs), and only jobs that name it (`--reservation`) and are on
//!   its access list start there until it closes;
//! - `maint` shows its nodes as MAINT for the window; a repeating window rolls forward.

use serde::{Deserialize, Serialize};

use crate::model::TaskPlacement;

/// The most reservations a cluster keeps.
pub const RESERVATIONS_MAX: usize = 256;
/// The most nodes, users and accounts one reservation lists.
pub const RESERVATION_LIST_MAX: usize = 1024;
pub const DAY_MS: i64 = 86_400_000;
/// How far ahead two repeating reservations are compared for overlap (every repeat this
/// module knows has a week as a multiple of its period).
const OVERLAP_HORIZON_MS: i64 = 14 * DAY_MS;

/// How a reservation's window repeats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Repeat {
    #[default]
    Once,
    Daily,
    /// Daily, on windows that start Monday to Friday (UTC).
    Weekdays,
    Weekly,
}

impl Repeat {
    pub fn as_str(self) -> &'static str {
        match self {
            Repeat::Once => "once",
            Repeat::Daily => "daily",
            Repeat::Weekdays => "weekdays",
            Repeat::Weekly => "weekly",
        }
    }

    pub fn parse(s: &str) -> Option<Repeat> {
        match s {
            "" | "once" | "none" => Some(Repeat::Once),
            "daily" => Some(Repeat::Daily),
            "weekdays" => Some(Repeat::Weekdays),
            "weekly" => Some(Repeat::Weekly),
            _ => None,
        }
    }

    /// The step between two candidate windows (none for `Once`).
    fn period_ms(self) -> Option<i64> {
        match self {
            Repeat::Once => None,
            Repeat::Daily | Repeat::Weekdays => Some(DAY_MS),
            Repeat::Weekly => Some(7 * DAY_MS),
        }
    }
}

/// One reservation as operators define it, with what its windows' opening decided.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub name: String,
    /// The nodes it holds whole (empty: it holds `gpus` GPUs, bound when a window opens).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    #[serde(default)]
    pub gpus: u32,
    /// A GPU-count reservation binds GPUs of this partition's nodes (empty: any).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub partition: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_model: Option<String>,
    /// The first window (Unix ms); a repeating one rolls forward by its period.
    pub start_ms: i64,
    pub end_ms: i64,
    #[serde(default)]
    pub repeat: Repeat,
    /// The access list: a job that names the reservation may use it if its user or account is
    /// listed or its QoS is `qos` (all three empty: any job that names it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub accounts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub qos: String,
    /// Maintenance: its nodes show as MAINT during the window.
    #[serde(default)]
    pub maint: bool,
    /// Runs on its resources when a window opens are left running.
    #[serde(default)]
    pub ignore_jobs: bool,
    /// Its windows may overlap another reservation's on a node that also allows it.
    #[serde(default)]
    pub overlap: bool,
    /// Who created it (the audit).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub created_by: String,
    /// The start of the window its opening was carried out for (by `Op::ReservationTick`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opened_ms: Option<i64>,
    /// A GPU-count reservation's GPUs for the open window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bound: Vec<TaskPlacement>,
}

/// Why a reservation is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ReservationError(pub String);

impl Reservation {
    fn duration_ms(&self) -> i64 {
        self.end_ms - self.start_ms
    }

    /// The `k`-th candidate window (weekdays skip those that would start on a weekend).
    fn nth(&self, k: i64, period: i64) -> (i64, i64) {
        let shift = k.saturating_mul(period);
        (self.start_ms.saturating_add(shift), self.end_ms.saturating_add(shift))
    }

    /// The window open at `now` or, if none is, the next one: (start, end), end after `now`.
    /// None once a one-off window has ended.
    pub fn window_at(&self, now: i64) -> Option<(i64, i64)> {
        let Some(period) = self.repeat.period_ms() else {
            return (self.end_ms > now).then_some((self.start_ms, self.end_ms));
        };
        // The first candidate whose end is after now.
        let first = if self.end_ms > now { 0 } else { (now - self.end_ms) / period + 1 };
        (first..first + 8)
            .map(|k| self.nth(k, period))
            .find(|(s, e)| *e > now && (self.repeat != Repeat::Weekdays || is_weekday(*s)))
    }

    /// Whether a window is open at `now`.
    pub fn open_at(&self, now: i64) -> Option<(i64, i64)> {
        self.window_at(now).filter(|(s, _)| *s <= now)
    }

    /// Its windows that end after `from` and start before `until`.
    pub fn windows_between(&self, from: i64, until: i64) -> Vec<(i64, i64)> {
        let mut out = Vec::new();
        let mut at = from;
        while let Some((s, e)) = self.window_at(at) {
            if s >= until || out.len() > 64 {
                break;
            }
            out.push((s, e));
            at = e;
        }
        out
    }

    /// Whether a job of `user`, `account` and `qos` is on the access list.
    pub fn admits(&self, user: &str, account: &str, qos: &str) -> bool {
        let open = self.users.is_empty() && self.accounts.is_empty() && self.qos.is_empty();
        open || self.users.iter().any(|u| u == user)
            || self.accounts.iter().any(|a| a == account)
            || (!self.qos.is_empty() && self.qos == qos)
    }

    /// Whether it holds whole nodes (else a GPU count).
    pub fn by_nodes(&self) -> bool {
        !self.nodes.is_empty()
    }

    /// The GPUs it holds on `node` in the open window: all (None) for a node it lists, the
    /// bound ones for a GPU count; nothing when it holds nothing there.
    pub fn holds_on(&self, node: &str) -> Option<Option<&[u32]>> {
        if self.by_nodes() {
            return self.nodes.iter().any(|n| n == node).then_some(None);
        }
        self.bound.iter().find(|t| t.node == node).map(|t| Some(t.gpus.as_slice()))
    }

    /// The nodes it holds for the open window (listed, or bound).
    pub fn held_nodes(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().map(String::as_str).chain(self.bound.iter().map(|t| t.node.as_str()))
    }

    /// Checks the reservation on its own (names, window, what it holds, its lists).
    pub fn validate(&self) -> Result<(), ReservationError> {
        let bad = |m: String| Err(ReservationError(m));
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.len() <= 64
                && n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !name_ok(&self.name) {
            return bad(format!(
                "reservation name {:?}: 1 to 64 letters, digits, '-', '_' or '.'",
                self.name
            ));
        }
        if self.by_nodes() == (self.gpus > 0) {
            return bad(
                "a reservation holds either nodes (--nodes) or a GPU count (--gpus), one of them".into()
            );
        }
        if self.by_nodes() && (!self.partition.is_empty() || self.gpu_model.is_some()) {
            return bad(
                "--partition and --gpu-model choose the GPUs of a GPU-count reservation; --nodes names them"
                    .into(),
            );
        }
        if self.start_ms <= 0 || self.end_ms <= self.start_ms {
            return bad("the window must end after it starts".into());
        }
        if let Some(period) = self.repeat.period_ms() {
            if self.duration_ms() > period - 60_000 {
                let r = self.repeat.as_str();
                return bad(format!("a {r} window must be shorter than its period, less a minute"));
            }
        }
        for (what, list) in [("nodes", &self.nodes), ("users", &self.users), ("accounts", &self.accounts)] {
            if list.len() > RESERVATION_LIST_MAX {
                return bad(format!("at most {RESERVATION_LIST_MAX} {what}"));
            }
            if let Some(dup) = list.iter().enumerate().find(|(i, n)| n.is_empty() || list[..*i].contains(n)) {
                return bad(format!("{what}: {:?} is empty or listed twice", dup.1));
            }
        }
        Ok(())
    }

    /// Whether its windows and `other`'s meet on a node both hold (GPU-count reservations are
    /// not bound ahead, so only node lists are compared), unless both allow overlap.
    pub fn overlaps(&self, other: &Reservation, now: i64) -> Option<String> {
        if self.overlap && other.overlap {
            return None;
        }
        let node = self.nodes.iter().find(|n| other.nodes.contains(n))?;
        let meets = meets(self, other, now) || meets(other, self, now);
        meets.then(|| format!("its window overlaps reservation \"{}\" on node {node}", other.name))
    }
}

/// Whether a window of `a` meets the window of `b` open at (or next after) its start: checked
/// for `a`'s windows from when both exist, over two weeks (every repeat here has a week as a
/// multiple of its period, so later windows repeat the pattern).
fn meets(a: &Reservation, b: &Reservation, now: i64) -> bool {
    let from = now.max(a.start_ms).max(b.start_ms.min(a.start_ms));
    let until = from.saturating_add(OVERLAP_HORIZON_MS);
    a.windows_between(from, until).into_iter().any(|(s, e)| b.window_at(s).is_some_and(|(bs, _)| bs < e))
}

/// Whether the UTC day of `ms` is Monday to Friday (1970-01-01 was a Thursday).
fn is_weekday(ms: i64) -> bool {
    let day = ms.div_euclid(DAY_MS);
    let weekday = (day + 3).rem_euclid(7); // 0 = Monday
    weekday < 5
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resv(start: i64, end: i64, repeat: Repeat) -> Reservation {
        Reservation {
            name: "r".into(),
            nodes: vec!["n1".into()],
            start_ms: start,
            end_ms: end,
            repeat,
            ..Default::default()
        }
    }

    #[test]
    fn a_one_off_window_is_found_until_it_ends() {
        let r = resv(1_000, 2_000, Repeat::Once);
        assert_eq!(r.window_at(0), Some((1_000, 2_000)));
        assert_eq!(r.open_at(999), None);
        assert_eq!(r.open_at(1_000), Some((1_000, 2_000)));
        assert_eq!(r.window_at(2_000), None);
    }

    #[test]
    fn a_daily_window_rolls_forward_and_weekdays_skip_the_weekend() {
        // 2026-12-04 was a Friday: 20_791 days after the epoch.
        let friday = 20_791 * DAY_MS + 10 * 3_600_000;
        let r = resv(friday, friday + 3_600_000, Repeat::Daily);
        assert_eq!(r.window_at(friday + 2 * 3_600_000), Some((friday + DAY_MS, friday + DAY_MS + 3_600_000)));
        assert_eq!(
            r.open_at(friday + 3 * DAY_MS + 1),
            Some((friday + 3 * DAY_MS, friday + 3 * DAY_MS + 3_600_000))
        );
        let w = Reservation { repeat: Repeat::Weekdays, ..r.clone() };
        // After Friday's window: Monday's, not Saturday's.
        assert_eq!(w.window_at(friday + 2 * 3_600_000).map(|x| x.0), Some(friday + 3 * DAY_MS));
        let weekly = Reservation { repeat: Repeat::Weekly, ..r };
        assert_eq!(weekly.window_at(friday + 2 * 3_600_000).map(|x| x.0), Some(friday + 7 * DAY_MS));
    }

    #[test]
    fn validation_refuses_what_cannot_be_held() {
        assert!(resv(1_000, 2_000, Repeat::Once).validate().is_ok());
        assert!(resv(2_000, 2_000, Repeat::Once).validate().is_err());
        assert!(resv(1_000, 1_000 + DAY_MS, Repeat::Daily).validate().is_err());
        let both = Reservation { gpus: 2, ..resv(1_000, 2_000, Repeat::Once) };
        assert!(both.validate().is_err());
        let neither = Reservation { nodes: vec![], ..resv(1_000, 2_000, Repeat::Once) };
        assert!(neither.validate().is_err());
        let bad_name = Reservation { name: "a b".into(), ..resv(1_000, 2_000, Repeat::Once) };
        assert!(bad_name.validate().is_err());
        let twice = Reservation { nodes: vec!["n1".into(), "n1".into()], ..resv(1_000, 2_000, Repeat::Once) };
        assert!(twice.validate().is_err());
    }

    #[test]
    fn overlapping_windows_on_a_shared_node_are_found_unless_both_allow_it() {
        let a = resv(DAY_MS, DAY_MS + 3_600_000, Repeat::Daily);
        let mut b = Reservation {
            name: "b".into(),
            ..resv(3 * DAY_MS + 1_800_000, 3 * DAY_MS + 5_000_000, Repeat::Once)
        };
        assert!(a.overlaps(&b, 0).is_some());
        b.start_ms = 3 * DAY_MS + 3_600_000;
        assert!(a.overlaps(&b, 0).is_none(), "back to back is no overlap");
        b.start_ms = 3 * DAY_MS;
        b.nodes = vec!["n2".into()];
        assert!(a.overlaps(&b, 0).is_none(), "other nodes");
        b.nodes = vec!["n1".into()];
        let (a2, b2) =
            (Reservation { overlap: true, ..a.clone() }, Reservation { overlap: true, ..b.clone() });
        assert!(a2.overlaps(&b2, 0).is_none());
        assert!(a2.overlaps(&b, 0).is_some(), "both must allow it");
        // A one-off window far ahead meets the daily one that day.
        let far = Reservation {
            name: "far".into(),
            ..resv(100 * DAY_MS + 1_000_000, 100 * DAY_MS + 2_000_000, Repeat::Once)
        };
        assert!(a.overlaps(&far, 0).is_some());
        assert!(far.overlaps(&a, 0).is_some());
        let clear = Reservation {
            name: "clear".into(),
            ..resv(100 * DAY_MS + 4_000_000, 100 * DAY_MS + 5_000_000, Repeat::Once)
        };
        assert!(a.overlaps(&clear, 0).is_none());
    }

    #[test]
    fn the_access_list_admits_users_accounts_or_the_qos() {
        let mut r = resv(1, 2, Repeat::Once);
        assert!(r.admits("u", "a", "q"), "an empty list admits whoever names it");
        r.accounts = vec!["a".into()];
        assert!(r.admits("x", "a", "q"));
        assert!(!r.admits("u", "b", "q"));
        r.users = vec!["u".into()];
        assert!(r.admits("u", "b", "q"));
        r.qos = "urgent".into();
        assert!(r.admits("x", "b", "urgent"));
    }
}
