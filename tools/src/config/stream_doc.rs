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

/// The spec text `text` (a `[stream]` table) rescaled to `aggs` aggs and `sinks` sinks (0: as
/// it has): its aggs and sinks numbered past every task id it used (`first_agg_task`), and an
/// explicit placement that keeps its sources' nodes (their partitions' logs are there) with the
/// new aggs and sinks round robin over the nodes it names.
pub fn rescaled_doc(text: &str, aggs: u32, sinks: u32) -> anyhow::Result<String> {
    let old = parse_stream_doc(text)?;
    let mut doc: toml::Table = toml::from_str(text).context("not a TOML document")?;
    let table = doc.get_mut("stream").and_then(toml::Value::as_table_mut).context("no [stream] table")?;
    let aggs = if aggs == 0 { old.aggs } else { aggs };
    let sinks = if sinks == 0 { old.sinks } else { sinks };
    let first = u64::from(old.first_agg_task.unwrap_or(old.partitions)) + u64::from(old.aggs) + u64::from(old.sinks);
    let first =
        u32::try_from(first).ok().filter(|f| u64::from(*f) + u64::from(aggs) + u64::from(sinks) <= u64::from(u32::MAX));
    let first = first.context("the stream's task ids are used up: create it anew")?;
    table.insert("aggs".into(), i64::from(aggs).into());
    table.insert("sinks".into(), i64::from(sinks).into());
    table.insert("first_agg_task".into(), i64::from(first).into());
    if let super::PlacementFile::Explicit(m) = &old.placement
        && !m.is_empty()
    {
        let mut nodes: Vec<u32> = m.values().copied().collect();
        nodes.sort_unstable();
        nodes.dedup();
        let mut p = toml::Table::new();
        for (t, n) in m {
            if t.parse::<u32>().is_ok_and(|t| t < old.partitions) {
                p.insert(t.clone(), i64::from(*n).into());
            }
        }
        for (i, t) in (first..first + aggs + sinks).enumerate() {
            p.insert(t.to_string(), i64::from(nodes[i % nodes.len()]).into());
        }
        table.insert("placement".into(), p.into());
    }
    toml::to_string(&doc).context("writing the rescaled spec")
}

#[cfg(test)]
mod rescale_tests {
    use super::*;

    #[test]
    fn a_rescaled_spec_numbers_new_tasks_past_the_old_and_keeps_the_sources_nodes() {
        let text = "[stream]\nname = \"m\"\npartitions = 2\naggs = 2\nsinks = 1\nplacement = { \"0\" = 2, \"1\" = 3, \"2\" = 2 }\n";
        let five = parse_stream_doc(&rescaled_doc(text, 5, 0).unwrap()).unwrap();
        assert_eq!((five.aggs, five.sinks, five.first_agg_task), (5, 1, Some(5)));
        let super::super::PlacementFile::Explicit(p) = &five.placement else { panic!("{:?}", five.placement) };
        assert_eq!((p["0"], p["1"]), (2, 3), "sources stay with their logs");
        assert!(!p.contains_key("2") && !p.contains_key("4"), "old aggs and sinks are gone: {p:?}");
        assert_eq!((5..11).map(|t| p[&t.to_string()]).collect::<Vec<_>>(), vec![2, 3, 2, 3, 2, 3]);
        let one = parse_stream_doc(&rescaled_doc(&rescaled_doc(text, 5, 0).unwrap(), 1, 0).unwrap()).unwrap();
        assert_eq!((one.aggs, one.first_agg_task), (1, Some(11)));
    }
}
