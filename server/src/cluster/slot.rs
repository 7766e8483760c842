//! Redis Cluster's hash slot of a key: CRC16-XMODEM of the key (or of its hash tag) mod
//! 16384. Moved to the core (`stockgate_core::slot`, with its tests) so that the client and
//! the tools compute slots without linking the server; this path stays for server code.

pub use stockgate_core::slot::{crc16, hash_tag, key_slot, SLOTS};
