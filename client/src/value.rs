//! RESP values read leniently as numbers and strings, whichever way a server sends them.
//! Shared by the typed client (`client`) and the Sentinel discovery (`sentinel`).

use redis::Value;

pub(crate) fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        // Be lenient with servers that send numbers as strings.
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

pub(crate) fn as_string(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Okay => Some("OK".into()),
        Value::Int(n) => Some(n.to_string()),
        _ => None,
    }
}
