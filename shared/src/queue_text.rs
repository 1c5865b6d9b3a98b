//! The characters SQS takes in a message body, and JSON text made to fit them (#34 item 7).
//!
//! SQS refuses a message body holding any character outside `#x9 | #xA | #xD | #x20-#xD7FF |
//! #xE000-#xFFFD | #x10000-#x10FFFF` (its `SendMessage` reference). Valid JSON text can hold
//! only two of those raw: U+FFFE and U+FFFF, inside strings (control characters must be
//! escaped in JSON strings, and only space, tab, CR and LF may stand between tokens). Both
//! have escapes (`\ufffe`, `\uffff`) that spell the same JSON value, so a JSON body is made to
//! fit by writing them escaped. A JSON writer (`serde_json`) writes them raw again, so every
//! body is made to fit on its way to a queue, not once at publish.

use std::borrow::Cow;

/// Whether SQS takes `c` in a message body.
pub fn sqs_takes(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' | '\u{10000}'..)
}

/// The first character of `text` SQS would refuse, and its byte offset. In a `str` (UTF-8,
/// which holds no surrogate) those are the control characters but tab, LF and CR, and U+FFFE
/// and U+FFFF: found by a scan of bytes, not a decoding of characters.
pub fn first_refused(text: &str) -> Option<(usize, char)> {
    let bytes = text.as_bytes();
    let refused = |i: usize| match bytes[i] {
        b'\t' | b'\n' | b'\r' => false,
        0..0x20 => true,
        0xEF => is_raw_noncharacter(&bytes[i..]),
        _ => false,
    };
    // Both kinds start a character (ASCII, or a three-byte sequence's first byte).
    let at = (0..bytes.len()).find(|&i| refused(i))?;
    text[at..].chars().next().map(|c| (at, c))
}

/// Whether `bytes` starts with U+FFFE or U+FFFF (`EF BF BE`, `EF BF BF`).
fn is_raw_noncharacter(bytes: &[u8]) -> bool {
    matches!(bytes, [0xEF, 0xBF, 0xBE | 0xBF, ..])
}

/// `json` (valid JSON text) with every raw U+FFFE and U+FFFF written as its escape: the same
/// JSON value, in characters SQS takes. Borrowed when there is none (the common case, found by
/// a scan of bytes).
pub fn escape_for_sqs(json: &str) -> Cow<'_, str> {
    let bytes = json.as_bytes();
    if !(0..bytes.len()).any(|i| is_raw_noncharacter(&bytes[i..])) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        match c {
            '\u{FFFE}' => out.push_str("\\ufffe"),
            '\u{FFFF}' => out.push_str("\\uffff"),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    #[test]
    fn the_two_raw_noncharacters_are_escaped_to_the_same_value() {
        let json = "{\"a\":\"x\u{FFFF}y\u{FFFE}\",\"b\":\"\\uffff\"}";
        assert_eq!(first_refused(json), Some((7, '\u{FFFF}')));
        let escaped = escape_for_sqs(json);
        assert_eq!(first_refused(&escaped), None);
        let before: Value = serde_json::from_str(json).unwrap();
        let after: Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(before, after);
        // Written again, the value holds them raw: escaped again on the next way to a queue.
        assert!(serde_json::to_string(&after).unwrap().contains('\u{FFFF}'));
    }

    #[test]
    fn text_without_them_is_borrowed_as_it_is() {
        assert!(matches!(
            escape_for_sqs("[1,\"\u{FFFD}\"]"),
            Cow::Borrowed(_)
        ));
        assert!(sqs_takes('\u{FFFD}') && sqs_takes('\u{10FFFF}') && sqs_takes('\t'));
        assert!(!sqs_takes('\u{1}') && !sqs_takes('\u{FFFE}') && !sqs_takes('\u{FFFF}'));
    }

    proptest! {
        /// The byte scan finds what a decoding of characters finds.
        #[test]
        fn the_byte_scan_agrees_with_the_character_set(s in "\\PC*|[\u{0}-\u{20}\u{FFF0}-\u{FFFF}ab]*") {
            let decoded = s.char_indices().find(|(_, c)| !sqs_takes(*c));
            prop_assert_eq!(first_refused(&s), decoded);
        }

        /// Any JSON value, written by serde_json, fits SQS once escaped, and reads back equal.
        #[test]
        fn any_json_string_fits_once_escaped(s in "\\PC*|[\u{FFF0}-\u{FFFF}a\"\\\\]*") {
            let json = serde_json::to_string(&Value::String(s.clone())).unwrap();
            let escaped = escape_for_sqs(&json);
            prop_assert_eq!(first_refused(&escaped), None);
            let back: Value = serde_json::from_str(&escaped).unwrap();
            prop_assert_eq!(back, Value::String(s));
        }
    }
}
