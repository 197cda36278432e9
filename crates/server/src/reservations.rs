//! Reservations over the API (`AdminService.PutReservation`, `DeleteReservation`,
//! `ListReservations`): operators write them through the log, everyone may read them.

use kairos_proto::v1 as pb;
use tonic::{Request, Response, Status};

use kairos_convert::reservation::{reservation_from_pb, reservation_to_pb};
use kairos_scheduler::tokens::Role;
use kairos_scheduler::{Op, Outcome};

use crate::admin::{must_exist, AdminApi};
use crate::context::rejection_status;

impl AdminApi {
    pub(crate) async fn reservation_put(
        &self,
        request: Request<pb::PutReservationRequest>,
    ) -> Result<Response<pb::Reservation>, Status> {
        let me = self.ctx.principal(&request)?;
        me.require(Role::Operator, "changing reservations")?;
        let req = request.into_inner();
        let r = req.reservation.ok_or_else(|| Status::invalid_argument("reservation: required"))?;
        let reservation = reservation_from_pb(r, &me.user)?;
        let name = reservation.name.clone();
        let op = Op::PutReservation { reservation, must_exist: must_exist(req.mode)? };
        self.reservation_write(op).await?;
        let now = self.ctx.cluster_now();
        let stored =
            self.ctx.replica.read(|a| a.state.reservations.get(&name).map(|r| reservation_to_pb(r, now)));
        stored
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("reservation \"{name}\" not found")))
    }

    pub(crate) async fn reservation_delete(
        &self,
        request: Request<pb::DeleteReservationRequest>,
    ) -> Result<Response<pb::DeleteReservationResponse>, Status> {
        self.ctx.principal(&request)?.require(Role::Operator, "changing reservations")?;
        let name = request.into_inner().name;
        self.reservation_write(Op::DeleteReservation { name }).await?;
        Ok(Response::new(pb::DeleteReservationResponse {}))
    }

    pub(crate) async fn reservation_list(
        &self,
        request: Request<pb::ListReservationsRequest>,
    ) -> Result<Response<pb::ListReservationsResponse>, Status> {
        self.ctx.principal(&request)?;
        self.ctx.readable()?;
        let now = self.ctx.cluster_now();
        let reservations = self
            .ctx
            .replica
            .read(|a| a.state.reservations.values().map(|r| reservation_to_pb(r, now)).collect());
        Ok(Response::new(pb::ListReservationsResponse { reservations }))
    }

    async fn reservation_write(&self, op: Op) -> Result<(), Status> {
        match self.ctx.write(op).await? {
            Outcome::ReservationChanged { .. } => {
                self.ctx.kick.notify_one();
                Ok(())
            }
            Outcome::Rejected(r) => Err(rejection_status(r)),
            other => Err(Status::internal(format!("unexpected outcome {other:?}"))),
        }
    }
}
