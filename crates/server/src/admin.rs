//! The admin service: nodes and the controller cluster's status.

use kairos_proto::v1 as pb;
use kairos_proto::v1::admin_service_server::AdminService;
use tonic::{Request, Response, Status};

use kairos_consensus::membership::MembershipError;
use kairos_consensus::WriteError;

use kairos_scheduler::policy::{PolicyItem, PolicyKind};
use kairos_scheduler::{Op, Outcome};

use kairos_consensus::auth::{random_hex, sha256_hex};
use kairos_scheduler::tokens::{valid_user_name, Role, TokenRecord, TOKEN_ID_LEN};
use kairos_scheduler::validate::REQUEST_ID_LEN_MAX;

use crate::auth::{split_token, Principal, TOKEN_PREFIX};
use crate::context::{now_ms, rejection_status, write_status, Ctx};
use crate::convert::node_to_pb;
use crate::convert_burst::burst_status;
use kairos_convert::burst::{burst_config_from_pb, burst_config_to_pb};
use kairos_convert::policy::{
    account_from_pb, account_to_pb, partition_from_pb, partition_to_pb, policy_from_pb, policy_to_pb,
    qos_from_pb, qos_to_pb, weights_to_pb,
};
use kairos_convert::topology::{topology_from_pb, topology_to_pb};

pub struct AdminApi {
    pub ctx: Ctx,
    /// The EC2 endpoint override (`--burst-endpoint`) instance types are checked against.
    pub burst_endpoint: Option<String>,
}

/// How long `cluster status` waits for a member to accept a connection.
const REACH_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

/// Bytes per chunk of a streamed backup (clients decode up to 4 MiB per message).
const BACKUP_CHUNK_BYTES: usize = 1024 * 1024;

type BoxStream<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl AdminService for AdminApi {
    type SaveSnapshotStream = BoxStream<pb::SnapshotChunk>;

    async fn save_snapshot(
        &self,
        request: Request<pb::SaveSnapshotRequest>,
    ) -> Result<Response<Self::SaveSnapshotStream>, Status> {
        self.ctx.principal(&request)?.require(Role::Admin, "saving a snapshot of the cluster")?;
        if !self.ctx.replica.is_leader() {
            return Err(self.ctx.not_leader());
        }
        // A read barrier: this replica still leads (a quorum says so) and has applied everything
        // committed before the call, so the backup holds every acknowledged write.
        let barrier = tokio::time::timeout(
            kairos_consensus::WRITE_TIMEOUT,
            self.ctx.replica.raft.ensure_linearizable(),
        )
        .await;
        match barrier {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return Err(self.ctx.not_leader()),
            Err(_) => {
                return Err(Status::unavailable("no quorum confirmed this replica's leadership in time"))
            }
        }
        let (state, applied) = self.ctx.replica.read(|a| (a.state.clone(), a.last_applied));
        let taken = now_ms();
        let key = self.ctx.auth.key.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            kairos_consensus::backup::encode(&state, applied, taken, &key)
        })
        .await
        .map_err(|e| Status::internal(format!("encoding the backup: {e}")))?
        .map_err(|e| Status::internal(format!("encoding the backup: {e}")))?;
        tracing::info!(bytes = bytes.len(), index = applied.map_or(0, |l| l.index), "backup taken");
        let chunks: Vec<Result<pb::SnapshotChunk, Status>> =
            bytes.chunks(BACKUP_CHUNK_BYTES).map(|c| Ok(pb::SnapshotChunk { data: c.to_vec() })).collect();
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    async fn list_nodes(
        &self,
        request: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        self.ctx.principal(&request)?;
        self.ctx.readable()?;
        let liveness = self.ctx.liveness().clone();
        let nodes = self.ctx.replica.read(|a| {
            let view = |n: &kairos_scheduler::model::Node| {
                let mut v = node_to_pb(n, liveness.last_seen_ms(&n.info.name));
                v.maint = a.state.maint_of(&n.info.name).unwrap_or_default().to_string();
                v
            };
            a.state.nodes.values().map(view).collect()
        });
        Ok(Response::new(pb::ListNodesResponse { nodes }))
    }

    async fn cluster_status(
        &self,
        request: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        self.ctx.principal(&request)?;
        Ok(Response::new(self.status().await))
    }

    async fn add_replica(
        &self,
        request: Request<pb::AddReplicaRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        self.ctx.principal(&request)?.require(Role::Admin, "changing the controller membership")?;
        let req = request.into_inner();
        self.ctx.replica.add_replica(req.id, &req.addr).await.map_err(membership_status)?;
        Ok(Response::new(self.status().await))
    }

    async fn remove_replica(
        &self,
        request: Request<pb::RemoveReplicaRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        self.ctx.principal(&request)?.require(Role::Admin, "changing the controller membership")?;
        let req = request.into_inner();
        self.ctx.replica.remove_replica(req.id).await.map_err(membership_status)?;
        Ok(Response::new(self.status().await))
    }

    async fn get_policy(
        &self,
        request: Request<pb::GetPolicyRequest>,
    ) -> Result<Response<pb::Policy>, Status> {
        self.ctx.principal(&request)?;
        self.ctx.readable()?;
        Ok(Response::new(self.ctx.replica.read(|a| policy_to_pb(&a.state.policy))))
    }

    async fn apply_policy(&self, request: Request<pb::Policy>) -> Result<Response<pb::Policy>, Status> {
        let me = self.ctx.principal(&request)?;
        me.require(Role::Admin, "changing the policy")?;
        let pb = request.into_inner();
        let what_if = pb.what_if_hash.clone();
        if what_if.len() > 64 || !what_if.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(Status::invalid_argument("what_if_hash: at most 64 hexadecimal digits"));
        }
        let policy = policy_from_pb(pb)?;
        let audit = kairos_scheduler::events::PolicyAudit { token_id: me.token_id, user: me.user, what_if };
        self.policy_write(Op::SetPolicy { policy, audit: Some(audit) }).await?;
        Ok(Response::new(self.ctx.replica.read(|a| policy_to_pb(&a.state.policy))))
    }

    async fn put_qos(&self, request: Request<pb::PutQosRequest>) -> Result<Response<pb::Qos>, Status> {
        self.ctx.principal(&request)?.require(Role::Admin, "changing QoS")?;
        let req = request.into_inner();
        let qos = qos_from_pb(req.qos.ok_or_else(|| Status::invalid_argument("qos: required"))?)?;
        let must_exist = must_exist(req.mode)?;
        let name = qos.name.clone();
        self.policy_write(Op::PutQos { qos, must_exist }).await?;
        let stored = self.ctx.replica.read(|a| a.state.policy.qos(&name).map(qos_to_pb));
        stored.map(Response::new).ok_or_else(|| Status::not_found(format!("qos \"{name}\" not found")))
    }

    async fn put_account(
        &self,
        request: Request<pb::PutAccountRequest>,
    ) -> Result<Response<pb::Account>, Status> {
        self.ctx.principal(&request)?.require(Role::Admin, "changing accounts")?;
        let req = request.into_inner();
        let account =
            account_from_pb(req.account.ok_or_else(|| Status::invalid_argument("account: required"))?);
        let name = account.name.clone();
        self.put_item(PolicyItem::Account(account), req.mode, |p| p.accounts.get(&name).map(account_to_pb))
            .await
    }

    async fn delete_account(
        &self,
        request: Request<pb::DeleteAccountRequest>,
    ) -> Result<Response<pb::DeleteAccountResponse>, Status> {
        self.ctx.principal(&request)?.require(Role::Admin, "changing accounts")?;
        let name = request.into_inner().name;
        self.policy_write(Op::DeletePolicyItem { kind: PolicyKind::Account, name }).await?;
        Ok(Response::new(pb::DeleteAccountResponse {}))
    }

    async fn put_partition(
        &self,
        request: Request<pb::PutPartitionRequest>,
    ) -> Result<Response<pb::Partition>, Status> {
        self.ctx.principal(&request)?.require(Role::Admin, "changing partitions")?;
        let req = request.into_inner();
        let partition =
            partition_from_pb(req.partition.ok_or_else(|| Status::invalid_argument("partition: required"))?)?;
        let name = partition.name.clone();
        self.put_item(PolicyItem::Partition(partition), req.mode, |p| {
            p.partitions.get(&name).map(partition_to_pb)
        })
        .await
    }

    async fn delete_partition(
        &self,
        request: Request<pb::DeletePartitionRequest>,
    ) -> Result<Response<pb::DeletePartitionResponse>, Status> {
        self.ctx.principal(&request)?.require(Role::Admin, "changing partitions")?;
        let name = request.into_inner().name;
        self.policy_write(Op::DeletePolicyItem { kind: PolicyKind::Partition, name }).await?;
        Ok(Response::new(pb::DeletePartitionResponse {}))
    }

    async fn get_priorities(
        &self,
        request: Request<pb::GetPrioritiesRequest>,
    ) -> Result<Response<pb::GetPrioritiesResponse>, Status> {
        let me = self.ctx.principal(&request)?;
        self.ctx.readable()?;
        Ok(Response::new(self.priorities(&me, request.into_inner().job_id)?))
    }

    async fn get_shares(
        &self,
        request: Request<pb::GetSharesRequest>,
    ) -> Result<Response<pb::GetSharesResponse>, Status> {
        self.ctx.principal(&request)?;
        self.ctx.readable()?;
        use kairos_scheduler::priority::{fairshare_factors, ONE};
        let accounts = self.ctx.replica.read(|a| {
            let factors = fairshare_factors(&a.state);
            let half_life = a.state.policy.weights.fairshare_half_life_s;
            let teams = a.state.guarantees().report();
            let team = |name: &str| teams.iter().find(|t| t.account == name);
            a.state
                .policy
                .accounts
                .values()
                .map(|acc| pb::AccountShare {
                    guaranteed_gpus: acc.guarantee.as_ref().map(|g| g.gpus),
                    gpus_in_use: team(&acc.name).map_or(0, |t| t.in_use),
                    gpus_borrowed: team(&acc.name).map_or(0, |t| t.borrowed),
                    gpus_lent: team(&acc.name).map_or(0, |t| t.lent),
                    name: acc.name.clone(),
                    parent: acc.parent.clone().unwrap_or_default(),
                    shares: acc.shares,
                    usage_gpu_s: a
                        .state
                        .usage
                        .get(&acc.name)
                        .map(|u| u.at(a.state.now_ms, half_life))
                        .unwrap_or(0) as f64
                        / 1000.0,
                    fairshare_factor: factors.get(&acc.name).copied().unwrap_or(ONE) as f64 / ONE as f64,
                })
                .collect()
        });
        Ok(Response::new(pb::GetSharesResponse { accounts }))
    }

    async fn get_burst_config(
        &self,
        request: Request<pb::GetBurstConfigRequest>,
    ) -> Result<Response<pb::BurstConfig>, Status> {
        self.ctx.principal(&request)?;
        self.ctx.readable()?;
        let config = self.ctx.replica.read(|a| burst_config_to_pb(&a.state.burst.config));
        Ok(Response::new(config))
    }

    async fn set_burst_config(
        &self,
        request: Request<pb::BurstConfig>,
    ) -> Result<Response<pb::BurstConfig>, Status> {
        self.ctx.principal(&request)?.require(Role::Admin, "changing the burst configuration")?;
        let config = burst_config_from_pb(request.into_inner());
        self.check_instance_types(&config).await?;
        match self.ctx.write(Op::SetBurstConfig { config }).await? {
            Outcome::PolicyChanged => {
                self.ctx.kick.notify_one();
                let config = self.ctx.replica.read(|a| burst_config_to_pb(&a.state.burst.config));
                Ok(Response::new(config))
            }
            Outcome::Rejected(r) => Err(rejection_status(r)),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    async fn burst_status(
        &self,
        request: Request<pb::BurstStatusRequest>,
    ) -> Result<Response<pb::BurstStatusResponse>, Status> {
        self.ctx.principal(&request)?;
        self.ctx.readable()?;
        let now = self.ctx.cluster_now();
        Ok(Response::new(self.ctx.replica.read(|a| burst_status(&a.state, now))))
    }

    async fn put_reservation(
        &self,
        request: Request<pb::PutReservationRequest>,
    ) -> Result<Response<pb::Reservation>, Status> {
        self.reservation_put(request).await
    }

    async fn delete_reservation(
        &self,
        request: Request<pb::DeleteReservationRequest>,
    ) -> Result<Response<pb::DeleteReservationResponse>, Status> {
        self.reservation_delete(request).await
    }

    async fn list_reservations(
        &self,
        request: Request<pb::ListReservationsRequest>,
    ) -> Result<Response<pb::ListReservationsResponse>, Status> {
        self.reservation_list(request).await
    }

    async fn list_cluster_events(
        &self,
        request: Request<pb::ListClusterEventsRequest>,
    ) -> Result<Response<pb::ListClusterEventsResponse>, Status> {
        self.ctx.principal(&request)?.require(Role::Operator, "reading the cluster's event log")?;
        self.ctx.readable()?;
        let since = request.into_inner().since_ms;
        let events = self.ctx.replica.read(|a| {
            a.state
                .events
                .iter()
                .filter(|e| e.time_ms >= since)
                .map(kairos_convert::events::cluster_event_to_pb)
                .collect()
        });
        Ok(Response::new(pb::ListClusterEventsResponse { events }))
    }

    async fn get_topology(
        &self,
        request: Request<pb::GetTopologyRequest>,
    ) -> Result<Response<pb::Topology>, Status> {
        self.ctx.principal(&request)?;
        self.ctx.readable()?;
        let topology = self.ctx.replica.read(|a| topology_to_pb(&a.state.topology, a.state.nodes.iter()));
        Ok(Response::new(topology))
    }

    async fn set_topology(&self, request: Request<pb::Topology>) -> Result<Response<pb::Topology>, Status> {
        self.ctx.principal(&request)?.require(Role::Operator, "changing the topology")?;
        let topology = topology_from_pb(request.into_inner()).map_err(Status::invalid_argument)?;
        match self.ctx.write(Op::SetTopology { topology }).await? {
            Outcome::TopologyChanged => {
                self.ctx.kick.notify_one();
                let t = self.ctx.replica.read(|a| topology_to_pb(&a.state.topology, a.state.nodes.iter()));
                Ok(Response::new(t))
            }
            Outcome::Rejected(r) => Err(rejection_status(r)),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    async fn list_preemptions(
        &self,
        request: Request<pb::ListPreemptionsRequest>,
    ) -> Result<Response<pb::ListPreemptionsResponse>, Status> {
        let me = self.ctx.principal(&request)?;
        self.ctx.readable()?;
        let since = request.into_inner().since_ms;
        let preemptions = self.ctx.replica.read(|a| {
            // A user sees the preemptions their own jobs took part in (as preemptor or victim);
            // operators see every one. The owner is the live job's, else its history record's.
            let owner = |id: u64| {
                a.state
                    .jobs
                    .get(&id)
                    .map(|j| j.spec.user.as_str())
                    .or_else(|| a.state.history.get(id).map(|r| r.user.as_str()))
            };
            a.state
                .preemptions
                .iter()
                .filter(|r| r.time_ms >= since)
                .filter(|r| {
                    me.role >= Role::Operator
                        || [r.preemptor, r.victim].into_iter().any(|id| owner(id) == Some(me.user.as_str()))
                })
                .map(|r| pb::PreemptionRecord {
                    time_ms: r.time_ms,
                    preemptor: r.preemptor,
                    victim: r.victim,
                    mode: r.action().to_string(),
                    node: r.node.clone(),
                    gpu_s_lost: r.gpu_s_lost,
                    reclaimed_for: r.reclaimed_for.clone().unwrap_or_default(),
                    reclaimed_gpus: r.reclaimed_gpus,
                })
                .collect()
        });
        Ok(Response::new(pb::ListPreemptionsResponse { preemptions }))
    }

    async fn delete_qos(
        &self,
        request: Request<pb::DeleteQosRequest>,
    ) -> Result<Response<pb::DeleteQosResponse>, Status> {
        self.ctx.principal(&request)?.require(Role::Admin, "changing QoS")?;
        let name = request.into_inner().name;
        self.policy_write(Op::DeleteQos { name }).await?;
        Ok(Response::new(pb::DeleteQosResponse {}))
    }

    async fn create_token(
        &self,
        request: Request<pb::CreateTokenRequest>,
    ) -> Result<Response<pb::CreateTokenResponse>, Status> {
        let me = self.ctx.principal(&request)?;
        me.require(Role::Admin, "creating tokens")?;
        let req = request.into_inner();
        let role = Role::parse(&req.role).ok_or_else(|| {
            Status::invalid_argument(format!(
                "role: \"{}\" is not user, operator or admin",
                req.role.chars().take(32).collect::<String>()
            ))
        })?;
        if !valid_user_name(&req.user) {
            return Err(Status::invalid_argument("user: 1-64 characters of [A-Za-z0-9._-]"));
        }
        if req.ttl_s > TOKEN_TTL_S_MAX {
            return Err(Status::invalid_argument(format!("ttl: at most {TOKEN_TTL_S_MAX} s")));
        }
        let (id, secret) = match req.request_id.as_str() {
            "" => {
                let random = |n| random_hex(n).map_err(|e| Status::internal(e.to_string()));
                (random(TOKEN_ID_LEN / 2)?, random(32)?)
            }
            // A retry (perhaps at another replica) derives the same token from the cluster key;
            // the secret covers what the token grants, so the same request id with another
            // user, role, lifetime or description derives another secret under the same id, and
            // apply refuses it instead of answering with the first token.
            r if r.len() <= REQUEST_ID_LEN_MAX => {
                let key = &self.ctx.auth.key;
                let id = key.derive(&format!("token-id:{}:{r}", me.user))[..TOKEN_ID_LEN].to_string();
                let grants = sha256_hex(&format!(
                    "{}\n{}\n{}\n{}",
                    req.user,
                    role.as_str(),
                    req.ttl_s,
                    req.description
                ));
                (id, key.derive(&format!("token-secret:{}:{r}:{grants}", me.user)))
            }
            _ => {
                return Err(Status::invalid_argument(format!(
                    "request_id: at most {REQUEST_ID_LEN_MAX} bytes"
                )))
            }
        };
        let now = self.ctx.cluster_now();
        let record = TokenRecord {
            user: req.user,
            role,
            secret_sha256: sha256_hex(&secret),
            created_ms: now,
            created_by: me.user,
            expires_ms: (req.ttl_s > 0).then(|| now + req.ttl_s as i64 * 1000),
            description: req.description,
        };
        tracing::info!(token_id = %id, user = %record.user, role = record.role.as_str(), "token created");
        match self.ctx.write(Op::CreateToken { id: id.clone(), record }).await? {
            Outcome::TokensChanged => Ok(Response::new(pb::CreateTokenResponse {
                token: format!("{TOKEN_PREFIX}{id}_{secret}"),
                id,
            })),
            Outcome::Rejected(r) => Err(rejection_status(r)),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    async fn list_tokens(
        &self,
        request: Request<pb::ListTokensRequest>,
    ) -> Result<Response<pb::ListTokensResponse>, Status> {
        self.ctx.principal(&request)?.require(Role::Admin, "listing tokens")?;
        self.ctx.readable()?;
        let tokens = self.ctx.replica.read(|a| {
            a.state
                .tokens
                .iter()
                .map(|(id, t)| pb::TokenInfo {
                    id: id.clone(),
                    user: t.user.clone(),
                    role: t.role.as_str().to_string(),
                    created_ms: t.created_ms,
                    created_by: t.created_by.clone(),
                    expires_ms: t.expires_ms.unwrap_or(0),
                    description: t.description.clone(),
                })
                .collect()
        });
        Ok(Response::new(pb::ListTokensResponse { tokens }))
    }

    async fn revoke_token(
        &self,
        request: Request<pb::RevokeTokenRequest>,
    ) -> Result<Response<pb::RevokeTokenResponse>, Status> {
        self.ctx.principal(&request)?.require(Role::Admin, "revoking tokens")?;
        let id = request.into_inner().id;
        // A whole token pasted by mistake is reduced to its id; the secret is never echoed.
        let id = split_token(&id).map(|(i, _)| i.to_string()).unwrap_or(id);
        if id.len() > 64 {
            return Err(Status::invalid_argument("id: at most 64 characters"));
        }
        match self.ctx.write(Op::RevokeToken { id: id.clone() }).await? {
            Outcome::TokensChanged => {
                tracing::info!(token_id = %id, "token revoked");
                Ok(Response::new(pb::RevokeTokenResponse {}))
            }
            Outcome::Rejected(r) => Err(rejection_status(r)),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    async fn drain_node(
        &self,
        request: Request<pb::DrainNodeRequest>,
    ) -> Result<Response<pb::DrainNodeResponse>, Status> {
        let me = self.ctx.principal(&request)?;
        me.require(Role::Operator, "draining nodes")?;
        let r = request.into_inner();
        self.ctx.drain_node(r.node, &format!("drained by \"{}\": {}", me.user, r.reason), false).await?;
        Ok(Response::new(pb::DrainNodeResponse {}))
    }

    async fn remove_node(
        &self,
        request: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::RemoveNodeResponse>, Status> {
        let me = self.ctx.principal(&request)?;
        me.require(Role::Operator, "removing nodes")?;
        let node = request.into_inner().node;
        self.ctx.check_node(&node)?;
        match self.ctx.write(Op::RemoveNode { node: node.clone() }).await? {
            Outcome::NodeRemoved { .. } => {
                tracing::warn!(%node, by = %me.user, "node removed");
                Ok(Response::new(pb::RemoveNodeResponse {}))
            }
            Outcome::Rejected(r) => Err(rejection_status(r)),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }

    async fn resume_node(
        &self,
        request: Request<pb::ResumeNodeRequest>,
    ) -> Result<Response<pb::ResumeNodeResponse>, Status> {
        let me = self.ctx.principal(&request)?;
        me.require(Role::Operator, "resuming nodes")?;
        let node = request.into_inner().node;
        self.ctx.check_node(&node)?;
        tracing::warn!(%node, by = %me.user, "node resumes");
        self.ctx.node_write(Op::ResumeNode { node, only_reason: None }).await?;
        Ok(Response::new(pb::ResumeNodeResponse {}))
    }

    async fn reset_gpu(
        &self,
        request: Request<pb::ResetGpuRequest>,
    ) -> Result<Response<pb::ResetGpuResponse>, Status> {
        let me = self.ctx.principal(&request)?;
        me.require(Role::Operator, "resetting GPUs")?;
        let r = request.into_inner();
        self.ctx.check_node(&r.node)?;
        tracing::warn!(node = %r.node, gpu = r.gpu, by = %me.user, "GPU reset");
        self.ctx.node_write(Op::GpuReset { node: r.node, gpu: r.gpu }).await?;
        Ok(Response::new(pb::ResetGpuResponse {}))
    }
}

/// Longest lifetime a token may be created with (ten years).
const TOKEN_TTL_S_MAX: u64 = 10 * 365 * 24 * 3600;

impl AdminApi {
    /// Before an enabling configuration is committed: its instance types exist in the cloud
    /// with the configured GPU count and model (`DescribeInstanceTypes`). A configuration that
    /// is invalid on its own is left to apply's check (one message for both); a cloud that
    /// cannot be asked leaves the types unchecked.
    async fn check_instance_types(
        &self,
        config: &kairos_scheduler::burst::BurstConfig,
    ) -> Result<(), Status> {
        if !config.enabled || config.instance_types.is_empty() || config.validate().is_err() {
            return Ok(());
        }
        let cloud = kairos_burst::Ec2Cloud::new(&config.region, self.burst_endpoint.as_deref()).await;
        let names: Vec<String> = config.instance_types.iter().map(|t| t.name.clone()).collect();
        let found = match kairos_burst::Cloud::instance_types(&cloud, &names).await {
            Ok(found) => found,
            Err(kairos_burst::CloudError::Invalid(why)) => {
                return Err(Status::invalid_argument(format!("burst config: instance_types: {why}")))
            }
            Err(e) => {
                // An outage must not block configuring: what the cloud says is wrong is refused,
                // a cloud that does not answer leaves the types unchecked (launches then fail
                // visibly in `burst status`).
                tracing::warn!(error = %e, "burst config: the instance types could not be checked with the cloud");
                return Ok(());
            }
        };
        kairos_burst::check_instance_types(&config.instance_types, &found)
            .map_err(|e| Status::invalid_argument(format!("burst config: {e}")))
    }
    /// Pending jobs' priorities; a user sees only their own jobs.
    fn priorities(&self, me: &Principal, job_id: u64) -> Result<pb::GetPrioritiesResponse, Status> {
        use kairos_scheduler::priority::{Prioritizer, ONE};
        let f = |x: u64| x as f64 / ONE as f64;
        self.ctx.replica.read(|a| {
            let p = Prioritizer::new(&a.state);
            let pending = a.state.jobs.values().filter(|j| j.state == kairos_scheduler::JobState::Pending);
            let jobs: Vec<pb::JobPriority> = pending
                .filter(|j| job_id == 0 || j.id == job_id)
                .filter(|j| me.owns_or_operates(&j.spec.user))
                .map(|j| {
                    let x = p.factors(j);
                    pb::JobPriority {
                        job_id: j.id,
                        user: j.spec.user.clone(),
                        account: j.spec.account.clone(),
                        qos: j.spec.qos.clone(),
                        priority: x.priority,
                        qos_factor: f(x.qos),
                        age_factor: f(x.age),
                        fairshare_factor: f(x.fairshare),
                        job_size_factor: f(x.job_size),
                    }
                })
                .collect();
            if job_id != 0 && jobs.is_empty() {
                return Err(match a.state.jobs.get(&job_id) {
                    Some(j) if !me.owns_or_operates(&j.spec.user) => {
                        Status::permission_denied(format!("job {job_id} belongs to another user"))
                    }
                    Some(j) => Status::failed_precondition(format!(
                        "job {job_id} is {}, not pending",
                        j.state.as_str()
                    )),
                    None => Status::not_found(format!("job {job_id} not found")),
                });
            }
            Ok(pb::GetPrioritiesResponse { jobs, weights: Some(weights_to_pb(&a.state.policy.weights)) })
        })
    }

    /// Puts one account or partition (`mode`: a `PutMode`) and answers what the state now holds.
    async fn put_item<T>(
        &self,
        item: PolicyItem,
        mode: i32,
        stored: impl FnOnce(&kairos_scheduler::policy::Policy) -> Option<T>,
    ) -> Result<Response<T>, Status> {
        let (kind, name) = (item.kind(), item.name().to_string());
        self.policy_write(Op::PutPolicyItem { item, must_exist: must_exist(mode)? }).await?;
        let stored = self.ctx.replica.read(|a| stored(&a.state.policy));
        stored
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("{} \"{name}\" not found", kind.as_str())))
    }

    async fn policy_write(&self, op: Op) -> Result<(), Status> {
        match self.ctx.write(op).await? {
            Outcome::PolicyChanged => {
                self.ctx.kick.notify_one();
                Ok(())
            }
            Outcome::Rejected(r) => Err(rejection_status(r)),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }
}

/// What a `PutMode` asks of a put: create only (Some(false)), update only (Some(true)), or either.
pub(crate) fn must_exist(mode: i32) -> Result<Option<bool>, Status> {
    match pb::PutMode::try_from(mode) {
        Ok(pb::PutMode::Upsert) => Ok(None),
        Ok(pb::PutMode::Create) => Ok(Some(false)),
        Ok(pb::PutMode::Update) => Ok(Some(true)),
        Err(_) => Err(Status::invalid_argument(format!("mode: unknown value {mode}"))),
    }
}

fn membership_status(e: MembershipError) -> Status {
    match e {
        MembershipError::NotLeader { leader_addr } => {
            write_status(WriteError::NotLeader { leader: None, leader_addr })
        }
        MembershipError::BadAddr(_) | MembershipError::ZeroId => Status::invalid_argument(e.to_string()),
        MembershipError::NotMember(_) => Status::not_found(e.to_string()),
        MembershipError::IdTaken { .. }
        | MembershipError::AddrTaken { .. }
        | MembershipError::LastVoter(_) => Status::failed_precondition(e.to_string()),
        MembershipError::CatchUpTimeout(_) => Status::deadline_exceeded(e.to_string()),
        MembershipError::Raft(_) => Status::unavailable(e.to_string()),
    }
}

impl AdminApi {
    async fn status(&self) -> pb::ClusterStatusResponse {
        let s = self.ctx.replica.status();
        // Whether each member answers a connection now (all probed at once, briefly).
        let probes = s.replicas.iter().map(|(id, addr, _)| {
            let (me, addr) = (*id == s.id, addr.clone());
            async move {
                me || tokio::time::timeout(REACH_TIMEOUT, tokio::net::TcpStream::connect(addr))
                    .await
                    .is_ok_and(|c| c.is_ok())
            }
        });
        let reachable = futures::future::join_all(probes).await;
        pb::ClusterStatusResponse {
            id: s.id,
            leader: s.leader,
            leader_addr: s.leader_addr.unwrap_or_default(),
            term: s.term,
            last_log_index: s.last_log_index,
            applied_index: s.applied_index,
            commit_index: s.commit_index,
            state_digest: s.state_digest,
            snapshot_index: s.snapshot_index,
            replicas: s
                .replicas
                .into_iter()
                .zip(reachable)
                .map(|((id, addr, role), reachable)| pb::Replica { id, addr, role, reachable })
                .collect(),
        }
    }
}
