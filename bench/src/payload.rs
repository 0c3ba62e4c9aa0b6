//! The object every write stores: a tb `Model` of about 1 KiB of JSON. tb receives it as
//! `objects_json`; etcd stores the very same bytes as the value under `/tb-bench/<name>`, so
//! both systems replicate and persist the same payload.

/// Build the object named `name`, padded so its JSON is `size` bytes (or just over, when the
/// fixed part alone is longer).
pub fn model_json(name: &str, size: usize) -> String {
    let head = format!(
        r#"{{"apiVersion":"tb/v1","kind":"Model","metadata":{{"name":"{name}","namespace":"default"}},"spec":{{"format":"gguf","source":{{"path":"/models/{name}.gguf"}},"architecture":"llama-"#
    );
    let tail = r#""}}"#;
    let pad = size.saturating_sub(head.len() + tail.len());
    let mut s = String::with_capacity(head.len() + pad + tail.len());
    s.push_str(&head);
    // A repeating alphabet rather than one letter, so no layer can compress it to nothing.
    s.extend((0..pad).map(|i| char::from(b'a' + (i % 26) as u8)));
    s.push_str(tail);
    s
}

/// The etcd key for the object named `name`.
pub fn etcd_key(name: &str) -> Vec<u8> {
    format!("/tb-bench/{name}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_to_size_and_valid_json_shape() {
        let s = model_json("bench-00001", 1024);
        assert_eq!(s.len(), 1024);
        assert!(s.starts_with(r#"{"apiVersion":"tb/v1","kind":"Model""#));
        assert!(s.ends_with(r#""}}"#));
    }

    #[test]
    fn small_size_keeps_the_fixed_part() {
        let s = model_json("x", 10);
        assert!(s.len() > 10);
        assert!(s.contains(r#""name":"x""#));
    }
}
