//! The composition root: what the `stockgate` binary runs, assembled from the library's
//! parts. The binary parses its flags into a [`Config`] and calls [`run`] (or, for its
//! other subcommands, [`mint::mint`] and [`top::top`]). Nothing else in the library
//! imports this module: it is the top layer.
//!
//! - [`config`]: the settings, what follows from them, the checks across flags.
//! - `recover`: the keys, and the engine rebuilt from the data dir.
//! - `single`, `raft`, `cluster`: what a single node, a Raft group member and cluster
//!   mode each add to the start.
//! - [`feed`], `tls`, `shared`: the order feed, the TLS port, the state every connection
//!   shares (built with its parts in place). `feed` is public for the simulation
//!   (`sim/`), which builds a member's feed and its snapshots' hold with it.
//! - `listen`, `run`: the listeners; the start, the background tasks, the shutdown.

mod cluster;
pub mod config;
pub mod feed;
mod listen;
pub mod mint;
mod raft;
mod recover;
mod run;
mod shared;
mod single;
mod tls;
#[cfg(feature = "tui")]
pub mod top;

pub use config::{
    ClientLimits, ClusterSettings, Config, KeyFiles, Listen, MetricsSettings, RaftSettings,
    WalSettings,
};
pub use run::run;
