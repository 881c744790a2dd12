//! Layotto's `spec.proto.runtime.v1.Runtime` service: a third thin adapter
//! over the shared operations. State, locks and secrets are Dapr's messages
//! under another package and go through the Dapr handlers
//! (`layotto_convert`; a lease's checks in Layotto's order and words:
//! `dapr_lock::layotto_try_lock`); configuration has Layotto's own shape
//! (group, label, app id, writes, a bidirectional subscription:
//! `layotto_config`); pub/sub goes through the Dapr handlers and the
//! shared delivery engine (`layotto_pubsub`), the sequencer and files
//! through the shared operations (`layotto_file`). What rewire does not
//! offer answers `UNIMPLEMENTED` saying so.

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::dapr_pubsub_stream::TopicStreams;
use super::layotto_config::{self, ConfigurationStream, SubscriptionCount};
use super::layotto_convert as convert;
use super::layotto_file::{self, FileStream};
use super::layotto_pubsub::{self, LayottoTopicEventStream};
use super::observe::{caller, observed, unary};
use super::proto::spec::proto::runtime::v1 as pb;
use super::proto::spec::proto::runtime::v1::lock_keep_alive_response::Status as KeepAliveCode;
use super::proto::spec::proto::runtime::v1::runtime_server::Runtime;
use super::subscription_queue::QueuedBytes;
use super::{dapr_lock, dapr_secrets, dapr_state, dapr_state_transaction};
use crate::dapr::ResponseBudget;
use crate::ApiState;
use rewire_runtime::UnlockStatus;

/// The `spec.proto.runtime.v1.Runtime` service.
pub(super) struct LayottoApi {
    state: ApiState,
    shutdown: CancellationToken,
    /// The bytes queued for configuration subscribers, Dapr's included.
    queued: QueuedBytes,
    /// The configuration subscriptions of all Layotto streams.
    subscriptions: SubscriptionCount,
    /// The bound on topic streams, Dapr's included.
    topic_streams: TopicStreams,
}

impl LayottoApi {
    /// Serves `state`; subscription streams end when `shutdown` is
    /// cancelled; configuration answers count into `queued` and topic
    /// streams into `topic_streams` (both shared with Dapr's).
    pub(super) fn new(
        state: ApiState,
        shutdown: CancellationToken,
        queued: QueuedBytes,
        topic_streams: TopicStreams,
    ) -> Self {
        Self {
            state,
            shutdown,
            queued,
            subscriptions: SubscriptionCount::default(),
            topic_streams,
        }
    }

    fn budget(&self) -> ResponseBudget {
        ResponseBudget::new(self.state.options.max_response_bytes)
    }
}

type Answer<T> = Result<Response<T>, Status>;

/// `UNIMPLEMENTED`, naming what rewire does not offer.
fn not_offered(what: &str) -> Status {
    Status::unimplemented(format!("{what} is not offered by rewire"))
}

#[tonic::async_trait]
impl Runtime for LayottoApi {
    type SubscribeConfigurationStream = ConfigurationStream;
    type SubscribeTopicEventsStream = LayottoTopicEventStream;
    type GetFileStream = FileStream;

    async fn say_hello(&self, _: Request<pb::SayHelloRequest>) -> Answer<pb::SayHelloResponse> {
        Err(not_offered("SayHello (Layotto's test method)"))
    }

    async fn invoke_service(
        &self,
        _: Request<pb::InvokeServiceRequest>,
    ) -> Answer<pb::InvokeResponse> {
        Err(not_offered("service invocation (InvokeService)"))
    }

    async fn invoke_binding(
        &self,
        _: Request<pb::InvokeBindingRequest>,
    ) -> Answer<pb::InvokeBindingResponse> {
        Err(not_offered("output bindings (InvokeBinding)"))
    }

    async fn get_configuration(
        &self,
        request: Request<pb::GetConfigurationRequest>,
    ) -> Answer<pb::GetConfigurationResponse> {
        let budget = self.budget();
        unary(
            &self.state,
            "layotto.GetConfiguration",
            request,
            |call, req| layotto_config::get(call, req, budget),
        )
        .await
    }

    async fn save_configuration(
        &self,
        request: Request<pb::SaveConfigurationRequest>,
    ) -> Answer<()> {
        unary(
            &self.state,
            "layotto.SaveConfiguration",
            request,
            layotto_config::save,
        )
        .await
    }

    async fn delete_configuration(
        &self,
        request: Request<pb::DeleteConfigurationRequest>,
    ) -> Answer<()> {
        unary(
            &self.state,
            "layotto.DeleteConfiguration",
            request,
            layotto_config::delete,
        )
        .await
    }

    async fn subscribe_configuration(
        &self,
        request: Request<Streaming<pb::SubscribeConfigurationRequest>>,
    ) -> Answer<ConfigurationStream> {
        // Each request on the stream is observed as a call of its own
        // (`layotto_config::subscribe`), in the caller's trace.
        let caller = caller(&request);
        let stream = layotto_config::subscribe(
            self.state.clone(),
            request.into_inner(),
            self.queued.clone(),
            self.subscriptions.clone(),
            self.shutdown.clone(),
            caller,
        );
        Ok(Response::new(stream))
    }

    async fn try_lock(&self, request: Request<pb::TryLockRequest>) -> Answer<pb::TryLockResponse> {
        unary(
            &self.state,
            "layotto.TryLock",
            request,
            |call, req| async move {
                let answer = dapr_lock::layotto_try_lock(call, convert::try_lock(req)).await?;
                Ok(pb::TryLockResponse {
                    success: answer.success,
                })
            },
        )
        .await
    }

    async fn unlock(&self, request: Request<pb::UnlockRequest>) -> Answer<pb::UnlockResponse> {
        unary(
            &self.state,
            "layotto.Unlock",
            request,
            |call, req| async move {
                let answer = dapr_lock::unlock(call, convert::unlock(req)).await?;
                Ok(convert::unlock_response(answer))
            },
        )
        .await
    }

    async fn lock_keep_alive(
        &self,
        request: Request<pb::LockKeepAliveRequest>,
    ) -> Answer<pb::LockKeepAliveResponse> {
        unary(
            &self.state,
            "layotto.LockKeepAlive",
            request,
            |call, req| async move {
                // Checked as Layotto's `TryLock` (its own `LockKeepAlive`
                // answers nothing).
                let store = call.lock_store(&req.store_name).in_layotto_order();
                let status = store
                    .keep_alive(req.resource_id, req.lock_owner, i64::from(req.expire))
                    .await
                    .map_err(dapr_lock::layotto_status)?;
                let status = match status {
                    UnlockStatus::Success => KeepAliveCode::Success,
                    UnlockStatus::LockDoesNotExist => KeepAliveCode::LockUnexist,
                    UnlockStatus::LockBelongsToOthers => KeepAliveCode::LockBelongToOthers,
                };
                Ok(pb::LockKeepAliveResponse {
                    status: status as i32,
                })
            },
        )
        .await
    }

    async fn get_next_id(
        &self,
        request: Request<pb::GetNextIdRequest>,
    ) -> Answer<pb::GetNextIdResponse> {
        unary(
            &self.state,
            "layotto.GetNextId",
            request,
            layotto_file::next_id,
        )
        .await
    }

    async fn get_state(
        &self,
        request: Request<pb::GetStateRequest>,
    ) -> Answer<pb::GetStateResponse> {
        unary(
            &self.state,
            "layotto.GetState",
            request,
            |call, req| async move {
                let answer = dapr_state::get(call, convert::get_state(req)).await?;
                Ok(convert::get_state_response(answer))
            },
        )
        .await
    }

    async fn get_bulk_state(
        &self,
        request: Request<pb::GetBulkStateRequest>,
    ) -> Answer<pb::GetBulkStateResponse> {
        let budget = self.budget();
        unary(
            &self.state,
            "layotto.GetBulkState",
            request,
            |call, req| async move {
                let answer =
                    dapr_state::get_bulk(call, convert::get_bulk_state(req), budget).await?;
                Ok(convert::get_bulk_state_response(answer))
            },
        )
        .await
    }

    async fn save_state(&self, request: Request<pb::SaveStateRequest>) -> Answer<()> {
        unary(&self.state, "layotto.SaveState", request, |call, req| {
            dapr_state::save(call, convert::save_state(req))
        })
        .await
    }

    async fn delete_state(&self, request: Request<pb::DeleteStateRequest>) -> Answer<()> {
        unary(&self.state, "layotto.DeleteState", request, |call, req| {
            dapr_state::delete(call, convert::delete_state(req))
        })
        .await
    }

    async fn delete_bulk_state(&self, request: Request<pb::DeleteBulkStateRequest>) -> Answer<()> {
        unary(
            &self.state,
            "layotto.DeleteBulkState",
            request,
            |call, req| dapr_state::delete_bulk(call, convert::delete_bulk_state(req)),
        )
        .await
    }

    async fn execute_state_transaction(
        &self,
        request: Request<pb::ExecuteStateTransactionRequest>,
    ) -> Answer<()> {
        unary(
            &self.state,
            "layotto.ExecuteStateTransaction",
            request,
            |call, req| dapr_state_transaction::execute(call, convert::transaction(req)),
        )
        .await
    }

    async fn publish_event(&self, request: Request<pb::PublishEventRequest>) -> Answer<()> {
        unary(
            &self.state,
            "layotto.PublishEvent",
            request,
            layotto_pubsub::publish,
        )
        .await
    }

    async fn subscribe_topic_events(
        &self,
        request: Request<Streaming<pb::SubscribeTopicEventsRequest>>,
    ) -> Answer<Self::SubscribeTopicEventsStream> {
        let (state, shutdown) = (&self.state, self.shutdown.clone());
        let caller = caller(&request);
        observed(state, "layotto.SubscribeTopicEvents", caller, |_| {
            layotto_pubsub::subscribe(state, request.into_inner(), shutdown, &self.topic_streams)
        })
        .await
        .map(Response::new)
    }

    async fn get_file(&self, request: Request<pb::GetFileRequest>) -> Answer<FileStream> {
        let caller = caller(&request);
        let message = request.into_inner();
        observed(&self.state, "layotto.GetFile", caller, |call| {
            layotto_file::get(call, message, &self.state)
        })
        .await
        .map(Response::new)
    }

    async fn put_file(&self, request: Request<Streaming<pb::PutFileRequest>>) -> Answer<()> {
        // Not cut at `request_timeout` as a whole, nor by the server's
        // backstop (`call_bound`): an upload that keeps sending may take
        // as long as it needs (the store bounds the file's size), and is
        // cut when no chunk arrives for `request_timeout`.
        let caller = caller(&request);
        let incoming = request.into_inner();
        let state = &self.state;
        observed(state, "layotto.PutFile", caller, |call| {
            layotto_file::put(call, incoming, state)
        })
        .await
        .map(Response::new)
    }

    async fn list_file(&self, request: Request<pb::ListFileRequest>) -> Answer<pb::ListFileResp> {
        unary(&self.state, "layotto.ListFile", request, layotto_file::list).await
    }

    async fn del_file(&self, request: Request<pb::DelFileRequest>) -> Answer<()> {
        unary(
            &self.state,
            "layotto.DelFile",
            request,
            layotto_file::delete,
        )
        .await
    }

    async fn get_file_meta(
        &self,
        request: Request<pb::GetFileMetaRequest>,
    ) -> Answer<pb::GetFileMetaResponse> {
        unary(
            &self.state,
            "layotto.GetFileMeta",
            request,
            layotto_file::meta,
        )
        .await
    }

    async fn get_secret(
        &self,
        request: Request<pb::GetSecretRequest>,
    ) -> Answer<pb::GetSecretResponse> {
        unary(
            &self.state,
            "layotto.GetSecret",
            request,
            |call, req| async move {
                let answer = dapr_secrets::get(call, convert::get_secret(req)).await?;
                Ok(pb::GetSecretResponse { data: answer.data })
            },
        )
        .await
    }

    async fn get_bulk_secret(
        &self,
        request: Request<pb::GetBulkSecretRequest>,
    ) -> Answer<pb::GetBulkSecretResponse> {
        unary(
            &self.state,
            "layotto.GetBulkSecret",
            request,
            |call, req| async move {
                let answer = dapr_secrets::get_bulk(call, convert::get_bulk_secret(req)).await?;
                Ok(convert::get_bulk_secret_response(answer))
            },
        )
        .await
    }
}
