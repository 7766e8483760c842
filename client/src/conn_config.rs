//! Connection settings, shared by both transports (`client`, `sentinel`).

use std::time::Duration;

/// Connection settings.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub connect_timeout: Duration,
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
