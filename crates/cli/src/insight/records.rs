//! Reading the history: a time window from the command line, every page of a `ListHistory`
//! query (`history`, `report usage` and `policy advise` ask the same one, so their numbers
//! reconcile), and one job's record.

use std::time::{SystemTime, UNIX_EPOCH};

use kairos_proto::v1 as pb;

use crate::client::Client;

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// A `--since`/`--until` value in Unix ms: a time ago, a date, or an RFC 3339 time.
pub fn parse_when(s: &str, now: i64) -> Result<i64, String> {
    let s = s.trim();
    if let Ok(ago) = humantime::parse_duration(s) {
        return Ok(now - ago.as_millis() as i64);
    }
    let full = if s.len() == 10 { format!("{s}T00:00:00Z") } else { s.to_string() };
    humantime::parse_rfc3339_weak(&full)
        .map(|t| t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0))
        .map_err(|_| format!("cannot parse \"{s}\" (use e.g. 2h, 7d, 2026-11-30 or 2026-11-30T08:00:00Z)"))
}

/// The window `[since, until]` of `--since` (default `default_since` ago) and `--until`
/// (default: now, sent as 0 = unbounded). Errors name the flag.
pub fn window(
    since: Option<&str>,
    until: Option<&str>,
    default_since_ms: i64,
    now: i64,
) -> anyhow::Result<(i64, i64)> {
    let since = match since {
        Some(s) => parse_when(s, now).map_err(|e| anyhow::anyhow!("--since: {e}"))?,
        None => now - default_since_ms,
    };
    let until = match until {
        Some(s) => parse_when(s, now).map_err(|e| anyhow::anyhow!("--until: {e}"))?,
        None => 0,
    };
    if until != 0 && until < since {
        anyhow::bail!("--until is before --since");
    }
    Ok((since, until))
}

/// Every record `request` selects, page after page.
pub async fn all(client: &Client, request: pb::ListHistoryRequest) -> anyhow::Result<Vec<pb::JobRecord>> {
    let mut records = Vec::new();
    let mut page_token = String::new();
    loop {
        let req = pb::ListHistoryRequest { page_token: page_token.clone(), ..request.clone() };
        let page = client.jobs(req, |mut c, r| async move { c.list_history(r).await }).await?.into_inner();
        records.extend(page.records);
        if page.next_page_token.is_empty() {
            return Ok(records);
        }
        page_token = page.next_page_token;
    }
}

/// One job's history record (live or purged), whenever it ran: the page of one record after
/// the id before it (the server pages by job id).
pub async fn one(client: &Client, id: u64) -> anyhow::Result<pb::JobRecord> {
    let request = pb::ListHistoryRequest {
        limit: 1,
        page_token: if id > 1 { (id - 1).to_string() } else { String::new() },
        ..Default::default()
    };
    let page = client.jobs(request, |mut c, r| async move { c.list_history(r).await }).await?.into_inner();
    page.records
        .into_iter()
        .find(|r| r.id == id)
        .ok_or_else(|| anyhow::anyhow!("job {id}: no such job (or not yours)"))
}
