//! Secrets: `GetSecret` and `GetBulkSecret` on the shared
//! [`SecretOps`](crate::dapr::SecretOps). Values go to the caller and
//! nowhere else: never logged, never in an error. A secret the `secrets`
//! section's scopes refuse is `PERMISSION_DENIED` (the bulk answer leaves
//! it out); Layotto's secret RPCs come through here too.

use tonic::Status;

use super::proto::dapr::proto::runtime::v1 as pb;
use crate::dapr::{check_request_metadata, exposed, Call};

/// `GetSecret`: every key of one secret.
pub(super) async fn get(
    call: Call,
    req: pb::GetSecretRequest,
) -> Result<pb::GetSecretResponse, Status> {
    let store = call.secret_store(&req.store_name)?;
    check_request_metadata(("secret store", &req.store_name), &req.metadata)?;
    let secret = store.get(&req.key, &req.metadata).await?;
    Ok(pb::GetSecretResponse {
        data: exposed(secret),
    })
}

/// `GetBulkSecret`: every secret of the store, by name.
pub(super) async fn get_bulk(
    call: Call,
    req: pb::GetBulkSecretRequest,
) -> Result<pb::GetBulkSecretResponse, Status> {
    let store = call.secret_store(&req.store_name)?;
    check_request_metadata(("secret store", &req.store_name), &req.metadata)?;
    let secrets = store.bulk_get(&req.metadata).await?;
    let data = secrets
        .into_iter()
        .map(|(name, secret)| {
            let secrets = exposed(secret);
            (name, pb::SecretResponse { secrets })
        })
        .collect();
    Ok(pb::GetBulkSecretResponse { data })
}
