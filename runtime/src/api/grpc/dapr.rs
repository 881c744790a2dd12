//! The `Dapr` service: each method runs its area's handler
//! (`dapr_state`, `dapr_secrets`, `dapr_config`, `dapr_lock`,
//! `dapr_metadata`) through [`observed`].

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::call::observed;
use super::proto::dapr::proto::runtime::v1 as pb;
use super::proto::dapr::proto::runtime::v1::dapr_server::Dapr;
use super::subscriptions::{SubscriptionStream, Subscriptions};
use super::{dapr_config, dapr_lock, dapr_metadata, dapr_secrets, dapr_state};
use crate::api::ApiState;

/// The `dapr.proto.runtime.v1.Dapr` service.
pub(super) struct DaprApi {
    state: ApiState,
    subscriptions: Subscriptions,
}

impl DaprApi {
    /// Serves `state`; configuration subscriptions end when `shutdown` is
    /// cancelled.
    pub(super) fn new(state: ApiState, shutdown: CancellationToken) -> Self {
        Self {
            state,
            subscriptions: Subscriptions::new(shutdown),
        }
    }
}

type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Dapr for DaprApi {
    async fn get_state(
        &self,
        request: Request<pb::GetStateRequest>,
    ) -> Answer<pb::GetStateResponse> {
        observed(&self.state, "GetState", |call| {
            dapr_state::get(call, request.into_inner())
        })
        .await
        .map(Response::new)
    }

    async fn get_bulk_state(
        &self,
        request: Request<pb::GetBulkStateRequest>,
    ) -> Answer<pb::GetBulkStateResponse> {
        observed(&self.state, "GetBulkState", |call| {
            dapr_state::get_bulk(call, request.into_inner())
        })
        .await
        .map(Response::new)
    }

    async fn save_state(&self, request: Request<pb::SaveStateRequest>) -> Answer<()> {
        observed(&self.state, "SaveState", |call| {
            dapr_state::save(call, request.into_inner())
        })
        .await
        .map(Response::new)
    }

    async fn delete_state(&self, request: Request<pb::DeleteStateRequest>) -> Answer<()> {
        observed(&self.state, "DeleteState", |call| {
            dapr_state::delete(call, request.into_inner())
        })
        .await
        .map(Response::new)
    }

    async fn get_secret(
        &self,
        request: Request<pb::GetSecretRequest>,
    ) -> Answer<pb::GetSecretResponse> {
        observed(&self.state, "GetSecret", |call| {
            dapr_secrets::get(call, request.into_inner())
        })
        .await
        .map(Response::new)
    }

    async fn get_bulk_secret(
        &self,
        request: Request<pb::GetBulkSecretRequest>,
    ) -> Answer<pb::GetBulkSecretResponse> {
        observed(&self.state, "GetBulkSecret", |call| {
            dapr_secrets::get_bulk(call, request.into_inner())
        })
        .await
        .map(Response::new)
    }

    async fn get_configuration_alpha1(
        &self,
        request: Request<pb::GetConfigurationRequest>,
    ) -> Answer<pb::GetConfigurationResponse> {
        observed(&self.state, "GetConfigurationAlpha1", |call| {
            dapr_config::get(call, request.into_inner())
        })
        .await
        .map(Response::new)
    }

    async fn get_configuration(
        &self,
        request: Request<pb::GetConfigurationRequest>,
    ) -> Answer<pb::GetConfigurationResponse> {
        observed(&self.state, "GetConfiguration", |call| {
            dapr_config::get(call, request.into_inner())
        })
        .await
        .map(Response::new)
    }

    type SubscribeConfigurationAlpha1Stream = SubscriptionStream;

    async fn subscribe_configuration_alpha1(
        &self,
        request: Request<pb::SubscribeConfigurationRequest>,
    ) -> Answer<SubscriptionStream> {
        let subscriptions = &self.subscriptions;
        observed(&self.state, "SubscribeConfigurationAlpha1", |call| {
            dapr_config::subscribe(call, subscriptions, request.into_inner())
        })
        .await
        .map(Response::new)
    }

    type SubscribeConfigurationStream = SubscriptionStream;

    async fn subscribe_configuration(
        &self,
        request: Request<pb::SubscribeConfigurationRequest>,
    ) -> Answer<SubscriptionStream> {
        let subscriptions = &self.subscriptions;
        observed(&self.state, "SubscribeConfiguration", |call| {
            dapr_config::subscribe(call, subscriptions, request.into_inner())
        })
        .await
        .map(Response::new)
    }

    async fn unsubscribe_configuration_alpha1(
        &self,
        request: Request<pb::UnsubscribeConfigurationRequest>,
    ) -> Answer<pb::UnsubscribeConfigurationResponse> {
        let subscriptions = &self.subscriptions;
        observed(
            &self.state,
            "UnsubscribeConfigurationAlpha1",
            |call| async move {
                Ok(dapr_config::unsubscribe(
                    &call,
                    subscriptions,
                    request.into_inner(),
                ))
            },
        )
        .await
        .map(Response::new)
    }

    async fn unsubscribe_configuration(
        &self,
        request: Request<pb::UnsubscribeConfigurationRequest>,
    ) -> Answer<pb::UnsubscribeConfigurationResponse> {
        let subscriptions = &self.subscriptions;
        observed(&self.state, "UnsubscribeConfiguration", |call| async move {
            Ok(dapr_config::unsubscribe(
                &call,
                subscriptions,
                request.into_inner(),
            ))
        })
        .await
        .map(Response::new)
    }

    async fn try_lock_alpha1(
        &self,
        request: Request<pb::TryLockRequest>,
    ) -> Answer<pb::TryLockResponse> {
        observed(&self.state, "TryLockAlpha1", |call| {
            dapr_lock::try_lock(call, request.into_inner())
        })
        .await
        .map(Response::new)
    }

    async fn unlock_alpha1(
        &self,
        request: Request<pb::UnlockRequest>,
    ) -> Answer<pb::UnlockResponse> {
        observed(&self.state, "UnlockAlpha1", |call| {
            dapr_lock::unlock(call, request.into_inner())
        })
        .await
        .map(Response::new)
    }

    async fn get_metadata(
        &self,
        _request: Request<pb::GetMetadataRequest>,
    ) -> Answer<pb::GetMetadataResponse> {
        observed(&self.state, "GetMetadata", |call| async move {
            Ok(dapr_metadata::get(&call))
        })
        .await
        .map(Response::new)
    }
}
