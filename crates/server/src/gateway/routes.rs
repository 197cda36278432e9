//! The JSON API's routes: each is one gRPC method of the job or admin service, so an HTTP call
//! gets the same checks, roles, limits and forwarding as the same call over gRPC. The request
//! message is the JSON body (POST, PUT) with the path's and the query's parameters set on it;
//! the answer is the response message as JSON, or a stream (`Reply`).

/// How a route answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// One JSON object.
    Json,
    /// Server-sent events: one `data:` line of JSON per message of a server stream.
    Events,
    /// The `data` bytes of a stream of `LogChunk`s, as `text/plain`.
    Text,
}

/// One route: `method path` → the gRPC method `rpc` (`/package.Service/Method`).
#[derive(Clone, Copy, Debug)]
pub struct Route {
    pub method: &'static str,
    /// `/api/v1/jobs/{job_id}`: a `{field}` segment sets that field of the request (a dotted
    /// name sets a field of a nested message: `{qos.name}`).
    pub path: &'static str,
    pub rpc: &'static str,
    /// Whether the request message is read from the JSON body.
    pub body: bool,
    pub reply: Reply,
    pub summary: &'static str,
}

const fn route(
    method: &'static str,
    path: &'static str,
    rpc: &'static str,
    reply: Reply,
    summary: &'static str,
) -> Route {
    let body = matches!(method.as_bytes(), b"POST" | b"PUT");
    Route { method, path, rpc, body, reply, summary }
}

/// Every route of `/api/v1`.
#[rustfmt::skip]
pub const ROUTES: &[Route] = &[
    route("GET", "/api/v1/whoami", "/kairos.v1.JobService/WhoAmI", Reply::Json,
          "who the credentials are, and their role"),
    route("GET", "/api/v1/jobs", "/kairos.v1.JobService/ListJobs", Reply::Json,
          "jobs, with the queue's filters, a page at a time"),
    route("POST", "/api/v1/jobs", "/kairos.v1.JobService/Submit", Reply::Json,
          "submits a job"),
    route("GET", "/api/v1/jobs/{job_id}", "/kairos.v1.JobService/GetJob", Reply::Json,
          "one job, with its events"),
    route("POST", "/api/v1/jobs/{job_id}/cancel", "/kairos.v1.JobService/CancelJob", Reply::Json,
          "cancels a job"),
    route("POST", "/api/v1/jobs/{job_id}/hold", "/kairos.v1.JobService/HoldJob", Reply::Json,
          "keeps a pending job from starting"),
    route("POST", "/api/v1/jobs/{job_id}/release", "/kairos.v1.JobService/ReleaseJob", Reply::Json,
          "lets a held job start"),
    route("GET", "/api/v1/jobs/{job_id}/events", "/kairos.v1.JobService/WatchJob", Reply::Events,
          "the job each time it changes (server-sent events), until it ends"),
    route("GET", "/api/v1/jobs/{job_id}/logs", "/kairos.v1.JobService/StreamLogs", Reply::Text,
          "the job's output (`follow=true`: as it is written)"),
    route("GET", "/api/v1/history", "/kairos.v1.JobService/ListHistory", Reply::Json,
          "accounting: jobs live in a window, finished ones included"),
    route("GET", "/api/v1/nodes", "/kairos.v1.AdminService/ListNodes", Reply::Json,
          "nodes and their GPUs"),
    route("POST", "/api/v1/nodes/{node}/drain", "/kairos.v1.AdminService/DrainNode", Reply::Json,
          "stops placing work on a node (operators)"),
    route("POST", "/api/v1/nodes/{node}/resume", "/kairos.v1.AdminService/ResumeNode", Reply::Json,
          "places work on a drained node again (operators)"),
    route("DELETE", "/api/v1/nodes/{node}", "/kairos.v1.AdminService/RemoveNode", Reply::Json,
          "forgets a node that holds no job (operators)"),
    route("GET", "/api/v1/cluster", "/kairos.v1.AdminService/ClusterStatus", Reply::Json,
          "replicas, leader, term, applied index"),
    route("GET", "/api/v1/policy", "/kairos.v1.AdminService/GetPolicy", Reply::Json,
          "QoS, accounts, partitions and priority weights"),
    route("PUT", "/api/v1/policy", "/kairos.v1.AdminService/ApplyPolicy", Reply::Json,
          "replaces the whole policy (admins)"),
    route("PUT", "/api/v1/qos/{qos.name}", "/kairos.v1.AdminService/PutQos", Reply::Json,
          "creates or updates a QoS (admins)"),
    route("DELETE", "/api/v1/qos/{name}", "/kairos.v1.AdminService/DeleteQos", Reply::Json,
          "deletes a QoS (admins)"),
    route("PUT", "/api/v1/accounts/{account.name}", "/kairos.v1.AdminService/PutAccount", Reply::Json,
          "creates or updates an account (admins)"),
    route("DELETE", "/api/v1/accounts/{name}", "/kairos.v1.AdminService/DeleteAccount", Reply::Json,
          "deletes an account (admins)"),
    route("PUT", "/api/v1/partitions/{partition.name}", "/kairos.v1.AdminService/PutPartition", Reply::Json,
          "creates or updates a partition (admins)"),
    route("DELETE", "/api/v1/partitions/{name}", "/kairos.v1.AdminService/DeletePartition", Reply::Json,
          "deletes a partition (admins)"),
    route("GET", "/api/v1/priorities", "/kairos.v1.AdminService/GetPriorities", Reply::Json,
          "pending jobs' priority and its factors"),
    route("GET", "/api/v1/fairshare", "/kairos.v1.AdminService/GetShares", Reply::Json,
          "accounts' shares, usage and fairshare factor"),
    route("GET", "/api/v1/preemptions", "/kairos.v1.AdminService/ListPreemptions", Reply::Json,
          "recent preemptions: preemptor, victim, outcome"),
    route("GET", "/api/v1/burst", "/kairos.v1.AdminService/BurstStatus", Reply::Json,
          "cloud burst instances, GPUs, spend and decisions"),
    route("GET", "/api/v1/burst/config", "/kairos.v1.AdminService/GetBurstConfig", Reply::Json,
          "the cloud burst configuration"),
    route("PUT", "/api/v1/burst/config", "/kairos.v1.AdminService/SetBurstConfig", Reply::Json,
          "replaces the cloud burst configuration (admins)"),
    route("GET", "/api/v1/tokens", "/kairos.v1.AdminService/ListTokens", Reply::Json,
          "API tokens (admins)"),
    route("POST", "/api/v1/tokens", "/kairos.v1.AdminService/CreateToken", Reply::Json,
          "issues an API token, shown once (admins)"),
    route("DELETE", "/api/v1/tokens/{id}", "/kairos.v1.AdminService/RevokeToken", Reply::Json,
          "revokes an API token (admins)"),
];

/// The values of a path's `{field}` segments, by field.
pub type PathParams = Vec<(&'static str, String)>;

/// The route for `method path`, with the values of its `{field}` segments; `Err(true)` when
/// the path exists for another method (405), `Err(false)` when it does not (404).
pub fn find(method: &str, path: &str) -> Result<(&'static Route, PathParams), bool> {
    let mut path_known = false;
    for r in ROUTES {
        if let Some(params) = matches(r.path, path) {
            if r.method == method {
                return Ok((r, params));
            }
            path_known = true;
        }
    }
    Err(path_known)
}

/// The `{field}` values of `path` against `pattern`, or None if it does not match.
fn matches(pattern: &'static str, path: &str) -> Option<PathParams> {
    let mut want = pattern.split('/');
    let mut have = path.split('/');
    let mut params = Vec::new();
    loop {
        match (want.next(), have.next()) {
            (None, None) => return Some(params),
            (Some(w), Some(h)) => match w.strip_prefix('{').and_then(|w| w.strip_suffix('}')) {
                Some(field) if !h.is_empty() => params.push((field, percent_decode(h)?)),
                Some(_) => return None,
                None if w == h => {}
                None => return None,
            },
            _ => return None,
        }
    }
}

/// `%XX`-decodes a path segment or query value (`+` stays itself in a path; the caller turns a
/// query's `+` into a space first); None when it is not UTF-8 or a `%` is malformed.
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_find_their_route_and_fields() {
        let (r, p) = find("GET", "/api/v1/jobs/42").unwrap();
        assert_eq!(r.rpc, "/kairos.v1.JobService/GetJob");
        assert_eq!(p, vec![("job_id", "42".to_string())]);
        let (r, p) = find("PUT", "/api/v1/qos/urgent%20x").unwrap();
        assert_eq!(
            (r.rpc, p),
            ("/kairos.v1.AdminService/PutQos", vec![("qos.name", "urgent x".to_string())])
        );
        assert!(r.body);
        assert!(find("PATCH", "/api/v1/jobs/42").unwrap_err());
        assert!(!find("GET", "/api/v1/jobs/42/nothing").unwrap_err());
        assert!(!find("GET", "/api/v1/jobs/").unwrap_err());
        assert!(!find("GET", "/api/v1/jobs/%zz").unwrap_err());
    }

    #[test]
    fn no_two_routes_share_a_method_and_path() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(!(a.method == b.method && a.path == b.path), "{} {}", a.method, a.path);
            }
        }
    }
}
