//! Reading the fields of a Kubernetes object as YAML gives it: a list that
//! may be absent, a scalar as written, an object's name.

use serde_norway::Value;

/// The sequence at `key` (empty when absent or not a sequence).
pub(super) fn seq<'a>(value: &'a Value, key: &str) -> &'a [Value] {
    value
        .get(key)
        .and_then(Value::as_sequence)
        .map_or(&[][..], |s| s.as_slice())
}

/// A scalar as the YAML would write it.
pub(super) fn text_of(value: &Value) -> String {
    serde_norway::to_string(value).unwrap_or_default().trim_end().to_owned()
}

/// An object's `name` field ("" when absent).
pub(super) fn name_of(value: &Value) -> &str {
    value.get("name").and_then(Value::as_str).unwrap_or("")
}
