//! Reading the cluster file: the TOML file, then the `WEIR_*` variables over it, with errors that
//! name the key and the line and never quote a secret.
//!
//! Relative paths in the file (`data_dir`, a node's `data_dir`, a `file://` remote, the rsync
//! password file, the TLS files) are taken from the file's directory, so every command finds
//! the same places whatever its working directory; paths from the environment are taken from
//! the working directory, as a shell user expects.

use anyhow::Context;

use super::ClusterFile;

/// Top-level keys: the environment variables that are config (`WEIR_<KEY>` or `WEIR_<KEY>__…`).
const TOP_KEYS: &[&str] = &[
    "cluster",
    "cluster_secret",
    "clients",
    "credential",
    "data_dir",
    "workers",
    "pin_workers",
    "state_budget",
    "stream",
    "checkpoint",
    "restart",
    "tls",
    "control",
];

/// Reads `path`, then applies the `WEIR_*` variables of `env`.
pub fn load(path: &std::path::Path, env: impl IntoIterator<Item = (String, String)>) -> anyhow::Result<ClusterFile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the config file {}", path.display()))?;
    // The file alone first: its errors name the key and the line.
    toml::from_str::<ClusterFile>(&text)
        .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), redact_secrets(&text, e.to_string().trim())))?;
    let mut table: toml::Table = toml::from_str(&text).expect("parsed above");
    let base = std::path::absolute(path)
        .with_context(|| format!("finding the directory of the config file {}", path.display()))?;
    resolve_paths(&mut table, base.parent().unwrap_or(std::path::Path::new("/")));
    let mut applied = Vec::new();
    for (name, value) in env {
        let Some(rest) = name.strip_prefix("WEIR_") else { continue };
        let parts: Vec<String> = rest.split("__").map(str::to_lowercase).collect();
        if !TOP_KEYS.contains(&parts[0].as_str()) {
            continue;
        }
        // Secrets are taken as they are: an all-digit secret is not a number.
        let value = if matches!(parts[0].as_str(), "cluster_secret" | "credential") {
            toml::Value::String(value)
        } else {
            parse_value(&value)
        };
        set(&mut table, &parts, value).with_context(|| format!("environment variable {name}"))?;
        applied.push(name);
    }
    toml::Value::Table(table)
        .try_into::<ClusterFile>()
        .map_err(|e| anyhow::anyhow!("{} with {}: {}", path.display(), applied.join(", "), e.to_string().trim()))
}

/// Makes the file's relative paths absolute, from `base` (the file's directory).
fn resolve_paths(table: &mut toml::Table, base: &std::path::Path) {
    let at = |v: &mut toml::Value, file_url: bool| {
        let toml::Value::String(s) = v else { return };
        let (scheme, rest) = match s.strip_prefix("file://") {
            Some(rest) => ("file://", rest),
            None if file_url && s.contains("://") => return,
            None => ("", s.as_str()),
        };
        if !rest.is_empty() && std::path::Path::new(rest).is_relative() {
            *s = format!("{scheme}{}", lexical(&base.join(rest)).display());
        }
    };
    // The default too: `weir-data` beside the file.
    at(table.entry("data_dir").or_insert_with(|| "weir-data".into()), false);
    if let Some(toml::Value::Array(nodes)) = table.get_mut("nodes") {
        for n in nodes.iter_mut().filter_map(toml::Value::as_table_mut) {
            if let Some(v) = n.get_mut("data_dir") {
                at(v, false);
            }
        }
    }
    if let Some(ck) = table.get_mut("checkpoint").and_then(toml::Value::as_table_mut) {
        if let Some(v) = ck.get_mut("remote") {
            at(v, true);
        }
        if let Some(v) = ck.get_mut("rsync_password_file") {
            at(v, false);
        }
    }
    if let Some(tls) = table.get_mut("tls").and_then(toml::Value::as_table_mut) {
        for key in ["ca", "cert", "key"] {
            if let Some(v) = tls.get_mut(key) {
                at(v, false);
            }
        }
    }
}

/// `p` without `.` and with each `..` taking off the part before it (the file's directory is a
/// real one, so this names the place the OS would find, in the words a user recognises).
fn lexical(p: &std::path::Path) -> std::path::PathBuf {
    use std::path::Component;
    let mut out = std::path::PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if matches!(out.components().next_back(), Some(Component::Normal(_))) => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// `message` (a parse error, which quotes the line at fault) without the values of the file's
/// `cluster_secret` and `credential` lines.
fn redact_secrets(text: &str, message: &str) -> String {
    let mut out = message.to_string();
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else { continue };
        if matches!(key.trim(), "cluster_secret" | "credential") {
            let value = value.trim();
            if !value.is_empty() {
                out = out.replace(value, "<redacted>");
            }
        }
    }
    out
}

/// An environment value as TOML (`5`, `true`, `[1, 2]`), else as a string (`2s`).
fn parse_value(v: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {v}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(v.to_string()))
}

fn set(table: &mut toml::Table, path: &[String], value: toml::Value) -> anyhow::Result<()> {
    let (last, parents) = path.split_last().expect("at least one part");
    let mut t = table;
    for p in parents {
        let entry = t.entry(p.clone()).or_insert_with(|| toml::Value::Table(Default::default()));
        t = entry.as_table_mut().with_context(|| format!("{p} is not a table"))?;
    }
    t.insert(last.clone(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    const FILE: &str = "[[nodes]]\nid = 1\naddr = \"127.0.0.1:7000\"\n[stream]\n";

    #[test]
    fn relative_paths_in_the_file_are_taken_from_its_directory_and_the_environment_from_the_working_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("c.toml");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let file = "data_dir = \"data\"\n[[nodes]]\nid = 1\naddr = \"127.0.0.1:7000\"\n\
                    [[nodes]]\nid = 2\naddr = \"127.0.0.1:7001\"\ndata_dir = \"/abs/two\"\n[stream]\n\
                    [checkpoint]\nremote = \"file://shared/remote\"\nrsync_password_file = \"pw\"\n\
                    [tls]\nca = \"certs/ca.pem\"\ncert = \"/etc/weir/node.pem\"\n";
        std::fs::write(&path, file).unwrap();
        let f = load(&path, []).unwrap();
        let sub = std::path::absolute(dir.path().join("sub")).unwrap();
        assert_eq!(f.data_dir, sub.join("data"));
        std::fs::write(&path, file.replace("data_dir = \"data\"", "data_dir = \"../up/./data\"")).unwrap();
        assert_eq!(load(&path, []).unwrap().data_dir, std::path::absolute(dir.path()).unwrap().join("up/data"));
        std::fs::write(&path, file.replace("data_dir = \"data\"\n", "")).unwrap();
        assert_eq!(load(&path, []).unwrap().data_dir, sub.join("weir-data"), "the default is beside the file");
        std::fs::write(&path, file).unwrap();
        assert_eq!(f.nodes[1].data_dir.as_deref(), Some(std::path::Path::new("/abs/two")), "absolute stays");
        assert_eq!(f.checkpoint.remote, Some(format!("file://{}", sub.join("shared/remote").display())));
        assert_eq!(f.checkpoint.rsync_password_file, Some(sub.join("pw")));
        let tls = f.tls.unwrap();
        assert_eq!((tls.ca, tls.cert), (sub.join("certs/ca.pem"), Some("/etc/weir/node.pem".into())));
        // Other schemes are not paths; the environment's paths are the working directory's.
        let env = [("WEIR_CHECKPOINT__REMOTE", "s3://b/p"), ("WEIR_DATA_DIR", "here")];
        let f = load(&path, env.map(|(k, v)| (k.to_string(), v.to_string()))).unwrap();
        assert_eq!((f.checkpoint.remote.as_deref(), f.data_dir), (Some("s3://b/p"), "here".into()));
        let rsync =
            "[[nodes]]\nid = 1\naddr = \"127.0.0.1:7000\"\n[stream]\n[checkpoint]\nremote = \"rsync://h/m/p\"\n";
        std::fs::write(&path, rsync).unwrap();
        assert_eq!(load(&path, []).unwrap().checkpoint.remote.as_deref(), Some("rsync://h/m/p"));
    }

    #[test]
    fn the_recovery_budget_is_a_duration_or_off_and_five_seconds_by_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let with = |line: &str| {
            std::fs::write(&path, format!("{FILE}[checkpoint]\n{line}\n")).unwrap();
            load(&path, []).map(|f| f.checkpoint.recovery_budget)
        };
        assert_eq!(with("").unwrap(), Some(std::time::Duration::from_secs(5)));
        assert_eq!(with("recovery_budget = \"750ms\"").unwrap(), Some(std::time::Duration::from_millis(750)));
        assert_eq!(with("recovery_budget = \"off\"").unwrap(), None);
        for bad in ["\"0s\"", "\"soon\"", "5"] {
            assert!(with(&format!("recovery_budget = {bad}")).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_table_of_the_file_can_be_set_from_the_environment_even_one_the_file_leaves_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, FILE).unwrap();
        let env = [("WEIR_CONTROL__ETCD", "http://127.0.0.1:2379"), ("WEIR_CONTROL__LEASE", "5s")];
        let f = load(&path, env.map(|(k, v)| (k.to_string(), v.to_string()))).unwrap();
        let c = f.control.expect("[control] from the environment");
        assert_eq!((c.etcd, c.lease), (vec!["http://127.0.0.1:2379".to_string()], std::time::Duration::from_secs(5)));
        // The file's tables, as serde sees them: each is a key the environment may name.
        let all = "cluster = \"c\"\ncluster_secret = \"0123456789abcdef\"\nclients = []\ncredential = \"a:b\"\n\
                   data_dir = \"d\"\nworkers = 1\npin_workers = false\nstate_budget = \"1M\"\n\
                   [[nodes]]\nid = 1\naddr = \"127.0.0.1:1\"\n[stream]\n[checkpoint]\n[restart]\n\
                   [tls]\nca = \"ca\"\n[control]\netcd = \"e\"\n";
        let table: toml::Table = toml::from_str(all).unwrap();
        toml::Value::Table(table.clone()).try_into::<ClusterFile>().unwrap();
        for key in table.keys().filter(|k| *k != "nodes") {
            assert!(TOP_KEYS.contains(&key.as_str()), "{key} cannot be set from the environment");
        }
    }

    #[test]
    fn secrets_from_the_environment_are_taken_as_they_are_and_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, FILE).unwrap();
        let env = [("WEIR_CLUSTER_SECRET", "0123456789012345"), ("WEIR_CREDENTIAL", "ops:00ff")];
        let f = load(&path, env.map(|(k, v)| (k.to_string(), v.to_string()))).unwrap();
        assert_eq!(f.secret().unwrap(), b"0123456789012345");
        assert_eq!(f.credential, Some(Secret("ops:00ff".into())));
        let shown = format!("{f:?}");
        assert!(!shown.contains("0123456789012345") && !shown.contains("00ff"), "{shown}");
        // A parse error quotes its line: not the secret on it.
        std::fs::write(&path, format!("cluster_secret = \"hunter2-secret\" oops\n{FILE}")).unwrap();
        let err = load(&path, []).unwrap_err().to_string();
        assert!(!err.contains("hunter2-secret") && err.contains("<redacted>"), "{err}");
    }
}
