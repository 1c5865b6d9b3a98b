//! Splicing fields into raw JSON objects without re-serializing the rest.
//!
//! Events pass through gridrelay as raw JSON text; where a rule must add fields (publish stamps,
//! the L6 dead-letter fields, an envelope's `data`), the text is spliced, not parsed into a
//! tree and written again.

use serde_json::Value;
use serde_json::value::RawValue;

/// Adds string fields at the front of a raw JSON object, without re-serializing the rest.
pub fn insert_fields(
    object: &str,
    fields: &[(&str, String)],
) -> Result<Box<RawValue>, serde_json::Error> {
    insert_raw_fields(
        object,
        &fields
            .iter()
            .map(|(k, v)| (*k, Value::String(v.clone())))
            .collect::<Vec<_>>(),
        Placement::Front,
    )
}

/// Where [`insert_raw_fields`] puts the new fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Front,
    Back,
}

/// Adds fields to a raw JSON object (which must start with `{` and end with `}`).
pub fn insert_raw_fields(
    object: &str,
    fields: &[(&str, Value)],
    placement: Placement,
) -> Result<Box<RawValue>, serde_json::Error> {
    if fields.is_empty() {
        return RawValue::from_string(object.trim().to_string());
    }
    let added = fields
        .iter()
        .map(|(k, v)| format!("{}:{}", Value::String((*k).to_string()), v))
        .collect::<Vec<_>>()
        .join(",");
    splice(object, &added, placement)
}

/// Adds one field whose value is raw JSON text at the end of a raw JSON object, so a `data`
/// value is carried over without being parsed into a tree.
pub fn append_raw_field(
    object: &str,
    name: &str,
    raw_value: &str,
) -> Result<Box<RawValue>, serde_json::Error> {
    let added = format!("{}:{raw_value}", Value::String(name.to_string()));
    splice(object, &added, Placement::Back)
}

/// Puts already-encoded `"name":value` text into a raw JSON object.
fn splice(
    object: &str,
    added: &str,
    placement: Placement,
) -> Result<Box<RawValue>, serde_json::Error> {
    let inner = object
        .trim()
        .strip_prefix('{')
        .and_then(|o| o.strip_suffix('}'))
        .map(str::trim)
        .ok_or_else(|| <serde_json::Error as serde::de::Error>::custom("not a JSON object"))?;
    let text = match (inner.is_empty(), placement) {
        (true, _) => format!("{{{added}}}"),
        (false, Placement::Front) => format!("{{{added},{inner}}}"),
        (false, Placement::Back) => format!("{{{inner},{added}}}"),
    };
    // Parsing again proves the result is one JSON value; it costs one scan of the text.
    RawValue::from_string(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn insert_raw_fields_keeps_the_original_text() {
        let out =
            insert_raw_fields(r#"{"a": [1, 2]}"#, &[("b", json!(3))], Placement::Back).unwrap();
        assert_eq!(out.get(), r#"{"a": [1, 2],"b":3}"#);
        let out = insert_raw_fields("{ }", &[("b", json!(3))], Placement::Front).unwrap();
        assert_eq!(out.get(), r#"{"b":3}"#);
        assert!(insert_raw_fields("[1]", &[("b", json!(3))], Placement::Front).is_err());
    }
}
