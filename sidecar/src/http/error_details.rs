//! The `details` array of a Dapr HTTP error body: Dapr's rich error
//! details ([`ErrorDetail`]) as dapr/kit's `JSONErrorValue` writes them.

use serde_json::{json, Value};

use crate::dapr::{ErrorDetail, DAPR_DOMAIN};

/// The `@type` prefix of each detail.
const TYPE_PREFIX: &str = "type.googleapis.com/google.rpc.";

/// The `details` array of an error body, as dapr/kit writes it:
/// `ErrorInfo` (`reason`, `domain`, `metadata`, `null` when empty), then
/// `ResourceInfo` (`resource_type`, `resource_name`, `owner`,
/// `description`), then `BadRequest` (`field_violations`).
pub(crate) fn details_json(detail: &ErrorDetail) -> Value {
    let metadata = if detail.metadata.is_empty() {
        Value::Null
    } else {
        json!(detail.metadata)
    };
    let mut details = vec![json!({
        "@type": format!("{TYPE_PREFIX}ErrorInfo"),
        "reason": detail.reason,
        "domain": DAPR_DOMAIN,
        "metadata": metadata,
    })];
    if let Some(resource) = &detail.resource {
        details.push(json!({
            "@type": format!("{TYPE_PREFIX}ResourceInfo"),
            "resource_type": resource.resource_type,
            "resource_name": resource.resource_name,
            "owner": "",
            "description": resource.description,
        }));
    }
    if let Some(violation) = &detail.field_violation {
        details.push(json!({
            "@type": format!("{TYPE_PREFIX}BadRequest"),
            "field_violations": [{
                "field": violation.field,
                "description": violation.description,
            }],
        }));
    }
    Value::Array(details)
}

#[cfg(test)]
mod tests {
    use axum::http::StatusCode;
    use serde_json::json;

    use crate::dapr::StateOpError;
    use crate::http::error::HttpError;

    #[test]
    fn details_are_written_as_dapr_kit_writes_them() {
        let missing = HttpError::from(StateOpError::NotFound("x".into())).body();
        assert_eq!(
            missing["details"],
            json!([{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "DAPR_STATE_NOT_FOUND",
                "domain": "dapr.io",
                "metadata": null,
            }])
        );
        assert_eq!(missing["errorCode"], "ERR_STATE_STORE_NOT_FOUND");
        let key = HttpError::from(StateOpError::InvalidKey {
            store: "orders".into(),
            key: "a||b".into(),
            index: None,
            problem: "input key `a||b` can't contain `||`".into(),
        })
        .body();
        let details = &key["details"];
        assert_eq!(details[0]["reason"], "DAPR_STATE_ILLEGAL_KEY");
        assert_eq!(
            details[1],
            json!({
                "@type": "type.googleapis.com/google.rpc.ResourceInfo",
                "resource_type": "state",
                "resource_name": "orders",
                "owner": "",
                "description": "",
            })
        );
        assert_eq!(
            details[2]["@type"],
            "type.googleapis.com/google.rpc.BadRequest"
        );
        assert_eq!(details[2]["field_violations"][0]["field"], "a||b");
        let too_many = HttpError::from(StateOpError::TooManyOperations {
            store: "orders".into(),
            count: 3,
            max: 2,
        })
        .body();
        assert_eq!(
            too_many["errorCode"],
            "ERR_STATE_STORE_TOO_MANY_TRANSACTIONS"
        );
        assert_eq!(
            too_many["details"][0]["reason"],
            "DAPR_STATE_TOO_MANY_TRANSACTIONS"
        );
        assert_eq!(
            too_many["details"][0]["metadata"]["maxOpsPerTransaction"],
            "2"
        );
    }

    #[test]
    fn errors_without_dapr_details_have_no_details() {
        let error = HttpError::Invalid("bad".into());
        assert_eq!(error.status(), StatusCode::BAD_REQUEST);
        assert!(error.detail().is_none());
    }
}
