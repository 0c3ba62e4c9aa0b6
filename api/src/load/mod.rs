//! Loading objects from YAML (or JSON) files, directories and stdin, with errors that name the
//! file, line, column and field: `job.yaml:7:10: spec.ranks: invalid type: string "two",
//! expected u32`.
//!
//! A load is all or nothing: if any document is bad the caller gets every error and no objects,
//! so nothing is applied from a half-good file.

mod depth;
mod document;
mod json;
mod locate;
mod split;

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::Path;

use crate::bounds::{MAX_FILE_BYTES, describe_bytes};
use crate::object::{Object, ObjectKey};
use crate::validate::{ValidationError, validate_object};

use document::{DocErrors, load_document, load_typed_document};
use split::split_documents;

pub use json::{parse_json_strict, parse_status_json};

/// What `load_path` reads from a directory.
const EXTENSIONS: [&str; 3] = ["yaml", "yml", "json"];

/// The name stdin goes by in errors.
pub const STDIN_NAME: &str = "<stdin>";

/// A checked, normalised object and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedObject {
    pub object: Object,
    /// The file it was read from (as given), or `<stdin>`.
    pub source: String,
    /// The line its document starts on (1-based).
    pub line: usize,
}

/// One problem, at a place in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocatedError {
    pub file: String,
    /// 1-based; 0 when the problem is the file as a whole (unreadable, empty).
    pub line: usize,
    /// 1-based; meaningful when `line` is not 0.
    pub column: usize,
    /// The field, e.g. `spec.ranks`; empty when the problem is not in one field (bad YAML).
    pub path: String,
    pub message: String,
}

impl fmt::Display for LocatedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        f.write_str(": ")?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for LocatedError {}

/// Why a load failed: every problem found, in file order, one per line when displayed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct LoadError {
    pub errors: Vec<LocatedError>,
}

impl LoadError {
    fn single(file: &str, message: impl Into<String>) -> LoadError {
        LoadError {
            errors: vec![LocatedError {
                file: file.to_string(),
                line: 0,
                column: 0,
                path: String::new(),
                message: message.into(),
            }],
        }
    }

    /// The first problem (a `LoadError` always has at least one).
    pub fn first(&self) -> Option<&LocatedError> {
        self.errors.first()
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Collects objects and errors across the files of one load.
#[derive(Default)]
struct Loader {
    objects: Vec<LoadedObject>,
    errors: Vec<LocatedError>,
    /// Where each object was first defined, to catch the same object twice in one load.
    seen: BTreeMap<ObjectKey, (String, usize)>,
}

impl Loader {
    /// Loads every document of `text`; returns how many documents it had.
    fn add_text(&mut self, file: &str, text: &str) -> usize {
        let docs = split_documents(text);
        for doc in &docs {
            let errors = DocErrors { file, doc };
            match load_document(&errors) {
                Ok(object) => self.add_object(&errors, object),
                Err(e) => self.errors.push(e),
            }
        }
        docs.len()
    }

    fn add_object(&mut self, errors: &DocErrors<'_>, object: Object) {
        let key = object.key();
        if let Some((file, line)) = self.seen.get(&key) {
            let message = format!("{key} is defined twice in this load (first at {file}:{line})");
            self.errors.push(errors.at_path("metadata.name", &message));
            return;
        }
        self.seen
            .insert(key, (errors.file.to_string(), errors.doc.start));
        self.objects.push(LoadedObject {
            object,
            source: errors.file.to_string(),
            line: errors.doc.start,
        });
    }

    fn finish(self) -> Result<Vec<LoadedObject>, LoadError> {
        if self.errors.is_empty() {
            Ok(self.objects)
        } else {
            Err(LoadError {
                errors: self.errors,
            })
        }
    }
}

fn no_objects(file: &str) -> LoadError {
    LoadError::single(
        file,
        "no objects found; expected YAML documents with apiVersion, kind, metadata and spec",
    )
}

/// Loads the documents of `text`, naming `source_name` in errors.
pub fn load_str(source_name: &str, text: &str) -> Result<Vec<LoadedObject>, LoadError> {
    if text.len() > MAX_FILE_BYTES {
        return Err(too_large(source_name, Some(text.len() as u64)));
    }
    let mut loader = Loader::default();
    if loader.add_text(source_name, text) == 0 {
        return Err(no_objects(source_name));
    }
    loader.finish()
}

/// Reads a file that holds one YAML document of a format other than tb objects (a lab
/// description), with the same `FILE:LINE:COL: field: message` errors; `check` runs the rules
/// serde cannot, naming the field it rejects.
pub fn load_typed_str<T: serde::de::DeserializeOwned>(
    source_name: &str,
    text: &str,
    check: impl FnOnce(&T) -> Result<(), ValidationError>,
) -> Result<T, LocatedError> {
    let docs = split_documents(text);
    let [doc] = docs.as_slice() else {
        return Err(LocatedError {
            file: source_name.to_string(),
            line: 0,
            column: 0,
            path: String::new(),
            message: format!("expected exactly one YAML document, found {}", docs.len()),
        });
    };
    load_typed_document(
        &DocErrors {
            file: source_name,
            doc,
        },
        check,
    )
}

/// Reads everything from `reader` (stdin, a socket) and loads it.
pub fn load_reader(source_name: &str, reader: impl Read) -> Result<Vec<LoadedObject>, LoadError> {
    let text = read_text(source_name, reader)?;
    load_str(source_name, &text)
}

/// Reads at most [`MAX_FILE_BYTES`] of UTF-8 text from `reader`, naming `source_name` when it
/// is longer or not text (with the line and column of the first bad byte).
pub fn read_text(source_name: &str, reader: impl Read) -> Result<String, LoadError> {
    let mut bytes = Vec::new();
    reader
        .take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| LoadError::single(source_name, format!("cannot read: {e}")))?;
    if bytes.len() > MAX_FILE_BYTES {
        return Err(too_large(source_name, None));
    }
    utf8(source_name, bytes)
}

/// The refusal of an input over [`MAX_FILE_BYTES`], checked before anything is parsed.
fn too_large(name: &str, size: Option<u64>) -> LoadError {
    let size = match size {
        Some(n) => format!("{n} bytes"),
        None => "more".to_string(),
    };
    LoadError::single(
        name,
        format!(
            "the file is {size}; tbctl reads at most {} from one file (the most one request to \
             the controller may carry, and one object may be at most {}); split it into smaller \
             files",
            describe_bytes(MAX_FILE_BYTES),
            describe_bytes(crate::bounds::MAX_OBJECT_BYTES)
        ),
    )
}

/// Loads a file, every `*.yaml`, `*.yml` and `*.json` file of a directory (sorted by name, not
/// recursive; empty files are skipped), or stdin for `-`.
pub fn load_path(path: &Path) -> Result<Vec<LoadedObject>, LoadError> {
    let name = path.display().to_string();
    if path == Path::new("-") {
        return load_reader(STDIN_NAME, std::io::stdin().lock());
    }
    let meta = std::fs::metadata(path)
        .map_err(|e| LoadError::single(&name, format!("cannot read: {e}")))?;
    if !meta.is_dir() {
        let text = read_file(path)?;
        return load_str(&name, &text);
    }
    let mut files: Vec<_> = std::fs::read_dir(path)
        .map_err(|e| LoadError::single(&name, format!("cannot read directory: {e}")))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| EXTENSIONS.contains(&e))
                && p.is_file()
        })
        .collect();
    files.sort();
    let mut loader = Loader::default();
    let mut documents = 0;
    for file in &files {
        match read_file(file) {
            Ok(text) => documents += loader.add_text(&file.display().to_string(), &text),
            Err(e) => loader.errors.extend(e.errors),
        }
    }
    if documents == 0 && loader.errors.is_empty() {
        return Err(LoadError::single(
            &name,
            "no objects found in the directory's *.yaml, *.yml and *.json files",
        ));
    }
    loader.finish()
}

fn read_file(path: &Path) -> Result<String, LoadError> {
    let name = path.display().to_string();
    let cannot = |e: std::io::Error| LoadError::single(&name, format!("cannot read: {e}"));
    // The size is checked before anything is read or parsed.
    let size = std::fs::metadata(path).map_err(cannot)?.len();
    if size > MAX_FILE_BYTES as u64 {
        return Err(too_large(&name, Some(size)));
    }
    let file = std::fs::File::open(path).map_err(cannot)?;
    read_text(&name, file)
}

/// The bytes as text, or the line and column of the first byte that is not UTF-8.
fn utf8(name: &str, bytes: Vec<u8>) -> Result<String, LoadError> {
    String::from_utf8(bytes).map_err(|e| {
        let offset = e.utf8_error().valid_up_to();
        let bytes = e.as_bytes();
        // Everything before `offset` is valid UTF-8.
        let before = std::str::from_utf8(&bytes[..offset]).unwrap_or_default();
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
        LoadError {
            errors: vec![LocatedError {
                file: name.to_string(),
                line,
                column,
                path: String::new(),
                message: format!(
                    "not UTF-8 text: byte 0x{:02x} (at byte offset {offset}) does not begin or \
                     continue a UTF-8 character; save the file as UTF-8",
                    bytes[offset]
                ),
            }],
        }
    })
}

/// An object as YAML, as `tbctl get -o yaml` prints it.
pub fn to_yaml(obj: &Object) -> String {
    // Objects are string-keyed trees, which YAML always represents; JSON (also YAML) is the
    // fallback should that ever change.
    serde_yaml::to_string(obj).unwrap_or_else(|_| obj.to_json())
}

/// The server's reading of a submitted object: JSON text → object → `validate_object`.
/// Duplicate keys are refused as the YAML loader refuses them, not read last-one-wins.
pub fn parse_object_json(text: &str) -> Result<Object, ValidationError> {
    let obj: Object = json::from_json_strict(text)?;
    validate_object(&obj)
}

#[cfg(test)]
mod tests;
