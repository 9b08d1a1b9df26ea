//! Reading the cluster file: the TOML file, then the `WEIR_*` variables over it, with errors that
//! name the key and the line and never quote a secret.

use anyhow::Context;

use super::ClusterFile;

/// Top-level keys: the environment variables that are config (`WEIR_<KEY>` or `WEIR_<KEY>__…`).
const TOP_KEYS: &[&str] = &[
    "cluster",
    "cluster_secret",
    "clients",
    "credential",
    "coordinator",
    "data_dir",
    "workers",
    "pin_workers",
    "state_budget",
    "stream",
    "checkpoint",
    "restart",
    "tls",
];

/// Reads `path`, then applies the `WEIR_*` variables of `env`.
pub fn load(path: &std::path::Path, env: impl IntoIterator<Item = (String, String)>) -> anyhow::Result<ClusterFile> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading the config file {}", path.display()))?;
    // The file alone first: its errors name the key and the line.
    toml::from_str::<ClusterFile>(&text)
        .map_err(|e| anyhow::anyhow!("{}: {}", path.display(), redact_secrets(&text, e.to_string().trim())))?;
    let mut table: toml::Table = toml::from_str(&text).expect("parsed above");
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
