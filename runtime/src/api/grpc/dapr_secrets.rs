//! Secrets: `GetSecret` and `GetBulkSecret`. Values go to the caller and
//! nowhere else: never logged, never in an error.

use std::collections::HashMap;

use tonic::Status;

use super::call::Call;
use super::proto::dapr::proto::runtime::v1 as pb;
use super::status::secret_error;
use crate::kinds::SecretMap;

/// `GetSecret`: every key of one secret.
pub(super) async fn get(
    call: Call,
    req: pb::GetSecretRequest,
) -> Result<pb::GetSecretResponse, Status> {
    let store = call.secret_store(&req.store_name)?;
    let secret = store
        .get_secret(&req.key, &req.metadata)
        .await
        .map_err(|e| {
            let doing = format!(
                "failed getting secret with key `{}` from secret store `{}`",
                req.key, req.store_name
            );
            secret_error(&doing, &e)
        })?;
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
    let secrets = store.bulk_get_secret(&req.metadata).await.map_err(|e| {
        let doing = format!(
            "failed getting secrets from secret store `{}`",
            req.store_name
        );
        secret_error(&doing, &e)
    })?;
    let data = secrets
        .into_iter()
        .map(|(name, secret)| {
            (
                name,
                pb::SecretResponse {
                    secrets: exposed(secret),
                },
            )
        })
        .collect();
    Ok(pb::GetBulkSecretResponse { data })
}

/// The values themselves, for the caller who asked.
fn exposed(secret: SecretMap) -> HashMap<String, String> {
    secret
        .into_iter()
        .map(|(key, value)| (key, value.expose().to_string()))
        .collect()
}
