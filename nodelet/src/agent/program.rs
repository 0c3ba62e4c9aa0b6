//! Finding an exec rank's program before it starts, so a missing one fails with every path tried
//! rather than an interpreter's "No such file" about a path the user never wrote.
//!
//! The program is the command's first element; for an interpreter (`python3 train.py`,
//! `bash run.sh`) it is also the script, the first argument that is not an option.
//!
//! - `python` and `python3` run the nodelet's `--python` interpreter when one is set (else they
//!   are looked up on the PATH like any other name).
//! - A name without `/` is looked up on the rank's PATH (the job's `env.PATH`, else the
//!   nodelet's own).
//! - A relative path (a script, or a program with a `/`) is looked for in the rank's working
//!   directory (the job's `workingDir`, else the allocation's work dir), then in the directory
//!   of the manifest the job was applied from (annotation `tb/manifest-dir`), when that exists
//!   on this Mac. Found beside the manifest, it is passed on as an absolute path.
//! - When the rank runs as a job account, a path counts as found only if that account may reach
//!   it (enter every directory above it, read or execute the file): the nodelet, as root, must
//!   not tell a job about files its account could not see.

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Interpreters whose first non-option argument is a script, and the options after which they
/// run code given inline (or a module) instead.
const INTERPRETERS: &[(&str, &[&str])] = &[
    ("sh", &["-c"]),
    ("bash", &["-c"]),
    ("zsh", &["-c"]),
    ("dash", &["-c"]),
    ("python", &["-c", "-m"]),
    ("python3", &["-c", "-m"]),
    ("perl", &["-e", "-E"]),
    ("ruby", &["-e"]),
    ("node", &["-e", "-p", "--eval", "--print"]),
];
/// Python options that take a value as the next argument.
const WITH_VALUE: &[&str] = &["-W", "-X"];

/// Where to look, and for whom.
#[derive(Debug, Clone)]
pub struct Lookup<'a> {
    /// The directory the rank runs in.
    pub working_dir: &'a Path,
    /// The job's recorded manifest directory, if any.
    pub manifest_dir: Option<&'a Path>,
    /// The nodelet's `--python`.
    pub python: Option<&'a Path>,
    /// The PATH the rank gets.
    pub path: &'a OsStr,
    /// The account the rank runs as (uid, gid); None: the nodelet's own.
    pub account: Option<(u32, u32)>,
}

/// A program or script that is nowhere it was looked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct NotFound {
    /// As the command wrote it.
    pub wanted: String,
    /// "program" or "script".
    pub role: &'static str,
    /// Every path looked at, in order.
    pub tried: Vec<PathBuf>,
    /// Whether only what the job's account may reach counted.
    pub as_account: bool,
}

impl NotFound {
    fn message(&self) -> String {
        let tried: Vec<String> = self.tried.iter().map(|p| p.display().to_string()).collect();
        let mut m = format!(
            "{} {:?} not found; looked for {}",
            self.role,
            self.wanted,
            if tried.is_empty() {
                "it nowhere (the PATH is empty)".to_string()
            } else {
                tried.join(", ")
            }
        );
        if self.as_account {
            m.push_str(" (only what the job's account may enter and read counts)");
        }
        m
    }
}

/// The command as it will be started: `python`/`python3` replaced by `--python`, a relative
/// script or program found beside the manifest made absolute; or where it was looked for.
pub fn resolve(command: &[String], lookup: &Lookup) -> Result<Vec<String>, NotFound> {
    let mut out = command.to_vec();
    let Some(program) = command.first() else {
        return Ok(out);
    };
    let name = Path::new(program)
        .file_name()
        .and_then(OsStr::to_str)
        .unwrap_or("");
    let is_python = matches!(program.as_str(), "python" | "python3");
    match lookup.python {
        Some(python) if is_python => {
            if !reachable(python, Access::Execute, lookup.account) {
                return Err(not_found(program, "program", vec![python.into()], lookup));
            }
            out[0] = python.display().to_string();
        }
        _ if !program.contains('/') => {
            let tried: Vec<PathBuf> = std::env::split_paths(lookup.path)
                .filter(|d| !d.as_os_str().is_empty())
                .map(|d| d.join(program))
                .collect();
            if !tried
                .iter()
                .any(|p| reachable(p, Access::Execute, lookup.account))
            {
                return Err(not_found(program, "program", tried, lookup));
            }
        }
        _ => out[0] = find_file(program, "program", Access::Execute, lookup)?,
    }
    if let Some(inline) = inline_options(name)
        && let Some(i) = script_index(command, inline)
    {
        out[i] = find_file(&command[i], "script", Access::Read, lookup)?;
    }
    Ok(out)
}

/// The options that make an interpreter run inline code; None when `name` is no interpreter.
/// `python3.12` counts as `python3`.
fn inline_options(name: &str) -> Option<&'static [&'static str]> {
    let versioned_python = name
        .strip_prefix("python3.")
        .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
    let name = if versioned_python { "python3" } else { name };
    INTERPRETERS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, inline)| *inline)
}

/// The index of an interpreter's script argument: the first argument that is not an option,
/// unless code or a module is given inline first (or the script comes from stdin).
fn script_index(command: &[String], inline: &[&str]) -> Option<usize> {
    let mut i = 1;
    while i < command.len() {
        let arg = command[i].as_str();
        if arg == "--" {
            return (i + 1 < command.len()).then_some(i + 1);
        }
        if arg == "-" || inline.contains(&arg) {
            return None;
        }
        if !arg.starts_with('-') {
            return Some(i);
        }
        // `-cCODE`, `-mmodule`.
        if !arg.starts_with("--") && inline.iter().any(|o| o.len() == 2 && arg.starts_with(o)) {
            return None;
        }
        i += if WITH_VALUE.contains(&arg) { 2 } else { 1 };
    }
    None
}

/// An absolute path as it is (if it is there); a relative one in the working directory, then
/// beside the manifest.
fn find_file(
    wanted: &str,
    role: &'static str,
    access: Access,
    lookup: &Lookup,
) -> Result<String, NotFound> {
    let path = Path::new(wanted);
    if path.is_absolute() {
        return if reachable(path, access, lookup.account) {
            Ok(wanted.to_string())
        } else {
            Err(not_found(wanted, role, vec![path.into()], lookup))
        };
    }
    let in_working_dir = lookup.working_dir.join(path);
    if reachable(&in_working_dir, access, lookup.account) {
        // Found where the process itself will look: passed on as written.
        return Ok(wanted.to_string());
    }
    let mut tried = vec![in_working_dir];
    if let Some(dir) = lookup.manifest_dir {
        let beside = dir.join(path);
        if reachable(&beside, access, lookup.account) {
            return Ok(beside.display().to_string());
        }
        tried.push(beside);
    }
    Err(not_found(wanted, role, tried, lookup))
}

fn not_found(wanted: &str, role: &'static str, tried: Vec<PathBuf>, lookup: &Lookup) -> NotFound {
    NotFound {
        wanted: wanted.to_string(),
        role,
        tried,
        as_account: lookup.account.is_some(),
    }
}

#[derive(Debug, Clone, Copy)]
enum Access {
    Read,
    Execute,
}

/// Whether `path` is a file that `account` may reach (every directory above it enterable, the
/// file readable or executable by its mode bits), or for the nodelet's own account, a file at
/// all (executable when that is asked).
fn reachable(path: &Path, access: Access, account: Option<(u32, u32)>) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    if !meta.is_file() {
        return false;
    }
    let Some((uid, gid)) = account else {
        return match access {
            Access::Read => true,
            Access::Execute => meta.permissions().mode() & 0o111 != 0,
        };
    };
    let want = match access {
        Access::Read => 0o4,
        Access::Execute => 0o1,
    };
    let may = |meta: &std::fs::Metadata, bit: u32| {
        let mode = meta.permissions().mode();
        let shift = if meta.uid() == uid {
            6
        } else if meta.gid() == gid {
            3
        } else {
            0
        };
        (mode >> shift) & bit != 0
    };
    if !may(&meta, want) {
        return false;
    }
    // Every directory above it must let the account through.
    let Ok(absolute) = std::path::absolute(path) else {
        return false;
    };
    absolute
        .ancestors()
        .skip(1)
        .all(|dir| std::fs::metadata(dir).is_ok_and(|m| m.is_dir() && may(&m, 0o1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn file(path: &Path, mode: u32) {
        if let Some(p) = path.parent() {
            std::fs::create_dir_all(p).expect("mkdir");
        }
        std::fs::write(path, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    #[test]
    fn a_script_is_found_in_the_working_dir_then_beside_the_manifest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let work = dir.path().join("work");
        let manifests = dir.path().join("manifests");
        std::fs::create_dir_all(&work).expect("mkdir");
        file(&manifests.join("train.py"), 0o644);
        let bin = dir.path().join("bin");
        file(&bin.join("python3"), 0o755);
        let path = bin.clone().into_os_string();
        let lookup = Lookup {
            working_dir: &work,
            manifest_dir: Some(&manifests),
            python: None,
            path: &path,
            account: None,
        };
        let beside = manifests.join("train.py").display().to_string();
        assert_eq!(
            resolve(&strings(&["python3", "-u", "train.py", "x.txt"]), &lookup),
            Ok(strings(&["python3", "-u", &beside, "x.txt"]))
        );
        // In the working dir it wins, and stays as written.
        file(&work.join("train.py"), 0o644);
        assert_eq!(
            resolve(&strings(&["python3", "train.py"]), &lookup),
            Ok(strings(&["python3", "train.py"]))
        );
        // Inline code and modules have no script.
        for cmd in [["python3", "-c", "pass"], ["python3", "-m", "http.server"]] {
            assert_eq!(resolve(&strings(&cmd), &lookup), Ok(strings(&cmd)));
        }
        // Missing: every path tried, in order.
        let err = resolve(&strings(&["python3", "sub/missing.py"]), &lookup).expect_err("missing");
        assert_eq!(
            err.tried,
            [
                work.join("sub/missing.py"),
                manifests.join("sub/missing.py")
            ]
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with("script \"sub/missing.py\" not found; looked for "),
            "{msg}"
        );
        assert!(msg.contains(&manifests.join("sub/missing.py").display().to_string()));
    }

    #[test]
    fn python_is_the_nodelets_python_and_names_go_through_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let venv = dir.path().join("venv/bin/python");
        file(&venv, 0o755);
        let empty = dir.path().join("empty");
        std::fs::create_dir_all(&empty).expect("mkdir");
        let path =
            std::env::join_paths([dir.path().join("a"), dir.path().join("b")]).expect("PATH");
        let lookup = Lookup {
            working_dir: &empty,
            manifest_dir: None,
            python: Some(&venv),
            path: &path,
            account: None,
        };
        assert_eq!(
            resolve(&strings(&["python3", "-c", "pass"]), &lookup),
            Ok(strings(&[&venv.display().to_string(), "-c", "pass"]))
        );
        let err = resolve(&strings(&["mlx_lm.server"]), &lookup).expect_err("not on PATH");
        assert_eq!(
            err.tried,
            [
                dir.path().join("a/mlx_lm.server"),
                dir.path().join("b/mlx_lm.server")
            ]
        );
        // A relative program with a slash: working dir, then nowhere else without a manifest.
        let err = resolve(&strings(&["./run.sh"]), &lookup).expect_err("missing");
        assert_eq!(err.tried, [empty.join("./run.sh")]);
        assert_eq!(err.role, "program");
    }

    #[test]
    fn an_account_finds_only_what_it_may_reach() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let open = dir.path().join("open");
        let closed = dir.path().join("closed");
        file(&open.join("run.py"), 0o644);
        file(&closed.join("run.py"), 0o644);
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        // An account that owns none of it: it may enter `open`, not `closed`.
        let stranger = Some((u32::MAX - 7, u32::MAX - 7));
        assert!(reachable(&open.join("run.py"), Access::Read, stranger));
        assert!(!reachable(&closed.join("run.py"), Access::Read, stranger));
        assert!(!reachable(&open.join("run.py"), Access::Execute, stranger));
        assert!(reachable(&closed.join("run.py"), Access::Read, None));
        let path = OsStr::new("/usr/bin:/bin");
        let lookup = Lookup {
            working_dir: &open,
            manifest_dir: Some(&closed),
            python: None,
            path,
            account: stranger,
        };
        let err = resolve(&strings(&["sh", "other.sh"]), &lookup).expect_err("missing");
        assert!(err.to_string().contains("job's account"), "{err}");
    }

    #[test]
    fn interpreters_and_their_scripts() {
        assert_eq!(inline_options("python3.12"), inline_options("python3"));
        assert_eq!(inline_options("python3.x"), None);
        assert_eq!(inline_options("mlx_lm.server"), None);
        let index = |cmd: &[&str]| {
            let name = cmd[0];
            script_index(&strings(cmd), inline_options(name).expect("interpreter"))
        };
        assert_eq!(
            index(&["bash", "-e", "run.sh"]),
            Some(2),
            "errexit, then the script"
        );
        assert_eq!(index(&["bash", "-c", "echo hi"]), None);
        assert_eq!(index(&["perl", "-e", "print 1"]), None);
        assert_eq!(index(&["python3", "-W", "ignore", "t.py"]), Some(3));
        assert_eq!(index(&["python3", "-cprint(1)"]), None);
        assert_eq!(index(&["python3", "--", "t.py"]), Some(2));
        assert_eq!(index(&["python3"]), None);
    }
}
