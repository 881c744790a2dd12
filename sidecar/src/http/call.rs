//! What every handler starts from: a [`Call`] on one snapshot of the
//! generation serving, loaded once per call, its store recorded in the
//! call's [`StoreLabel`] (set by `observe`).

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::dapr::{Call, StoreLabel};
use crate::ApiState;

impl FromRequestParts<ApiState> for Call {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &ApiState,
    ) -> Result<Self, Self::Rejection> {
        let label = parts
            .extensions
            .get::<StoreLabel>()
            .cloned()
            .unwrap_or_default();
        Ok(Call::new(&state.runtime, label))
    }
}
