//! Log floors: the lowest version of each ingest partition that a kept checkpoint's restore
//! can read, so that the nodes may delete their logs below it (`IngestService::truncate_below`).
//!
//! A restore of checkpoint `c` starts a source at the smaller of its own offset at `c` and the
//! replay starts of the aggs below it (each agg's replay point names the checkpoint its oldest
//! named window was born at, which the source's manifest maps to an offset; a resumed replay
//! names each output's offset instead). The floor of a source is the smallest such start over
//! every restore point retention keeps.
//!
//! Invariants:
//! - A floor is never above what a kept restore point needs: whatever cannot be read or looked
//!   up (a missing manifest, a replay start the source no longer remembers, a kept record that
//!   starts from nothing) gives floor 0 for the tasks it concerns, or no floor at all.
//! - Checkpoints in flight need no lower floor: an agg's oldest named window is born no earlier
//!   at a later checkpoint, and a source's offset only grows, until a restore, which restores a
//!   kept point.
//! - The record (`<stream>/ingest/floors`) is sealed text; a damaged one is an error, never
//!   read as some other floor.

use std::collections::BTreeMap;

use weir_wire::{CheckpointId, StreamId, TaskId, Version};

use super::{Manifest, Store, StoreError, seal, unseal};

/// What the manifests of the kept restore points say about where each task's input must start.
#[derive(Debug, Default)]
pub struct Needs {
    /// Per restore point: each task's manifest head (offsets), and the commit record's offsets.
    points: BTreeMap<CheckpointId, Point>,
    /// A kept record starts from nothing: every source starts at 0.
    fresh: bool,
}

#[derive(Debug, Default)]
struct Point {
    /// Per task: its offset, its offsets at recent checkpoints and per output during a replay.
    sources: BTreeMap<TaskId, Manifest>,
    /// The replay points of the aggs: (the checkpoint they start at, a resumed replay).
    replays: Vec<(CheckpointId, bool)>,
    /// The commit record's offsets by source task.
    recorded: BTreeMap<TaskId, Version>,
}

impl Needs {
    /// Nothing known yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A kept commit record that starts the stream from nothing.
    pub fn fresh(&mut self) {
        self.fresh = true;
    }

    /// Restore point `point` is kept; its commit record names `versions` (source offsets).
    pub fn point(&mut self, point: CheckpointId, versions: &BTreeMap<TaskId, Version>) {
        let p = self.points.entry(point).or_default();
        for (t, v) in versions {
            let at = p.recorded.entry(*t).or_insert(*v);
            *at = (*at).min(*v);
        }
    }

    /// Task `task`'s manifest at restore point `point` (ignored unless the point is kept).
    pub fn manifest(&mut self, point: CheckpointId, task: TaskId, m: Manifest) {
        let Some(p) = self.points.get_mut(&point) else { return };
        if let Some(r) = &m.replay {
            p.replays.push((r.from, r.resume));
        }
        // What a floor needs of it is the heads, not the file list.
        let head = Manifest { files: Vec::new(), ..m };
        p.sources.insert(task, head);
    }

    /// The floor of every task whose manifest every kept point has: the lowest version a
    /// restore of any of them reads. Empty when nothing is kept.
    pub fn floors(&self) -> BTreeMap<TaskId, Version> {
        let mut out: BTreeMap<TaskId, Version> = BTreeMap::new();
        let Some(first) = self.points.values().next() else { return out };
        for task in first.sources.keys() {
            let mut floor = Some(Version(u64::MAX));
            for p in self.points.values() {
                floor = match (floor, p.sources.get(task)) {
                    (Some(f), Some(m)) => Some(f.min(start(m, &p.replays, p.recorded.get(task).copied()))),
                    _ => None, // a kept point without the task's manifest: no floor for it
                };
            }
            if let Some(f) = floor {
                out.insert(*task, if self.fresh { Version(0) } else { f });
            }
        }
        out
    }
}

/// Where a restore of a source with manifest `m` starts reading, given the replay points of the
/// aggs at the same checkpoint (the smallest over all of them: conservative for a source that
/// feeds only some) and the commit record's offset for it.
fn start(m: &Manifest, replays: &[(CheckpointId, bool)], recorded: Option<Version>) -> Version {
    let offset_at = |id: CheckpointId| -> u64 {
        if id.0 == 0 {
            return 0;
        }
        m.offsets.iter().find(|(c, _)| *c == id).map_or(0, |(_, v)| v.0)
    };
    let mut v = m.version.0.min(recorded.map_or(u64::MAX, |r| r.0));
    for (from, resume) in replays {
        let at = match m.outputs.iter().find(|(c, _)| c == from) {
            Some((_, outs)) if *resume => outs.iter().copied().min().unwrap_or(0),
            _ => offset_at(*from),
        };
        v = v.min(at);
    }
    Version(v)
}

/// Key of a stream's log floors record.
pub fn floors_key(stream: StreamId) -> String {
    format!("{}/ingest/floors", stream.0)
}

/// Encodes floors by partition.
pub fn encode_floors(floors: &BTreeMap<u32, Version>) -> String {
    let mut s = "weir-log-floors 1\n".to_string();
    for (p, v) in floors {
        s.push_str(&format!("floor {p} {}\n", v.0));
    }
    seal(s)
}

/// Decodes and checks a floors record.
pub fn decode_floors(key: &str, bytes: &[u8]) -> Result<BTreeMap<u32, Version>, StoreError> {
    let bad = |why: &str| StoreError::Corrupt { key: key.into(), reason: why.into() };
    let body = unseal(key, bytes)?;
    let mut lines = body.lines();
    if lines.next() != Some("weir-log-floors 1") {
        return Err(bad("not a log floors record"));
    }
    let mut out = BTreeMap::new();
    for l in lines {
        let mut w = l.split(' ');
        match (w.next(), w.next().map(str::parse::<u32>), w.next().map(str::parse::<u64>), w.next()) {
            (Some("floor"), Some(Ok(p)), Some(Ok(v)), None) => {
                if out.insert(p, Version(v)).is_some() {
                    return Err(bad("a partition named twice"));
                }
            }
            _ => return Err(bad("bad floor line")),
        }
    }
    Ok(out)
}

/// The stream's log floors by partition (none when no record is stored).
pub fn read_floors(store: &dyn Store, stream: StreamId) -> Result<BTreeMap<u32, Version>, StoreError> {
    let key = floors_key(stream);
    match store.get_at_most(&key, super::MAX_RECORD) {
        Ok(bytes) => decode_floors(&key, &bytes),
        Err(StoreError::NotFound { .. }) => Ok(BTreeMap::new()),
        Err(e) => Err(e),
    }
}

/// Writes the stream's log floors.
pub fn write_floors(store: &dyn Store, stream: StreamId, floors: &BTreeMap<u32, Version>) -> Result<(), StoreError> {
    store.put(&floors_key(stream), encode_floors(floors).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::{LocalDirStore, ReplayPoint};

    fn source(id: u64, version: u64, offsets: &[(u64, u64)]) -> Manifest {
        Manifest {
            format: crate::backup::MANIFEST_FORMAT,
            id: CheckpointId(id),
            version: Version(version),
            files: Vec::new(),
            offsets: offsets.iter().map(|(c, v)| (CheckpointId(*c), Version(*v))).collect(),
            outputs: Vec::new(),
            replay: None,
        }
    }

    fn agg(id: u64, from: Option<u64>) -> Manifest {
        let replay = from.map(|f| ReplayPoint { from: CheckpointId(f), ..Default::default() });
        Manifest { replay, ..source(id, 0, &[]) }
    }

    fn kept(needs: &mut Needs, id: u64, src: Manifest, agg_from: Option<u64>) {
        needs.point(CheckpointId(id), &BTreeMap::new());
        needs.manifest(CheckpointId(id), TaskId(0), src);
        needs.manifest(CheckpointId(id), TaskId(1), agg(id, agg_from));
    }

    #[test]
    fn the_floor_is_the_oldest_replay_start_of_any_kept_point() {
        let mut needs = Needs::new();
        // Checkpoint 5 at offset 500, its agg replays from checkpoint 3 (offset 300); checkpoint 6
        // at 600 from checkpoint 4 (400).
        kept(&mut needs, 5, source(5, 500, &[(3, 300), (4, 400), (5, 500)]), Some(3));
        kept(&mut needs, 6, source(6, 600, &[(3, 300), (4, 400), (5, 500), (6, 600)]), Some(4));
        assert_eq!(needs.floors().get(&TaskId(0)), Some(&Version(300)));
    }

    #[test]
    fn full_snapshots_need_only_the_sources_offsets() {
        let mut needs = Needs::new();
        kept(&mut needs, 5, source(5, 500, &[(5, 500)]), None);
        kept(&mut needs, 6, source(6, 600, &[(5, 500), (6, 600)]), None);
        assert_eq!(needs.floors().get(&TaskId(0)), Some(&Version(500)));
    }

    #[test]
    fn a_replay_from_the_start_a_forgotten_start_or_a_fresh_record_keeps_everything() {
        for case in 0..3 {
            let mut needs = Needs::new();
            let from = match case {
                0 => Some(0),
                1 => Some(2), // the source no longer remembers checkpoint 2
                _ => None,
            };
            kept(&mut needs, 5, source(5, 500, &[(4, 400), (5, 500)]), from);
            if case == 2 {
                needs.fresh();
            }
            assert_eq!(needs.floors().get(&TaskId(0)), Some(&Version(0)), "case {case}");
        }
    }

    #[test]
    fn a_resumed_replay_starts_at_the_lowest_output_and_the_record_bounds_the_offset() {
        let mut needs = Needs::new();
        let mut m = source(7, 700, &[(6, 650), (7, 700)]);
        m.outputs = vec![(CheckpointId(7), vec![420, 380])];
        needs.point(CheckpointId(7), &[(TaskId(0), Version(690))].into());
        needs.manifest(CheckpointId(7), TaskId(0), m.clone());
        let resume = Manifest {
            replay: Some(ReplayPoint { from: CheckpointId(7), resume: true, ..Default::default() }),
            ..agg(7, None)
        };
        needs.manifest(CheckpointId(7), TaskId(1), resume);
        assert_eq!(needs.floors().get(&TaskId(0)), Some(&Version(380)));
        // No replay: the record's offset, lower than the manifest's, bounds it.
        let mut needs = Needs::new();
        needs.point(CheckpointId(7), &[(TaskId(0), Version(690))].into());
        needs.manifest(CheckpointId(7), TaskId(0), m);
        assert_eq!(needs.floors().get(&TaskId(0)), Some(&Version(690)));
    }

    #[test]
    fn a_task_missing_at_one_kept_point_gets_no_floor_and_nothing_kept_gives_none() {
        let mut needs = Needs::new();
        assert!(needs.floors().is_empty());
        kept(&mut needs, 5, source(5, 500, &[(5, 500)]), None);
        needs.point(CheckpointId(6), &BTreeMap::new());
        needs.manifest(CheckpointId(6), TaskId(1), agg(6, None));
        let f = needs.floors();
        assert!(!f.contains_key(&TaskId(0)), "{f:?}");
        // A manifest of a point not kept changes nothing.
        needs.manifest(CheckpointId(9), TaskId(0), source(9, 1, &[]));
        assert_eq!(needs.floors(), f);
    }

    #[test]
    fn floors_roundtrip_and_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirStore::new(dir.path());
        let s = StreamId(4);
        assert!(read_floors(&store, s).unwrap().is_empty());
        let floors: BTreeMap<u32, Version> = [(0, Version(10)), (3, Version(7))].into();
        write_floors(&store, s, &floors).unwrap();
        assert_eq!(read_floors(&store, s).unwrap(), floors);
        let text = encode_floors(&floors).replace("floor 3 7", "floor 3 9");
        store.put(&floors_key(s), text.as_bytes()).unwrap();
        assert!(matches!(read_floors(&store, s), Err(StoreError::Corrupt { .. })));
        let twice = seal("weir-log-floors 1\nfloor 1 2\nfloor 1 3\n".into());
        assert!(decode_floors("k", twice.as_bytes()).is_err());
    }
}
