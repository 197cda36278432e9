//! The JSON API's routes: each is one gRPC method of the job or admin service, so an HTTP call
//! gets the same checks, roles, limits and forwarding as the same call over gRPC. The request
//! message is the JSON body (POST, PUT) with the path's and the query's parameters set on it;
//! the answer is the response message as JSON, or a stream (`Reply`). The table is served as
//! axum routes (`app`), whose `{field}` syntax it shares.

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

impl Route {
    /// The fields its path's `{field}` segments set, in order.
    pub fn path_fields(&self) -> impl Iterator<Item = &'static str> {
        self.path.split('/').filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
    }

    /// Its path as axum routes it: the `{field}` segments numbered (`{0}`, `{1}`), since routes
    /// of one shape name theirs differently (`PUT /qos/{qos.name}`, `DELETE /qos/{name}`).
    pub fn axum_path(&self) -> String {
        let mut n = 0;
        let segments: Vec<String> = self
            .path
            .split('/')
            .map(|s| match s.starts_with('{') {
                true => {
                    n += 1;
                    format!("{{{}}}", n - 1)
                }
                false => s.to_string(),
            })
            .collect();
        segments.join("/")
    }
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
    route("GET", "/api/v1/jobs/{job_id}/usage", "/kairos.v1.JobService/JobUsage", Reply::Json,
          "what the job's current run uses, measured on its node: totals and a bounded series"),
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
    route("GET", "/api/v1/topology", "/kairos.v1.AdminService/GetTopology", Reply::Json,
          "topology levels and every node's domain at each"),
    route("PUT", "/api/v1/topology", "/kairos.v1.AdminService/SetTopology", Reply::Json,
          "replaces the topology (operators)"),
    route("GET", "/api/v1/reservations", "/kairos.v1.AdminService/ListReservations", Reply::Json,
          "reservations with their next or open window"),
    route("PUT", "/api/v1/reservations/{reservation.name}", "/kairos.v1.AdminService/PutReservation",
          Reply::Json, "creates or updates a reservation (operators)"),
    route("DELETE", "/api/v1/reservations/{name}", "/kairos.v1.AdminService/DeleteReservation", Reply::Json,
          "deletes a reservation (operators)"),
    route("GET", "/api/v1/tokens", "/kairos.v1.AdminService/ListTokens", Reply::Json,
          "API tokens (admins)"),
    route("POST", "/api/v1/tokens", "/kairos.v1.AdminService/CreateToken", Reply::Json,
          "issues an API token, shown once (admins)"),
    route("DELETE", "/api/v1/tokens/{id}", "/kairos.v1.AdminService/RevokeToken", Reply::Json,
          "revokes an API token (admins)"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_fields_are_named_by_the_table_and_numbered_for_axum() {
        let put = ROUTES.iter().find(|r| r.path == "/api/v1/qos/{qos.name}").unwrap();
        assert_eq!(put.path_fields().collect::<Vec<_>>(), ["qos.name"]);
        assert_eq!(put.axum_path(), "/api/v1/qos/{0}");
        let cancel = ROUTES.iter().find(|r| r.path.ends_with("/cancel")).unwrap();
        assert_eq!(cancel.axum_path(), "/api/v1/jobs/{0}/cancel");
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
