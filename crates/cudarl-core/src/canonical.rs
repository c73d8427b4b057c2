//! Canonical JSON: the byte encoding that cache keys hash.
//!
//! Rules: object keys sorted by their UTF-8 bytes, no insignificant whitespace, strings escaped
//! as `serde_json` escapes them, integers in decimal, floats in `serde_json`'s shortest
//! round-trip form (ryu). Two values that are equal as JSON always encode to the same bytes,
//! whatever order their keys were inserted in.

use serde_json::Value;

/// Encodes `v` canonically (see the module docs).
pub fn to_canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_value(v, &mut out);
    out
}

fn write_value(v: &Value, out: &mut String) {
    match v {
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {
            out.push_str(&serde_json::to_string(v).expect("scalar JSON always serializes"));
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::to_string(k).expect("string serializes"));
                out.push(':');
                write_value(&map[k.as_str()], out);
            }
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_matter() {
        let a: Value = serde_json::from_str(r#"{"b":1,"a":{"z":[1,2.5,"x"],"y":null}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"y":null,"z":[1,2.5,"x"]},"b":1}"#).unwrap();
        assert_eq!(to_canonical_json(&a), to_canonical_json(&b));
        assert_eq!(
            to_canonical_json(&a),
            r#"{"a":{"y":null,"z":[1,2.5,"x"]},"b":1}"#
        );
    }

    #[test]
    fn scalars_are_stable() {
        assert_eq!(to_canonical_json(&json!(1e-5)), "0.00001");
        assert_eq!(to_canonical_json(&json!(2.5e-12)), "2.5e-12");
        assert_eq!(to_canonical_json(&json!(0.1)), "0.1");
        assert_eq!(to_canonical_json(&json!("a\"b\n")), r#""a\"b\n""#);
        assert_eq!(to_canonical_json(&json!(-3)), "-3");
    }
}
