//! `RuntimeGatewayService`: remote runtimes dialling in. Part of the contract; not built yet.

use std::pin::Pin;

use futures::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::auth;
use crate::{
    domain::{Error, ErrorCode},
    pb::v1::{
        ConnectRequest, ConnectResponse, runtime_gateway_service_server::RuntimeGatewayService,
    },
};

#[derive(Debug, Default)]
pub(crate) struct GatewayService;

#[tonic::async_trait]
impl RuntimeGatewayService for GatewayService {
    type ConnectStream = Pin<Box<dyn Stream<Item = Result<ConnectResponse, Status>> + Send>>;

    async fn connect(
        &self,
        request: Request<Streaming<ConnectRequest>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        auth::principal(&request)?;
        Err(Error::new(
            ErrorCode::Unimplemented,
            "RuntimeGatewayService.Connect is not built yet: remote runtimes cannot dial in; \
             runtimes run as local processes from profiles",
        )
        .into())
    }
}
