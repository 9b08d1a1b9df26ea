//! The stream catalog: the streams a cluster runs, as the control plane keeps them
//! ([`Catalog`]), and the requests that read and change it ([`CatalogReq`] for anyone who may
//! read, [`CatalogChangeReq`] for admins; both answered by [`CatalogRsp`]).
//!
//! Every catalog read from a store or a socket is checked before use: names, spec texts and the
//! number of streams are bounded ([`MAX_STREAMS`], [`MAX_SPEC_TEXT`]), the names of the streams
//! kept (not dropping) are unique, ids are unique and below `next_id`.

use super::*;

/// Streams a catalog holds at most.
pub const MAX_STREAMS: usize = 64;

/// Longest stream spec text (bytes): a `[stream]` table, as TOML.
pub const MAX_SPEC_TEXT: usize = 16 << 10;

/// Most aggs or sinks a rescale asks for (a stream's own bound on its tasks is the engine's).
pub const MAX_RESCALE: usize = 4096;
/// Longest stream name (bytes).
pub const MAX_STREAM_NAME: usize = 64;

/// Whether `name` is a stream name: 1 to [`MAX_STREAM_NAME`] ASCII letters, digits, `-` or `_`,
/// starting with a letter (it names directories and store prefixes).
pub fn valid_stream_name(name: &str) -> bool {
    name.len() <= MAX_STREAM_NAME
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

archived! {
    /// What a stream of the catalog is doing.
    #[derive(Copy, Eq)]
    pub enum StreamState {
        /// Its nodes run it.
        Running,
        /// Dropped at `since_ms` (ms since the epoch): its tasks stop and its nodes remove its
        /// data; the entry goes once they have.
        Dropping {
            /// When the drop was asked for.
            since_ms: u64,
        },
        /// Paused at `since_ms` (ms since the epoch): its tasks stop after one more checkpoint
        /// and free their workers; its partitions still take appends, which wait in the log.
        Paused {
            /// When the pause was asked for.
            since_ms: u64,
        },
    }
}

impl StreamState {
    /// Whether the stream stays (running or paused), not dropped.
    pub fn is_kept(&self) -> bool {
        !matches!(self, StreamState::Dropping { .. })
    }
}

archived! {
    /// One stream of the catalog.
    pub struct StreamEntry {
        /// Its id (assigned by the catalog, never reused).
        pub id: StreamId,
        /// Its name (unique in the catalog).
        pub name: String,
        /// What it is doing.
        pub state: StreamState,
        /// Its spec: a `[stream]` table as TOML (the cluster file's format).
        pub spec: String,
        /// When it was created (ms since the epoch).
        pub created_ms: u64,
    }
}

archived! {
    /// The stream catalog as the control plane stores it.
    pub struct Catalog {
        /// Which catalog this is: drawn at random as a cluster's catalog is first written, and
        /// kept by every change (a node refuses a catalog of another lineage than it has seen:
        /// one that was lost and written anew).
        pub lineage: u64,
        /// The id the next stream created takes.
        pub next_id: u64,
        /// The streams, by id.
        pub streams: Vec<StreamEntry>,
    }
}

/// A catalog (from a store or a [`CatalogRsp`]) that breaks an invariant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogCheckError {
    /// More than [`MAX_STREAMS`] streams.
    #[error("{count} streams (at most {MAX_STREAMS})")]
    TooMany { count: usize },
    /// A name that is not one ([`valid_stream_name`]).
    #[error("stream name {name:?} is not 1 to {MAX_STREAM_NAME} letters, digits, '-' or '_' starting with a letter")]
    Name { name: String },
    /// A spec text past [`MAX_SPEC_TEXT`].
    #[error("stream {name}: spec of {len} bytes (at most {MAX_SPEC_TEXT})")]
    SpecText { name: String, len: usize },
    /// Two streams of one id, or two kept (not dropping) of one name, or ids not in order.
    #[error("stream {name}: its id {id} or name repeats, or ids are out of order")]
    Repeated { name: String, id: u64 },
    /// An id at or above the next id to assign.
    #[error("stream {name}: id {id} is not below the next id {next}")]
    Unassigned { name: String, id: u64, next: u64 },
}

/// Checks the catalog's invariants (see the module docs).
pub fn check_catalog(c: &ArchivedCatalog) -> Result<(), CatalogCheckError> {
    if c.streams.len() > MAX_STREAMS {
        return Err(CatalogCheckError::TooMany { count: c.streams.len() });
    }
    let next = c.next_id.to_native();
    let mut last: Option<u64> = None;
    for (i, s) in c.streams.iter().enumerate() {
        let (name, id) = (s.name.as_str(), s.id.0.to_native());
        if !valid_stream_name(name) {
            return Err(CatalogCheckError::Name { name: name.into() });
        }
        if s.spec.len() > MAX_SPEC_TEXT {
            return Err(CatalogCheckError::SpecText { name: name.into(), len: s.spec.len() });
        }
        // A dropped name may be created again while the old stream's entry waits out its grace.
        let kept = |s: &ArchivedStreamEntry| !matches!(s.state, ArchivedStreamState::Dropping { .. });
        let taken = kept(s) && c.streams.iter().take(i).any(|o| o.name.as_str() == name && kept(o));
        if last.is_some_and(|l| l >= id) || taken {
            return Err(CatalogCheckError::Repeated { name: name.into(), id });
        }
        if id >= next {
            return Err(CatalogCheckError::Unassigned { name: name.into(), id, next });
        }
        last = Some(id);
    }
    Ok(())
}

archived! {
    /// Client → node: the catalog, or one stream of it (`name`; empty: every stream).
    pub struct CatalogReq {
        /// Echoed in the response.
        pub request: u64,
        /// The stream wanted (empty: all).
        pub name: String,
    }
}

archived! {
    /// A change to the catalog.
    pub enum CatalogChange {
        /// Creates a stream of this name from a spec text (a `[stream]` table, as TOML).
        Create {
            /// Its name.
            name: String,
            /// Its spec.
            spec: String,
        },
        /// Drops the stream of this name.
        Drop {
            /// Its name.
            name: String,
        },
        /// Pauses the running stream of this name (its state and offsets kept).
        Pause {
            /// Its name.
            name: String,
        },
        /// Resumes the paused stream of this name from where it paused.
        Resume {
            /// Its name.
            name: String,
        },
        /// Gives the paused stream of this name other parallelism: it resumes from its
        /// savepoint with `aggs` aggs and `sinks` sinks (0: as it has).
        Rescale {
            /// Its name.
            name: String,
            /// Aggs (0: as it has).
            aggs: u32,
            /// Sinks (0: as it has).
            sinks: u32,
        },
        /// Stops the stream of this name at a savepoint (Flink's stop-with-savepoint): a pause
        /// answered once in effect whose last commit is a savepoint, refused (the stream stays
        /// paused) when it has none. A resume or a rescale starts it again.
        Stop {
            /// Its name.
            name: String,
        },
    }
}

archived! {
    /// Client (admin) → node: change the catalog; answered once the change has taken effect on
    /// this node (a created stream has started here, a dropped one has stopped and its data
    /// here is gone).
    pub struct CatalogChangeReq {
        /// Echoed in the response.
        pub request: u64,
        /// The change.
        pub change: CatalogChange,
    }
}

archived! {
    /// Why a catalog request was not carried out.
    pub enum CatalogRefusal {
        /// The request cannot succeed as it is (an unknown or taken name, a bad spec, a full
        /// catalog, a node that keeps no catalog): fatal.
        Invalid {
            /// Why.
            reason: String,
        },
        /// The control plane did not answer, or the change did not take effect in time:
        /// retryable (a change may have been applied; read the catalog before trying again).
        Unavailable {
            /// Why.
            reason: String,
        },
    }
}

archived! {
    /// Node → client: the answer to a [`CatalogReq`] or a [`CatalogChangeReq`].
    pub struct CatalogRsp {
        /// The request this answers.
        pub request: u64,
        /// Answering node.
        pub node: NodeId,
        /// The streams asked for (after the change, for a change), by id.
        pub streams: Vec<StreamEntry>,
        /// Why the request was not carried out (`None`: it was).
        pub refused: Option<CatalogRefusal>,
    }
}

/// The first bytes of a stored catalog (format 1).
const CATALOG_MAGIC: &[u8; 8] = b"WEIRCAT1";

/// Why stored catalog bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogDecodeError {
    /// Not a catalog, or one of a format this build does not read.
    #[error("not a stream catalog of format 1")]
    Format,
    /// The checksum does not match: the bytes were damaged.
    #[error("checksum mismatch")]
    Checksum,
    /// Not a valid archive.
    #[error("not a valid catalog archive: {0}")]
    Archive(String),
    /// A valid archive breaking an invariant.
    #[error(transparent)]
    Invalid(#[from] CatalogCheckError),
}

impl Catalog {
    /// The catalog as stored: magic, CRC-32C of the archive, the archive.
    pub fn encode(&self) -> Vec<u8> {
        let archive = rkyv::to_bytes::<rkyv::rancor::Error>(self).expect("a catalog always serializes");
        let mut out = Vec::with_capacity(12 + archive.len());
        out.extend_from_slice(CATALOG_MAGIC);
        out.extend_from_slice(&crc32c::crc32c(&archive).to_le_bytes());
        out.extend_from_slice(&archive);
        out
    }

    /// A catalog read back from a store: checked (format, checksum, archive, invariants)
    /// before anything of it is used.
    pub fn decode(bytes: &[u8]) -> Result<Catalog, CatalogDecodeError> {
        let rest = bytes.strip_prefix(CATALOG_MAGIC).ok_or(CatalogDecodeError::Format)?;
        let (crc, archive) = rest.split_first_chunk::<4>().ok_or(CatalogDecodeError::Format)?;
        if crc32c::crc32c(archive) != u32::from_le_bytes(*crc) {
            return Err(CatalogDecodeError::Checksum);
        }
        let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(archive.len());
        aligned.extend_from_slice(archive);
        let a = rkyv::access::<ArchivedCatalog, rkyv::rancor::Error>(&aligned)
            .map_err(|e| CatalogDecodeError::Archive(e.to_string()))?;
        check_catalog(a)?;
        rkyv::deserialize::<Catalog, rkyv::rancor::Error>(a).map_err(|e| CatalogDecodeError::Archive(e.to_string()))
    }
}

/// The checks of a [`CatalogReq`]: a name no longer than a stream's (what it is, the node
/// checks and answers).
pub(super) fn check_catalog_req(m: &ArchivedCatalogReq) -> Result<(), CheckError> {
    bounded("stream name", m.name.len(), MAX_STREAM_NAME)
}

/// The checks of a [`CatalogChangeReq`]: a name and a spec no longer than a catalog keeps.
pub(super) fn check_catalog_change(m: &ArchivedCatalogChangeReq) -> Result<(), CheckError> {
    match &m.change {
        ArchivedCatalogChange::Create { name, spec } => {
            bounded("stream name", name.len(), MAX_STREAM_NAME)?;
            bounded("stream spec", spec.len(), MAX_SPEC_TEXT)
        }
        ArchivedCatalogChange::Drop { name }
        | ArchivedCatalogChange::Pause { name }
        | ArchivedCatalogChange::Resume { name }
        | ArchivedCatalogChange::Stop { name } => bounded("stream name", name.len(), MAX_STREAM_NAME),
        ArchivedCatalogChange::Rescale { name, aggs, sinks } => {
            bounded("stream name", name.len(), MAX_STREAM_NAME)?;
            bounded("aggs", aggs.to_native() as usize, MAX_RESCALE)?;
            bounded("sinks", sinks.to_native() as usize, MAX_RESCALE)
        }
    }
}

fn bounded(what: &str, len: usize, max: usize) -> Result<(), CheckError> {
    if len > max {
        return Err(CheckError::Archive(format!("{what} of {len} bytes (at most {max})")));
    }
    Ok(())
}

/// The checks of a [`CatalogRsp`]: as many streams as a catalog holds, each a valid entry.
pub(super) fn check_catalog_rsp(m: &ArchivedCatalogRsp) -> Result<(), CheckError> {
    if m.streams.len() > MAX_STREAMS {
        return Err(CheckError::Archive(format!("{} streams (at most {MAX_STREAMS})", m.streams.len())));
    }
    match m.streams.iter().find(|s| !valid_stream_name(&s.name) || s.spec.len() > MAX_SPEC_TEXT) {
        Some(s) => Err(CheckError::Archive(format!("stream {:?}: a bad name or too long a spec", s.name.as_str()))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64, name: &str) -> StreamEntry {
        StreamEntry {
            id: StreamId(id),
            name: name.into(),
            state: StreamState::Running,
            spec: "partitions = 2\n".into(),
            created_ms: 7,
        }
    }

    #[test]
    fn a_catalog_roundtrips_through_its_stored_form() {
        let c = Catalog {
            lineage: 9,
            next_id: 6,
            streams: vec![
                entry(1, "bench"),
                StreamEntry { state: StreamState::Dropping { since_ms: 9 }, ..entry(3, "b") },
                StreamEntry { state: StreamState::Paused { since_ms: 11 }, ..entry(5, "c") },
            ],
        };
        assert_eq!(Catalog::decode(&c.encode()), Ok(c));
    }

    #[test]
    fn damaged_or_foreign_bytes_are_refused() {
        let c = Catalog { lineage: 9, next_id: 2, streams: vec![entry(1, "bench")] };
        let mut bytes = c.encode();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        assert_eq!(Catalog::decode(&bytes), Err(CatalogDecodeError::Checksum));
        assert_eq!(Catalog::decode(b"WEIRCAT2xxxx"), Err(CatalogDecodeError::Format));
        assert_eq!(Catalog::decode(b"WEIRCAT1"), Err(CatalogDecodeError::Format));
        // A valid checksum over bytes that are no archive.
        let mut forged = b"WEIRCAT1".to_vec();
        forged.extend_from_slice(&crc32c::crc32c(&[1, 2, 3]).to_le_bytes());
        forged.extend_from_slice(&[1, 2, 3]);
        assert!(matches!(Catalog::decode(&forged), Err(CatalogDecodeError::Archive(_))));
    }

    #[test]
    fn a_catalog_breaking_an_invariant_is_refused() {
        let bad = |c: Catalog| Catalog::decode(&c.encode());
        let dup = Catalog { lineage: 9, next_id: 5, streams: vec![entry(1, "a"), entry(2, "a")] };
        assert!(matches!(bad(dup), Err(CatalogDecodeError::Invalid(CatalogCheckError::Repeated { .. }))));
        // One dropping, one kept: a dropped name created again.
        let again = Catalog {
            lineage: 9,
            next_id: 5,
            streams: vec![StreamEntry { state: StreamState::Dropping { since_ms: 1 }, ..entry(1, "a") }, entry(2, "a")],
        };
        assert!(bad(again).is_ok());
        let order = Catalog { lineage: 9, next_id: 5, streams: vec![entry(2, "a"), entry(1, "b")] };
        assert!(matches!(bad(order), Err(CatalogDecodeError::Invalid(CatalogCheckError::Repeated { .. }))));
        let ahead = Catalog { lineage: 9, next_id: 2, streams: vec![entry(2, "a")] };
        assert!(matches!(bad(ahead), Err(CatalogDecodeError::Invalid(CatalogCheckError::Unassigned { .. }))));
        let name = Catalog { lineage: 9, next_id: 2, streams: vec![entry(1, "../x")] };
        assert!(matches!(bad(name), Err(CatalogDecodeError::Invalid(CatalogCheckError::Name { .. }))));
        let long = Catalog {
            lineage: 9,
            next_id: 2,
            streams: vec![StreamEntry { spec: "x".repeat(MAX_SPEC_TEXT + 1), ..entry(1, "a") }],
        };
        assert!(matches!(bad(long), Err(CatalogDecodeError::Invalid(CatalogCheckError::SpecText { .. }))));
        let many = Catalog {
            lineage: 9,
            next_id: 100,
            streams: (1..=MAX_STREAMS as u64 + 1).map(|i| entry(i, &format!("s{i}"))).collect(),
        };
        assert!(matches!(bad(many), Err(CatalogDecodeError::Invalid(CatalogCheckError::TooMany { .. }))));
    }

    #[test]
    fn catalog_requests_past_a_catalogs_bounds_are_refused_as_frames() {
        use crate::frame::FrameEncoder;
        let check = |f: crate::frame::EncodedFrame| -> Result<(), crate::frame::FrameError> {
            let frame = crate::frame::decode_one(f.as_bytes(), crate::frame::DEFAULT_MAX_FRAME)?;
            frame.message().map(|_| ())
        };
        let long = "a".repeat(MAX_STREAM_NAME + 1);
        let mut enc = FrameEncoder::new();
        assert!(check(enc.encode(&CatalogReq { request: 1, name: "a".repeat(MAX_STREAM_NAME) }).unwrap()).is_ok());
        assert!(check(enc.encode(&CatalogReq { request: 1, name: long.clone() }).unwrap()).is_err());
        let create =
            |name: String, spec: String| CatalogChangeReq { request: 1, change: CatalogChange::Create { name, spec } };
        assert!(check(enc.encode(&create("a".into(), "x".repeat(MAX_SPEC_TEXT))).unwrap()).is_ok());
        assert!(check(enc.encode(&create("a".into(), "x".repeat(MAX_SPEC_TEXT + 1))).unwrap()).is_err());
        assert!(check(enc.encode(&create(long.clone(), "x".into())).unwrap()).is_err());
        let drop = CatalogChangeReq { request: 1, change: CatalogChange::Drop { name: long.clone() } };
        assert!(check(enc.encode(&drop).unwrap()).is_err());
        let pause = CatalogChangeReq { request: 1, change: CatalogChange::Pause { name: long.clone() } };
        assert!(check(enc.encode(&pause).unwrap()).is_err());
        let resume = CatalogChangeReq { request: 1, change: CatalogChange::Resume { name: long.clone() } };
        assert!(check(enc.encode(&resume).unwrap()).is_err());
        let stop = CatalogChangeReq { request: 1, change: CatalogChange::Stop { name: long } };
        assert!(check(enc.encode(&stop).unwrap()).is_err());
        let ok = CatalogChangeReq { request: 1, change: CatalogChange::Pause { name: "a".into() } };
        assert!(check(enc.encode(&ok).unwrap()).is_ok());
    }

    #[test]
    fn stream_names_are_bounded_and_safe_as_paths() {
        for good in ["bench", "a", "meters_1m", "s-2"] {
            assert!(valid_stream_name(good), "{good}");
        }
        for bad in ["", "1x", "-x", "a/b", "..", "a b", "é", &"a".repeat(MAX_STREAM_NAME + 1)] {
            assert!(!valid_stream_name(bad), "{bad}");
        }
    }
}
