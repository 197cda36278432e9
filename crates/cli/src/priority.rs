//! Why jobs wait and what preemption cost: `kairos priority` (like sprio) and
//! `kairos preemptions`.

use kairos_proto::v1 as pb;

use crate::client::Client;
use crate::output::{self, print_json, print_list, table};

pub async fn priority(client: &Client, json: bool, id: Option<u64>) -> anyhow::Result<i32> {
    let req = pb::GetPrioritiesRequest { job_id: id.unwrap_or(0) };
    let resp = client.admin(req, |mut c, r| async move { c.get_priorities(r).await }).await?.into_inner();
    let mut jobs = resp.jobs;
    jobs.sort_by_key(|j| (std::cmp::Reverse(j.priority), j.job_id));
    let round = |x: f64| (x * 10_000.0).round() / 10_000.0;
    if json {
        let v: Vec<serde_json::Value> = jobs
            .iter()
            .map(|j| {
                serde_json::json!({
                    "id": j.job_id, "user": j.user, "account": j.account, "qos": j.qos,
                    "priority": j.priority, "qos_factor": round(j.qos_factor),
                    "age_factor": round(j.age_factor), "fairshare_factor": round(j.fairshare_factor),
                    "job_size_factor": round(j.job_size_factor),
                })
            })
            .collect();
        print_json(&serde_json::Value::Array(v));
    } else {
        let w = resp.weights.unwrap_or_default();
        println!("weights: qos {} age {} fairshare {} job size {}", w.qos, w.age, w.fairshare, w.job_size);
        let rows: Vec<Vec<String>> = jobs
            .iter()
            .map(|j| {
                vec![
                    j.job_id.to_string(),
                    j.user.clone(),
                    j.account.clone(),
                    j.qos.clone(),
                    j.priority.to_string(),
                    format!("{:.4}", j.qos_factor),
                    format!("{:.4}", j.age_factor),
                    format!("{:.4}", j.fairshare_factor),
                    format!("{:.4}", j.job_size_factor),
                ]
            })
            .collect();
        table(&["ID", "USER", "ACCOUNT", "QOS", "PRIORITY", "QOS", "AGE", "FAIRSHARE", "SIZE"], &rows);
    }
    Ok(0)
}

/// Recent preemptions (those in the last `since` seconds).
pub async fn preemptions(client: &Client, json: bool, since: Option<u64>) -> anyhow::Result<i32> {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    let since_ms = since.map(|s| now_ms - (s as i64) * 1000).unwrap_or(0);
    let list = client
        .admin(pb::ListPreemptionsRequest { since_ms }, |mut c, r| async move { c.list_preemptions(r).await })
        .await?
        .into_inner()
        .preemptions;
    print_list(
        json,
        &list,
        |r| {
            serde_json::json!({
                "time": output::time_json(r.time_ms), "preemptor": r.preemptor, "victim": r.victim,
                "mode": r.mode, "node": r.node, "gpu_s_lost": r.gpu_s_lost,
                "reclaimed_for": (!r.reclaimed_for.is_empty()).then(|| r.reclaimed_for.clone()),
                "reclaimed_gpus": r.reclaimed_gpus,
            })
        },
        &["TIME", "PREEMPTOR", "VICTIM", "MODE", "NODE", "GPU-S LOST", "WHY"],
        |r| {
            vec![
                output::time_json(r.time_ms).as_str().unwrap_or("-").to_string(),
                r.preemptor.to_string(),
                r.victim.to_string(),
                r.mode.clone(),
                r.node.clone(),
                r.gpu_s_lost.to_string(),
                if r.reclaimed_for.is_empty() {
                    "qos".to_string()
                } else {
                    format!("reclaimed for account {} ({} GPUs)", r.reclaimed_for, r.reclaimed_gpus)
                },
            ]
        },
    );
    Ok(0)
}
