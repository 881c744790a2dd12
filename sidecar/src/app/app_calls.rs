//! [`AppCalls`]: the app's gRPC channel, every call through it carrying
//! the app token ([`SendsAppToken`]); shared by [`GrpcApp`](super::grpc_app::GrpcApp)
//! and the Dapr and Layotto `AppCallback` routes that call through it.

use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The app's channel, each call through it carrying the app token when
/// one is set ([`SendsAppToken`]).
pub(super) type AppCalls = InterceptedService<Channel, SendsAppToken>;

/// Puts the app token (Dapr's `APP_API_TOKEN`) on every gRPC call to the
/// app as its `dapr-api-token` metadata, over whatever the call carries
/// (a message's own `dapr-…` metadata is never passed on, see
/// `passed_on`, and could not override it anyway).
#[derive(Clone, Default)]
pub(super) struct SendsAppToken(pub(super) Option<AsciiMetadataValue>);

impl tonic::service::Interceptor for SendsAppToken {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert(crate::auth::APP_TOKEN_HEADER, token.clone());
        }
        Ok(request)
    }
}
