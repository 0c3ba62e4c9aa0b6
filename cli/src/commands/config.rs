//! `tbctl config`: manage contexts in the config file.

use anyhow::{Context as _, Result, bail};

use crate::args::{ConfigCommand, Global};
use crate::config::{ConfigFile, Context, config_path, unknown_context};
use crate::output::{Table, emit};
use crate::servers::parse_server_list;

pub fn run(cmd: ConfigCommand, g: &Global) -> Result<()> {
    let path = config_path()?;
    let mut file = ConfigFile::load(&path)?;
    match cmd {
        ConfigCommand::UseContext { name } => {
            if file.context(&name).is_none() {
                return Err(unknown_context(&name, &file));
            }
            file.current_context = Some(name.clone());
            file.save(&path)?;
            emit(&format!("Switched to context \"{name}\".\n"))
        }
        ConfigCommand::SetContext { name } => {
            let msg = set_context(
                &mut file,
                &name,
                g.server.as_deref(),
                g.namespace.as_deref(),
            )?;
            file.save(&path)?;
            emit(&msg)
        }
        ConfigCommand::GetContexts => emit(&contexts_table(&file)),
        ConfigCommand::CurrentContext => match &file.current_context {
            Some(c) => emit(&format!("{c}\n")),
            None => bail!("current-context is not set (see `tbctl config use-context`)"),
        },
    }
}

/// Create or change a context; the first context made also becomes the current one.
pub fn set_context(
    file: &mut ConfigFile,
    name: &str,
    server: Option<&str>,
    namespace: Option<&str>,
) -> Result<String> {
    if name.is_empty() {
        bail!("NAME: a context needs a name");
    }
    if let Some(s) = server {
        parse_server_list(s).context("--server")?;
    }
    let ns = namespace.map(str::to_string).filter(|n| !n.is_empty());
    let msg = match file.contexts.iter_mut().find(|c| c.name == name) {
        Some(c) => {
            if let Some(s) = server {
                c.server = s.to_string();
            }
            if ns.is_some() {
                c.namespace = ns;
            }
            format!("Context \"{name}\" modified.\n")
        }
        None => {
            let Some(server) = server else {
                bail!("--server: a new context needs its servers, HOST:PORT[,HOST:PORT...]");
            };
            file.contexts.push(Context {
                name: name.to_string(),
                server: server.to_string(),
                namespace: ns,
                token: None,
                ca_cert: None,
                insecure: false,
            });
            format!("Context \"{name}\" created.\n")
        }
    };
    if file.current_context.is_none() {
        file.current_context = Some(name.to_string());
    }
    Ok(msg)
}

pub fn contexts_table(file: &ConfigFile) -> String {
    let mut t = Table::new(["CURRENT", "NAME", "SERVER", "NAMESPACE"]);
    for c in &file.contexts {
        let current = file.current_context.as_deref() == Some(c.name.as_str());
        t.push(vec![
            if current { "*".into() } else { String::new() },
            c.name.clone(),
            c.server.clone(),
            c.namespace.clone().unwrap_or_default(),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_context_creates_then_modifies() {
        let mut f = ConfigFile::default();
        assert!(
            set_context(&mut f, "lab", None, None).is_err(),
            "new context needs --server"
        );
        assert!(
            set_context(&mut f, "lab", Some("nope"), None).is_err(),
            "bad server"
        );
        let m = set_context(&mut f, "lab", Some("a:1,b:2"), Some("team")).expect("create");
        assert_eq!(m, "Context \"lab\" created.\n");
        assert_eq!(f.current_context.as_deref(), Some("lab"));
        let m = set_context(&mut f, "lab", None, Some("other")).expect("modify");
        assert_eq!(m, "Context \"lab\" modified.\n");
        let c = f.context("lab").expect("lab");
        assert_eq!(
            (c.server.as_str(), c.namespace.as_deref()),
            ("a:1,b:2", Some("other"))
        );
        set_context(&mut f, "home", Some("c:3"), None).expect("second");
        assert_eq!(f.current_context.as_deref(), Some("lab"), "current stays");
    }

    #[test]
    fn get_contexts_marks_the_current_one() {
        let mut f = ConfigFile::default();
        set_context(&mut f, "lab", Some("a:1"), Some("team")).expect("lab");
        set_context(&mut f, "home", Some("c:3"), None).expect("home");
        assert_eq!(
            contexts_table(&f),
            "CURRENT   NAME   SERVER   NAMESPACE\n\
             *         lab    a:1      team\n          \
             home   c:3\n"
        );
    }
}
