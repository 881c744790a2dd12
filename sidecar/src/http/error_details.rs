//! The `details` array of a Dapr HTTP error body: Dapr's rich error
//! details ([`ErrorDetail`]) as dapr/kit's `JSONErrorValue` writes them.

use serde_json::{json, Value};

use crate::dapr::{ErrorDetail, DAPR_DOMAIN};

/// The `@type` prefix of each detail.
const TYPE_PREFIX: &str = "type.googleapis.com/google.rpc.";

/// The `details` array of an error body, as dapr/kit writes it, in the
/// order Dapr's builders add them: `BadRequest` (`field_violations`),
/// `Help` (`links`), `ResourceInfo` (`resource_type`, `resource_name`,
/// `owner`, `description`), then `ErrorInfo` (`reason`, `domain`,
/// `metadata`, `null` when empty).
pub(crate) fn details_json(detail: &ErrorDetail) -> Value {
    let mut details = Vec::with_capacity(4);
    if let Some(violation) = &detail.field_violation {
        details.push(json!({
            "@type": format!("{TYPE_PREFIX}BadRequest"),
            "field_violations": [{
                "field": violation.field,
                "description": violation.description,
            }],
        }));
    }
    if let Some(link) = &detail.help {
        details.push(json!({
            "@type": format!("{TYPE_PREFIX}Help"),
            "links": [{"description": link.description, "url": link.url}],
        }));
    }
    if let Some(resource) = &detail.resource {
        details.push(json!({
            "@type": format!("{TYPE_PREFIX}ResourceInfo"),
            "resource_type": resource.resource_type,
            "resource_name": resource.resource_name,
            "owner": "",
            "description": resource.description,
        }));
    }
    let metadata = if detail.metadata.is_empty() {
        Value::Null
    } else {
        json!(detail.metadata)
    };
    details.push(json!({
        "@type": format!("{TYPE_PREFIX}ErrorInfo"),
        "reason": detail.reason,
        "domain": DAPR_DOMAIN,
        "metadata": metadata,
    }));
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
        let missing = HttpError::from(StateOpError::NotFound {
            store: "x".into(),
            app_id: "shop".into(),
        })
        .body();
        assert_eq!(
            missing["details"],
            json!([{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "DAPR_STATE_NOT_FOUND",
                "domain": "dapr.io",
                "metadata": {"appID": "shop"},
            }])
        );
        assert_eq!(missing["errorCode"], "ERR_STATE_STORE_NOT_FOUND");
        // No app id: no metadata, as Dapr's.
        let anonymous = HttpError::from(StateOpError::NotConfigured {
            store: "orders".into(),
            app_id: String::new(),
        })
        .body();
        assert_eq!(anonymous["details"][0]["metadata"], json!(null));
        // As Dapr's `InvalidKeyName`: BadRequest, ResourceInfo, ErrorInfo.
        let key = HttpError::from(StateOpError::InvalidKey {
            store: "orders".into(),
            key: "a||b".into(),
            index: None,
            problem: "input key `a||b` can't contain `||`".into(),
        })
        .body();
        let details = &key["details"];
        assert_eq!(
            details[0]["@type"],
            "type.googleapis.com/google.rpc.BadRequest"
        );
        assert_eq!(details[0]["field_violations"][0]["field"], "a||b");
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
        assert_eq!(details[2]["reason"], "DAPR_STATE_ILLEGAL_KEY");
        assert_eq!(details.as_array().map(Vec::len), Some(3));
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
        assert_eq!(too_many["details"][0]["resource_name"], "orders");
        assert_eq!(
            too_many["details"][1]["reason"],
            "DAPR_STATE_TOO_MANY_TRANSACTIONS"
        );
        assert_eq!(
            too_many["details"][1]["metadata"]["maxOpsPerTransaction"],
            "2"
        );
        // As Dapr's `TransactionsNotSupported`: Help, ResourceInfo, ErrorInfo.
        let unsupported =
            HttpError::from(StateOpError::TransactionsNotSupported("orders".into())).body();
        assert_eq!(
            unsupported["details"][0],
            json!({
                "@type": "type.googleapis.com/google.rpc.Help",
                "links": [{
                    "description": "Check the list of state stores and the features they support",
                    "url": "https://docs.dapr.io/reference/components-reference/supported-state-stores/",
                }],
            })
        );
        assert_eq!(unsupported["details"][1]["resource_type"], "state");
        assert_eq!(
            unsupported["details"][2]["reason"],
            "DAPR_STATE_TRANSACTIONS_NOT_SUPPORTED"
        );
    }

    #[test]
    fn errors_without_dapr_details_have_no_details() {
        let error = HttpError::Invalid("bad".into());
        assert_eq!(error.status(), StatusCode::BAD_REQUEST);
        assert!(error.detail().is_none());
    }
}
