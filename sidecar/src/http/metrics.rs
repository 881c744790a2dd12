//! `GET /metrics`: the OpenMetrics text exposition (what
//! `prometheus_client` encodes: `_total` counters, a closing `# EOF`).

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use crate::ApiState;

/// The content type of the OpenMetrics text format, which Prometheus
/// negotiates and parses as such (served as the 0.0.4 text format, the
/// `# EOF` line is not of that format).
const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `GET /metrics`.
pub async fn get(State(state): State<ApiState>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, OPENMETRICS_TEXT)],
        state.metrics.render(&state.runtime),
    )
}

#[cfg(test)]
mod tests {

    use super::*;

    #[tokio::test]
    async fn metrics_are_served_as_the_openmetrics_text_they_are() {
        let state = ApiState::empty().await;
        let runtime = state.runtime.clone();
        let response = get(State(state)).await.into_response();
        assert_eq!(
            response.headers()[CONTENT_TYPE],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&body);
        // OpenMetrics, not the 0.0.4 text format: a counter's family is
        // declared without `_total`, its sample has it; `# EOF` ends it.
        assert!(
            text.contains(
                "# TYPE rewire_config_subscribers_dropped counter\n\
                 rewire_config_subscribers_dropped_total 0\n"
            ),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        runtime.shutdown().await;
    }
}
