//! [`AppCalls`]: the app's gRPC channel, every call through it carrying
//! the app token ([`SendsAppToken`]) and a call that could not connect to
//! the app noticed ([`ConnectNoticed`]); shared by [`GrpcApp`](super::grpc_app::GrpcApp)
//! and the Dapr and Layotto `AppCallback` routes that call through it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The app's channel, each call through it carrying the app token when
/// one is set ([`SendsAppToken`]), one that could not connect noticed
/// ([`ConnectNoticed`]).
pub(super) type AppCalls = InterceptedService<ConnectNoticed, SendsAppToken>;

tokio::task_local! {
    /// Set when a call through [`ConnectNoticed`] made by the future
    /// [`noticing_unconnected`] runs could not connect to the app.
    static NOT_CONNECTED: Arc<AtomicBool>;
}

/// Runs `calls` (calls to the app through [`AppCalls`]); its output, and
/// whether one of its calls could not connect to the app at all (so that
/// call sent nothing: the app cannot have seen it).
pub(super) async fn noticing_unconnected<T>(
    calls: impl std::future::Future<Output = T>,
) -> (T, bool) {
    let not_connected = Arc::new(AtomicBool::new(false));
    let output = NOT_CONNECTED.scope(not_connected.clone(), calls).await;
    (output, not_connected.load(Ordering::Relaxed))
}

/// The app's channel, noticing a call that could not connect (refused,
/// nothing listening, the endpoint's connect timeout): tonic's
/// [`ConnectError`](tonic::ConnectError) in its error's chain, which only
/// the making of a connection gives (never a call already sent on one).
#[derive(Clone)]
pub(super) struct ConnectNoticed(pub(super) Channel);

impl tower_service::Service<http::Request<Body>> for ConnectNoticed {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let call = self.0.call(request);
        Box::pin(async move {
            let answered = call.await;
            if answered.as_ref().is_err_and(could_not_connect) {
                // Outside a delivery (a listing) nobody asks.
                let _ = NOT_CONNECTED.try_with(|flag| flag.store(true, Ordering::Relaxed));
            }
            answered
        })
    }
}

/// Whether `err` is a failure to connect to the app because nothing
/// listened there (refused, no route: see
/// [`nothing_listens`](super::http_route::nothing_listens)); a connector
/// failing otherwise (a TLS handshake, a name, a timeout) is not one.
fn could_not_connect(err: &tonic::transport::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(err) = cause {
        if err.is::<tonic::ConnectError>() {
            return super::http_route::nothing_listens(err);
        }
        cause = err.source();
    }
    false
}

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
