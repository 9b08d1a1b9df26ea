//! Operators: pure data transformations with no threads or I/O of their own. The runtime drives
//! them; the checkpoint protocol moves their state in and out of the state store.

pub mod generator;
pub mod window;
