//! The sizes tb accepts, stores and echoes, in one place: how large one object, its annotations
//! and one file may be, and how much of a user's string an error message or an audit record
//! repeats. tbctl and the controller read the same constants, so both refuse the same things.

use std::fmt;

/// The most one object may weigh, as compact JSON (Kubernetes: 1.5 MiB per object in etcd).
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;
/// The most all of one object's annotations may weigh together, keys and values (Kubernetes:
/// 256 KiB).
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;
/// The largest file (or stdin) tbctl reads objects from: the largest request the controller
/// takes, so a file that fits is never refused for its size by the server.
pub const MAX_FILE_BYTES: usize = 16 * 1024 * 1024;
/// The longest manifest directory `tbctl apply -f` may record (macOS's PATH_MAX).
pub const MAX_MANIFEST_DIR_BYTES: usize = 1024;
/// The most of a user's string (a name, a value) that an error message or an audit record
/// repeats; longer ones are cut and followed by their real length.
pub const MAX_ECHO_BYTES: usize = 1024;

/// A string as an error may repeat it: itself when short, else its first [`MAX_ECHO_BYTES`]
/// (cut at a character boundary) followed by `…(N bytes)`.
pub fn excerpt(s: &str) -> String {
    excerpt_to(s, MAX_ECHO_BYTES)
}

/// [`excerpt`] with another limit (the cut never splits a character).
pub fn excerpt_to(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…({} bytes)", &s[..cut], s.len())
}

/// `{:?}` of a string, bounded like [`excerpt`]: `"abc"`, or `"aaaa…"…(10485760 bytes)`.
pub struct Quoted<'a>(pub &'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        if s.len() <= MAX_ECHO_BYTES {
            return write!(f, "{s:?}");
        }
        let mut cut = MAX_ECHO_BYTES;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        write!(f, "{:?}…({} bytes)", &s[..cut], s.len())
    }
}

/// A byte count as people read limits: `1.5 MiB (1572864 bytes)`.
pub fn describe_bytes(n: usize) -> String {
    const KI: usize = 1024;
    const MI: usize = 1024 * 1024;
    let unit = if n >= MI && n.is_multiple_of(MI / 2) {
        format_unit(n, MI, "MiB")
    } else if n >= KI && n.is_multiple_of(KI / 2) {
        format_unit(n, KI, "KiB")
    } else {
        return format!("{n} bytes");
    };
    format!("{unit} ({n} bytes)")
}

fn format_unit(n: usize, unit: usize, name: &str) -> String {
    if n.is_multiple_of(unit) {
        format!("{} {name}", n / unit)
    } else {
        format!("{}.5 {name}", n / unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_strings_are_echoed_whole() {
        assert_eq!(excerpt("web-1"), "web-1");
        assert_eq!(Quoted("a\"b").to_string(), "\"a\\\"b\"");
    }

    #[test]
    fn long_strings_are_cut_with_their_length() {
        let long = "x".repeat(10 << 20);
        let e = excerpt(&long);
        assert!(e.len() < MAX_ECHO_BYTES + 32, "{}", e.len());
        assert!(e.ends_with("…(10485760 bytes)"), "{e}");
        let q = Quoted(&long).to_string();
        assert!(q.len() < MAX_ECHO_BYTES + 32);
        assert!(q.ends_with("\"…(10485760 bytes)"), "{q}");
        // Never inside a character.
        let wide = "é".repeat(600);
        assert!(excerpt(&wide).starts_with(&"é".repeat(512)));
    }

    #[test]
    fn limits_read_in_binary_units() {
        assert_eq!(describe_bytes(MAX_OBJECT_BYTES), "1.5 MiB (1572864 bytes)");
        assert_eq!(
            describe_bytes(MAX_ANNOTATIONS_BYTES),
            "256 KiB (262144 bytes)"
        );
        assert_eq!(describe_bytes(MAX_FILE_BYTES), "16 MiB (16777216 bytes)");
        assert_eq!(describe_bytes(1000), "1000 bytes");
    }
}
