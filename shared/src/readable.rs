//! Whether an event the publish API accepts can be read by the subscription filters.
//!
//! Events travel as raw JSON text; only filters read them as a tree (`serde_json::Value`). Some
//! texts are valid JSON that such a tree cannot hold: a number beyond `f64` (`1e400`), or
//! nesting deeper than serde_json's recursion limit. Accepted with 200, such an event could
//! never pass any filter and would silently reach no filtered subscription. So every event is
//! checked here when it is published, and refused with a 400 that names the event and the field
//! instead.
//!
//! An event's own (top-level) fields must each appear once: they are read by name (envelope
//! checks, conversion to another schema), and a second `data` would make one reading differ
//! from another.
//!
//! The check walks the text once with serde_json's own deserializer, the way building a tree
//! would, but without building it (no allocation but for escaped keys), so it fails exactly
//! when building the tree fails.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

const DUPLICATE_FIELD: &str = "duplicate field";

/// Where an event cannot be read as a tree, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// The field, as filters name fields (`data.items[2].price`); empty for the event itself.
    pub field: String,
    pub problem: String,
}

/// Checks that `text` (one event) can be read as a `serde_json::Value`.
pub fn check_readable(text: &str) -> Result<(), Unreadable> {
    let failure = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let walked = Walk {
        at: Place::Root,
        failure: &failure,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    match walked {
        Ok(()) => Ok(()),
        Err(e) => {
            let field = failure.into_inner().unwrap_or_default();
            Err(Unreadable {
                field,
                problem: describe(&e),
            })
        }
    }
}

fn describe(e: &serde_json::Error) -> String {
    let message = e.to_string();
    let message = message
        .split(" at line ")
        .next()
        .unwrap_or(&message)
        .to_string();
    match message.as_str() {
        "number out of range" => {
            "a number too large for a 64-bit float; allowed: numbers within ±1.8e308".into()
        }
        DUPLICATE_FIELD => "the field appears more than once; allowed: each field of an event once".into(),
        "recursion limit exceeded" => {
            "objects and arrays nested too deep; allowed: at most 127 levels, counting the event itself"
                .into()
        }
        _ => message,
    }
}

/// Where the walk is, as a chain up to the event: built into a name only on failure.
#[derive(Clone, Copy)]
enum Place<'a> {
    Root,
    Field(&'a Place<'a>, &'a str),
    Index(&'a Place<'a>, usize),
}

impl fmt::Display for Place<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Root => Ok(()),
            Place::Field(Place::Root, name) => write!(f, "{name}"),
            Place::Field(parent, name) => write!(f, "{parent}.{name}"),
            Place::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

/// Walks one value; the first (deepest) place that fails is recorded in `failure`.
struct Walk<'a> {
    at: Place<'a>,
    failure: &'a RefCell<Option<String>>,
}

impl Walk<'_> {
    fn record<E>(&self, result: Result<(), E>) -> Result<(), E> {
        if result.is_err() {
            let mut failure = self.failure.borrow_mut();
            if failure.is_none() {
                *failure = Some(self.at.to_string());
            }
        }
        result
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        let result = deserializer.deserialize_any(WalkVisitor {
            at: &self.at,
            failure: self.failure,
        });
        self.record(result)
    }
}

struct WalkVisitor<'a> {
    at: &'a Place<'a>,
    failure: &'a RefCell<Option<String>>,
}

impl<'de> Visitor<'de> for WalkVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        loop {
            let at = Place::Index(self.at, i);
            let walk = Walk {
                at,
                failure: self.failure,
            };
            if seq.next_element_seed(walk)?.is_none() {
                return Ok(());
            }
            i += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // The event's own fields are read by name (envelopes, schema conversion): each may
        // appear once. Deeper objects are read as trees, where the last one wins.
        let mut fields: HashSet<Cow<'de, str>> = HashSet::new();
        let top = matches!(self.at, Place::Root);
        while let Some(key) = map.next_key_seed(Key)? {
            if top && !fields.insert(key.clone()) {
                let mut failure = self.failure.borrow_mut();
                if failure.is_none() {
                    *failure = Some(key.to_string());
                }
                return Err(de::Error::custom(DUPLICATE_FIELD));
            }
            let at = Place::Field(self.at, &key);
            map.next_value_seed(Walk {
                at,
                failure: self.failure,
            })?;
        }
        Ok(())
    }
}

/// A map key, borrowed from the text when it has no escapes (serde's own `Cow<str>` always
/// copies).
pub(crate) struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nested(depth: usize) -> String {
        format!(
            "{{\"data\":{}1{}}}",
            "[".repeat(depth - 1),
            "]".repeat(depth - 1)
        )
    }

    /// Item 3 of the life-cycle issue: what a tree cannot hold is named by its field.
    #[test]
    fn numbers_beyond_f64_and_deep_nesting_are_named() {
        let e = check_readable(r#"{"id":"1","data":{"items":[{"price":1},{"price":1e400}]}}"#)
            .unwrap_err();
        assert_eq!(e.field, "data.items[1].price");
        assert!(e.problem.contains("64-bit float"), "{}", e.problem);

        assert!(check_readable(&nested(127)).is_ok());
        let e = check_readable(&nested(128)).unwrap_err();
        assert!(e.field.starts_with("data[0][0]"), "{}", e.field);
        assert!(e.problem.contains("at most 127 levels"), "{}", e.problem);

        let e = check_readable(r#"{"id":"1","data":{"a":1},"data":{"a":2}}"#).unwrap_err();
        assert_eq!(e.field, "data");
        assert!(e.problem.contains("more than once"), "{}", e.problem);
        assert!(check_readable(r#"{"data":{"a":1,"a":2}}"#).is_ok());

        let e = check_readable(r#"{"a\"b":-1e309}"#).unwrap_err();
        assert_eq!(e.field, "a\"b");
        assert!(check_readable(r#"{"tiny":1e-400,"big":18446744073709551616}"#).is_ok());
    }

    /// A JSON text of nested arrays and objects, with numbers at the edges of `f64`.
    fn json_text() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("1e400".to_string()),
            Just("-2e308".to_string()),
            Just("1.7e308".to_string()),
            Just("1e-400".to_string()),
            Just("18446744073709551616".to_string()),
            Just("\"x\\u00e9\"".to_string()),
            Just("true".to_string()),
            Just("null".to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
        ];
        leaf.prop_recursive(140, 400, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                proptest::collection::vec(("[a-z\\\\\"]{1,3}", inner), 0..3).prop_map(|fields| {
                    let fields: Vec<String> = fields
                        .into_iter()
                        .map(|(k, v)| format!("{}:{v}", serde_json::json!(k)))
                        .collect();
                    format!("{{{}}}", fields.join(","))
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// The check accepts exactly what a `serde_json::Value` can hold, at every depth.
        #[test]
        fn accepts_exactly_what_a_tree_holds(inner in json_text(), depth in 0usize..140) {
            let text = format!("{{\"data\":{}{inner}{}}}", "[".repeat(depth), "]".repeat(depth));
            let tree = serde_json::from_str::<serde_json::Value>(&text);
            prop_assert_eq!(check_readable(&text).is_ok(), tree.is_ok(), "{}", text);
        }
    }
}
