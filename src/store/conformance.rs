//! The storage conformance suite: written once, run against every backend.
//! (Filled in with the SQLite backend.)
