//! A test double for the backup layer's unit tests: a local-directory store whose puts go
//! through a hook (fail, hold, or store and then fail), everything else straight through.

use super::{LocalDirStore, Store, StoreError};

type PutHook = Box<dyn Fn(&LocalDirStore, &str, &[u8]) -> Result<(), StoreError> + Send + Sync>;

/// A [`LocalDirStore`] with a hook on `put` (and `put_file`, which reads the file and puts it).
pub(crate) struct HookedStore {
    inner: LocalDirStore,
    put: PutHook,
}

impl HookedStore {
    /// `inner`, whose puts call `put(inner, key, bytes)` instead.
    pub(crate) fn new(
        inner: LocalDirStore,
        put: impl Fn(&LocalDirStore, &str, &[u8]) -> Result<(), StoreError> + Send + Sync + 'static,
    ) -> Self {
        Self { inner, put: Box::new(put) }
    }
}

impl std::fmt::Debug for HookedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HookedStore").field("inner", &self.inner).finish_non_exhaustive()
    }
}

impl Store for HookedStore {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        (self.put)(&self.inner, key, bytes)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.inner.get(key)
    }
    fn size(&self, key: &str) -> Result<Option<u64>, StoreError> {
        self.inner.size(key)
    }
    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        self.inner.list(prefix)
    }
    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.inner.delete(key)
    }
}
