//! What jobs really used, as their nodes measured it: the figures of a history record
//! (`figures`), one job's efficiency (`eff`, like seff), its live series (`top`), sums per
//! account, user, QoS or partition (`report`, like sreport), and policy advice from the
//! history (`advise`).

pub mod advise;
pub mod eff;
pub mod figures;
pub mod report;
pub mod top;

use kairos_proto::v1 as pb;

use crate::client::Client;

/// Every history record `request` selects, every page of them.
pub async fn records(client: &Client, request: pb::ListHistoryRequest) -> anyhow::Result<Vec<pb::JobRecord>> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let req = pb::ListHistoryRequest { page_token: page_token.clone(), ..request.clone() };
        let page = client.jobs(req, |mut c, r| async move { c.list_history(r).await }).await?.into_inner();
        out.extend(page.records);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        page_token = page.next_page_token;
    }
}

/// The history record of job `id`.
pub async fn record(client: &Client, id: u64) -> anyhow::Result<pb::JobRecord> {
    let job = client
        .jobs(pb::GetJobRequest { job_id: id }, |mut c, r| async move { c.get_job(r).await })
        .await?
        .into_inner();
    let at = job.submit_time_ms;
    let request = pb::ListHistoryRequest { since_ms: at, until_ms: at, user: job.user, ..Default::default() };
    let found = records(client, request).await?.into_iter().find(|r| r.id == id);
    found.ok_or_else(|| anyhow::anyhow!("job {id} has no history record"))
}
