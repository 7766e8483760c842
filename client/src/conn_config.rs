//! Connection settings, shared by both transports (`client`, `sentinel`).

use std::time::Duration;

/// Connection settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// How long opening a connection may take before it fails.
    pub connect_timeout: Duration,
    /// How long a command may wait for its reply before it fails (a reply lost to a dead server
    /// shows as this timeout).
    pub response_timeout: Duration,
    /// Reconnection attempts per failure inside the connection manager.
    pub reconnect_retries: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(10),
            reconnect_retries: 3,
        }
    }
}
