//! `kairos reservation`: nodes or a GPU count held for a time window that may repeat, for an
//! access list (Slurm's `scontrol create reservation`): list, show, create, update, delete,
//! edited one at a time on the server (`PutReservation`/`DeleteReservation`).

use clap::Subcommand;
use kairos_proto::v1 as pb;
use serde_json::{json, Value};

use crate::args::{csv, now_ms, parse_at, parse_gpus, parse_time};
use crate::client::{CallError, Client};
use crate::output::{local_time, print_json, print_list, time_json};

#[derive(Subcommand, Debug)]
pub enum ReservationCmd {
    /// Every reservation with its open (or next) window, what it holds and who may use it.
    List,
    /// One reservation, every field (with the GPUs a GPU count is bound to while open).
    Show {
        /// The reservation's name.
        name: String,
    },
    /// Create a reservation (operators): --nodes or --gpus, --start, and --duration or --end
    ///
    /// Slurm's semantics:
    /// - before a window, a job that does not run in the reservation starts on its resources
    ///   only if its time limit ends before the window opens;
    /// - when the window opens, the jobs still on its resources are checkpointed, stopped and
    ///   requeued (unless --ignore-jobs);
    /// - during the window only the access list (--accounts, --users, --qos; all empty: any
    ///   job that names it) may use them, with `kairos submit --reservation NAME` (or
    ///   `#SBATCH --reservation=NAME`); such jobs wait until it opens;
    /// - --maint shows its nodes as MAINT during the window;
    /// - a repeating reservation (--repeat) rolls forward to its next window; a one-off one
    ///   ends after its window;
    /// - a GPU-count reservation (--gpus) is bound to concrete GPUs when its window opens
    ///   (those whose taking stops the fewest runs); `kairos reservation show` says which.
    ///
    /// TIME is now, +20s / +5m / +2h / +1d (from now), an RFC 3339 time
    /// (2026-12-07T10:00:00Z) or YYYY-MM-DDTHH:MM[:SS] (UTC).
    #[command(verbatim_doc_comment)]
    Create {
        /// The reservation's name (letters, digits, '-', '_', '.').
        name: String,
        #[command(flatten)]
        flags: ReservationFlags,
    },
    /// Change the given settings of a reservation (operators); the others keep their value
    ///
    /// A new --start keeps the window's length unless --duration or --end says otherwise. The
    /// GPUs an open window is bound to stay while what it holds and its window stay the same.
    Update {
        /// The reservation's name.
        name: String,
        #[command(flatten)]
        flags: ReservationFlags,
    },
    /// Delete a reservation (operators): jobs that name it wait (with a reason); runs keep
    /// running.
    Delete {
        /// The reservation's name.
        name: String,
    },
}

#[derive(clap::Args, Debug, Default)]
pub struct ReservationFlags {
    /// The nodes it holds whole, comma-separated.
    #[arg(long, value_name = "LIST", conflicts_with = "gpus")]
    nodes: Option<String>,
    /// A count of GPUs it holds (bound to concrete GPUs when a window opens) instead of nodes.
    #[arg(long, value_name = "N", value_parser = parse_gpus)]
    gpus: Option<u32>,
    /// With --gpus: GPUs of this partition's nodes only ("" = any).
    #[arg(long, value_name = "P")]
    partition: Option<String>,
    /// With --gpus: GPUs of this model only, e.g. H100 ("" = any).
    #[arg(long, value_name = "M")]
    gpu_model: Option<String>,
    /// When the (first) window opens: now, +20s, +5m, +2h, +1d, 2026-12-07T10:00:00Z, or
    /// 2026-12-07T10:00 (UTC).
    #[arg(long, value_name = "TIME", value_parser = parse_time_from_now)]
    start: Option<i64>,
    /// How long each window lasts: 30s, 2h, 1h30m, HH:MM:SS, D-HH:MM:SS, or whole minutes.
    #[arg(long, value_name = "D", value_parser = parse_time, conflicts_with = "end")]
    duration: Option<u64>,
    /// When the (first) window closes (TIME as --start).
    #[arg(long, value_name = "TIME", value_parser = parse_time_from_now)]
    end: Option<i64>,
    /// The window repeats: daily, weekdays (Monday to Friday, UTC), weekly; once (the default)
    /// ends it after its window.
    #[arg(long, value_name = "daily|weekdays|weekly", value_parser = ["once", "daily", "weekdays", "weekly"])]
    repeat: Option<String>,
    /// Accounts whose jobs may use it, comma-separated ("" = none).
    #[arg(long, value_name = "A,B")]
    accounts: Option<String>,
    /// Users whose jobs may use it, comma-separated ("" = none).
    #[arg(long, value_name = "U,V")]
    users: Option<String>,
    /// Jobs of this QoS may use it ("" = none).
    #[arg(long, value_name = "Q")]
    qos: Option<String>,
    /// Maintenance: its nodes show as MAINT during the window (--maint=false to clear).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    maint: Option<bool>,
    /// Leave the runs on its resources running when a window opens, instead of checkpointing
    /// and requeueing them (--ignore-jobs=false to clear).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    ignore_jobs: Option<bool>,
    /// Its windows may overlap another reservation's on a node that also allows it
    /// (--overlap=false to clear).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    overlap: Option<bool>,
}

/// `--start`/`--end`: a time, relative ones from now.
fn parse_time_from_now(s: &str) -> Result<i64, String> {
    parse_at(s, now_ms())
}

impl ReservationFlags {
    /// Sets what the flags give on `r`; the window keeps its length when only --start moves.
    fn apply_to(&self, r: &mut pb::Reservation) {
        if let Some(n) = &self.nodes {
            // Nodes are named whole: a GPU count's choice of them goes (unless given again).
            r.nodes = csv(n);
            r.gpus = 0;
            r.partition.clear();
            r.gpu_model.clear();
        }
        if let Some(g) = self.gpus {
            r.gpus = g;
            if g > 0 {
                r.nodes.clear();
            }
        }
        if let Some(p) = &self.partition {
            r.partition.clone_from(p);
        }
        if let Some(m) = &self.gpu_model {
            r.gpu_model.clone_from(m);
        }
        let length = r.end_ms - r.start_ms;
        if let Some(start) = self.start {
            r.start_ms = start;
            if self.duration.is_none() && self.end.is_none() && length > 0 {
                r.end_ms = start.saturating_add(length);
            }
        }
        if let Some(d) = self.duration {
            r.end_ms =
                r.start_ms.saturating_add(i64::try_from(d).unwrap_or(i64::MAX / 2).saturating_mul(1000));
        }
        if let Some(end) = self.end {
            r.end_ms = end;
        }
        if let Some(repeat) = &self.repeat {
            r.repeat.clone_from(repeat);
        }
        if let Some(a) = &self.accounts {
            r.accounts = csv(a);
        }
        if let Some(u) = &self.users {
            r.users = csv(u);
        }
        if let Some(q) = &self.qos {
            r.qos.clone_from(q);
        }
        if let Some(m) = self.maint {
            r.maint = m;
        }
        if let Some(i) = self.ignore_jobs {
            r.ignore_jobs = i;
        }
        if let Some(o) = self.overlap {
            r.overlap = o;
        }
    }
}

/// "-" for an empty text.
fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

fn non_empty(s: &str) -> Value {
    if s.is_empty() {
        Value::Null
    } else {
        json!(s)
    }
}

/// The bound GPUs as `n1[0,1] n2[3]`.
fn bound_text(r: &pb::Reservation) -> String {
    let parts: Vec<String> = r
        .bound
        .iter()
        .map(|b| format!("{}[{}]", b.node, b.gpus.iter().map(u32::to_string).collect::<Vec<_>>().join(",")))
        .collect();
    parts.join(" ")
}

/// What it holds: its nodes, or `2 GPUs` (of a model, a partition; `on` the bound ones).
fn holds_text(r: &pb::Reservation) -> String {
    if !r.nodes.is_empty() {
        return r.nodes.join(",");
    }
    let mut s = format!("{} GPU{}", r.gpus, if r.gpus == 1 { "" } else { "s" });
    let of: Vec<String> = [("model", &r.gpu_model), ("partition", &r.partition)]
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    if !of.is_empty() {
        s.push_str(&format!(" ({})", of.join(", ")));
    }
    if !r.bound.is_empty() {
        s.push_str(&format!(" on {}", bound_text(r)));
    }
    s
}

/// Who may use it: `accounts a,b; users u; qos q`, or "anyone naming it".
fn access_text(r: &pb::Reservation) -> String {
    let mut parts = Vec::new();
    if !r.accounts.is_empty() {
        parts.push(format!("accounts {}", r.accounts.join(",")));
    }
    if !r.users.is_empty() {
        parts.push(format!("users {}", r.users.join(",")));
    }
    if !r.qos.is_empty() {
        parts.push(format!("qos {}", r.qos));
    }
    if parts.is_empty() {
        "anyone naming it".into()
    } else {
        parts.join("; ")
    }
}

/// MAINT, IGNORE_JOBS, OVERLAP, OPEN, or "-".
fn flags_text(r: &pb::Reservation) -> String {
    let flags: Vec<&str> =
        [(r.maint, "MAINT"), (r.ignore_jobs, "IGNORE_JOBS"), (r.overlap, "OVERLAP"), (r.open, "OPEN")]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect();
    if flags.is_empty() {
        "-".into()
    } else {
        flags.join(",")
    }
}

pub fn reservation_json(r: &pb::Reservation) -> Value {
    json!({
        "name": r.name,
        "nodes": r.nodes,
        "gpus": (r.gpus > 0).then_some(r.gpus),
        "partition": non_empty(&r.partition),
        "gpu_model": non_empty(&r.gpu_model),
        "start_ms": r.start_ms,
        "end_ms": r.end_ms,
        "start": time_json(r.start_ms),
        "end": time_json(r.end_ms),
        "repeat": if r.repeat.is_empty() { "once" } else { r.repeat.as_str() },
        "accounts": r.accounts,
        "users": r.users,
        "qos": non_empty(&r.qos),
        "maint": r.maint,
        "ignore_jobs": r.ignore_jobs,
        "overlap": r.overlap,
        "created_by": non_empty(&r.created_by),
        "next_start_ms": (r.next_start_ms > 0).then_some(r.next_start_ms),
        "next_end_ms": (r.next_end_ms > 0).then_some(r.next_end_ms),
        "next_start": time_json(r.next_start_ms),
        "next_end": time_json(r.next_end_ms),
        "open": r.open,
        "bound": r.bound.iter().map(|b| json!({"node": b.node, "gpus": b.gpus})).collect::<Vec<_>>(),
    })
}

pub const RESERVATION_HEADER: [&str; 7] = ["NAME", "NODES/GPUS", "START", "END", "REPEAT", "ACCESS", "FLAGS"];

fn reservation_row(r: &pb::Reservation) -> Vec<String> {
    vec![
        r.name.clone(),
        holds_text(r),
        local_time(r.next_start_ms),
        local_time(r.next_end_ms),
        if r.repeat.is_empty() { "once".into() } else { r.repeat.clone() },
        access_text(r),
        flags_text(r),
    ]
}

/// `kairos reservation show`: every field, one per line.
fn print_details(r: &pb::Reservation) {
    let lines: Vec<(&str, String)> = vec![
        ("name", r.name.clone()),
        ("nodes", or_dash(&r.nodes.join(","))),
        ("gpus", if r.gpus > 0 { r.gpus.to_string() } else { "-".into() }),
        ("partition", or_dash(&r.partition)),
        ("gpu_model", or_dash(&r.gpu_model)),
        ("repeat", if r.repeat.is_empty() { "once".into() } else { r.repeat.clone() }),
        ("first window", format!("{} to {}", local_time(r.start_ms), local_time(r.end_ms))),
        ("window", format!("{} to {}", local_time(r.next_start_ms), local_time(r.next_end_ms))),
        ("open", if r.open { "yes".into() } else { "no".into() }),
        ("bound", or_dash(&bound_text(r))),
        ("accounts", or_dash(&r.accounts.join(","))),
        ("users", or_dash(&r.users.join(","))),
        ("qos", or_dash(&r.qos)),
        ("access", access_text(r)),
        ("maint", r.maint.to_string()),
        ("ignore_jobs", r.ignore_jobs.to_string()),
        ("overlap", r.overlap.to_string()),
        ("created_by", or_dash(&r.created_by)),
    ];
    for (key, value) in lines {
        println!("{key:>12}: {value}");
    }
}

async fn list_reservations(client: &Client) -> Result<Vec<pb::Reservation>, CallError> {
    let req = pb::ListReservationsRequest {};
    let list = client.admin(req, |mut c, r| async move { c.list_reservations(r).await }).await?;
    Ok(list.into_inner().reservations)
}

async fn find(client: &Client, name: &str) -> Result<pb::Reservation, CallError> {
    list_reservations(client)
        .await?
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| CallError(format!("reservation \"{name}\" not found")))
}

async fn put_reservation(
    client: &Client,
    reservation: pb::Reservation,
    mode: pb::PutMode,
) -> Result<pb::Reservation, CallError> {
    let req = pb::PutReservationRequest { reservation: Some(reservation), mode: mode as i32 };
    client.admin(req, |mut c, r| async move { c.put_reservation(r).await }).await.map(|r| r.into_inner())
}

/// Only what an operator defines travels in a put (the rest is the server's answer).
fn definition(r: pb::Reservation) -> pb::Reservation {
    pb::Reservation {
        created_by: String::new(),
        next_start_ms: 0,
        next_end_ms: 0,
        open: false,
        bound: Vec::new(),
        ..r
    }
}

pub async fn reservation_command(
    client: &Client,
    json: bool,
    command: ReservationCmd,
) -> anyhow::Result<i32> {
    let done = |r: &pb::Reservation, what: &str| {
        if json {
            print_json(&reservation_json(r));
        } else {
            println!(
                "reservation \"{}\" {what}: {} from {} to {}",
                r.name,
                holds_text(r),
                local_time(r.next_start_ms),
                local_time(r.next_end_ms)
            );
        }
    };
    match command {
        ReservationCmd::List => {
            let list = list_reservations(client).await?;
            print_list(json, &list, reservation_json, &RESERVATION_HEADER, reservation_row);
        }
        ReservationCmd::Show { name } => {
            let r = find(client, &name).await?;
            if json {
                print_json(&reservation_json(&r));
            } else {
                print_details(&r);
            }
        }
        ReservationCmd::Create { name, flags } => {
            if flags.nodes.is_none() == flags.gpus.is_none() {
                anyhow::bail!("reservation create: give --nodes LIST or --gpus N");
            }
            if flags.start.is_none() || (flags.duration.is_none() && flags.end.is_none()) {
                anyhow::bail!("reservation create: give --start TIME and --duration D or --end TIME");
            }
            let mut r = pb::Reservation { name, repeat: "once".into(), ..Default::default() };
            flags.apply_to(&mut r);
            let created = put_reservation(client, r, pb::PutMode::Create).await?;
            done(&created, "created");
        }
        ReservationCmd::Update { name, flags } => {
            // The whole reservation is read and written back with the given changes.
            let mut r = definition(find(client, &name).await?);
            flags.apply_to(&mut r);
            let updated = put_reservation(client, r, pb::PutMode::Update).await?;
            done(&updated, "updated");
        }
        ReservationCmd::Delete { name } => {
            let req = pb::DeleteReservationRequest { name: name.clone() };
            client.admin(req, |mut c, r| async move { c.delete_reservation(r).await }).await?;
            println!("reservation \"{name}\" deleted");
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn try_flags(args: &[&str]) -> Result<ReservationFlags, clap::Error> {
        use clap::Parser;
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            f: ReservationFlags,
        }
        let mut argv = vec!["p"];
        argv.extend_from_slice(args);
        P::try_parse_from(argv).map(|p| p.f)
    }

    fn flags(args: &[&str]) -> ReservationFlags {
        try_flags(args).expect("flags parse")
    }

    #[test]
    fn an_update_changes_only_what_it_names_and_a_moved_start_keeps_the_length() {
        let mut r = pb::Reservation {
            name: "m".into(),
            nodes: vec!["n1".into()],
            start_ms: 1_000_000,
            end_ms: 1_060_000,
            users: vec!["alice".into()],
            maint: true,
            ..Default::default()
        };
        flags(&["--start", "2026-12-07T10:00:00Z"]).apply_to(&mut r);
        assert_eq!((r.start_ms, r.end_ms - r.start_ms), (1_796_637_600_000, 60_000));
        assert!(r.maint && r.users == ["alice"] && r.nodes == ["n1"]);
        flags(&["--duration", "2h", "--maint=false", "--accounts", "a,b", "--users", ""]).apply_to(&mut r);
        assert_eq!(r.end_ms - r.start_ms, 7_200_000);
        assert!(!r.maint && r.users.is_empty() && r.accounts == ["a", "b"]);
        flags(&["--gpus", "2", "--ignore-jobs"]).apply_to(&mut r);
        assert!(r.nodes.is_empty() && r.gpus == 2 && r.ignore_jobs);
        flags(&["--end", "2026-12-07T11:00"]).apply_to(&mut r);
        assert_eq!(r.end_ms, 1_796_641_200_000);
        for refused in [
            &["--duration", "1h", "--end", "+2h"][..],
            &["--nodes", "n1", "--gpus", "2"],
            &["--repeat", "monthly"],
            &["--start", "soon"],
        ] {
            assert!(try_flags(refused).is_err(), "{refused:?}");
        }
    }

    #[test]
    fn the_list_row_says_what_it_holds_who_may_use_it_and_its_flags() {
        let r = pb::Reservation {
            name: "train".into(),
            gpus: 2,
            gpu_model: "H100".into(),
            accounts: vec!["a".into()],
            open: true,
            maint: true,
            bound: vec![pb::ReservedGpus { node: "n1".into(), gpus: vec![0, 1] }],
            ..Default::default()
        };
        let row = reservation_row(&r);
        assert_eq!(row[1], "2 GPUs (model H100) on n1[0,1]");
        assert_eq!((row[2].as_str(), row[4].as_str()), ("N/A", "once"));
        assert_eq!((row[5].as_str(), row[6].as_str()), ("accounts a", "MAINT,OPEN"));
        assert_eq!(row.len(), RESERVATION_HEADER.len());
        let j = reservation_json(&r);
        assert_eq!(j["bound"][0]["gpus"], json!([0, 1]));
        assert_eq!((j["gpus"].as_u64(), j["next_start_ms"].is_null()), (Some(2), true));
    }
}
