//! stockgate server library: the embeddable reservation engine, its write-ahead log and
//! the RESP server that exposes it.
pub mod engine;
