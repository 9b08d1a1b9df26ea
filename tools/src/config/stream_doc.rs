//! A stream file (`weir stream create --file STREAM.toml`): a `[stream]` table as the cluster
//! file writes it, alone, which the stream catalog keeps as text. Its id is the catalog's to
//! assign; its name may come from the file or the command.

use anyhow::{Context, bail};
use serde::Deserialize;

use super::{ClusterFile, StreamFile};

/// The document: exactly a `[stream]` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamDoc {
    stream: StreamFile,
}

/// The `[stream]` table of `text` (unknown keys and a `stream.id` are errors).
pub fn parse_stream_doc(text: &str) -> anyhow::Result<StreamFile> {
    let table: toml::Table = toml::from_str(text).context("not a TOML document")?;
    if table.get("stream").and_then(|s| s.get("id")).is_some() {
        bail!("stream.id: the catalog assigns each stream its id; remove the line");
    }
    let doc: StreamDoc = toml::from_str(text).context("not a [stream] table of the cluster file's format")?;
    Ok(doc.stream)
}

impl ClusterFile {
    /// The stream of a catalog entry: its spec text as [`parse_stream_doc`] reads it, or (an
    /// empty text) this file's `[stream]` table, which seeded the catalog; with the entry's id
    /// and name, checked against this file's nodes.
    pub fn stream_of(&self, entry: &weir_engine::wire::msg::StreamEntry) -> anyhow::Result<StreamFile> {
        let mut s = if entry.spec.is_empty() {
            self.stream.clone()
        } else {
            parse_stream_doc(&entry.spec).with_context(|| format!("the spec of stream {}", entry.name))?
        };
        s.id = entry.id.0;
        s.name = Some(entry.name.clone());
        let nodes = self.nodes.iter().map(|n| n.id).collect();
        s.validate(&nodes).with_context(|| format!("the spec of stream {}", entry.name))?;
        Ok(s)
    }

    /// The name of the file's own stream (`stream-<id>` when it names none).
    pub fn stream_name(&self) -> String {
        self.stream.name.clone().unwrap_or_else(|| format!("stream-{}", self.stream.id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_file_is_a_stream_table_without_an_id() {
        let s = parse_stream_doc("[stream]\nname = \"m\"\npartitions = 3\nwindow = \"10s\"\n").unwrap();
        assert_eq!((s.name.as_deref(), s.partitions, s.window.as_secs()), (Some("m"), 3, 10));
        let e = parse_stream_doc("[stream]\nid = 4\n").unwrap_err();
        assert!(format!("{e:#}").contains("assigns each stream its id"), "{e:#}");
        let e = parse_stream_doc("[stream]\npartitons = 4\n").unwrap_err();
        assert!(format!("{e:#}").contains("partitons"), "{e:#}");
        let e = parse_stream_doc("[nodes]\n").unwrap_err();
        assert!(format!("{e:#}").contains("[stream] table"), "{e:#}");
    }
}
