//! How JSON values become the plain strings that config and secret stores
//! serve.

use serde_json::Value;

/// The text of `value`: a string as is, `null` as the empty string, and
/// anything else (numbers, bools, arrays, objects) as its JSON text.
pub fn value_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_stay_plain_and_the_rest_is_json_text() {
        assert_eq!(value_text(&json!("a\"b")), "a\"b");
        assert_eq!(value_text(&json!(5)), "5");
        assert_eq!(value_text(&json!(true)), "true");
        assert_eq!(value_text(&json!(null)), "");
        assert_eq!(value_text(&json!({"x": [1]})), r#"{"x":[1]}"#);
    }
}
