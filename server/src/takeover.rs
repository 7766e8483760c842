//! A connection handed from the command loop to something else and back: `SUBSCRIBE`
//! turns a command connection into a subscriber, which returns the stream when the last
//! subscription goes. Its own module so that the command layer (which asks for the
//! takeover), the subscriber (which runs it) and the server (which hands the stream over)
//! share the contract without depending on each other.
#![warn(missing_docs)]

use std::future::Future;
use std::pin::Pin;

use bytes::BytesMut;
use tokio::net::TcpStream;

use crate::protocol::Refusal;

/// What runs the connection after the command's reply is sent (see
/// `cmd::Outcome::takeover`).
pub type Takeover =
    Box<dyn FnOnce(TcpStream, BytesMut) -> Pin<Box<dyn Future<Output = Handback> + Send>> + Send>;

/// How a [`Takeover`] ends.
pub enum Handback {
    /// The connection takes commands again, with what the client sent meanwhile.
    Resume(TcpStream, BytesMut),
    /// The client broke a framing limit. The connection answers and closes it as it does
    /// for a command connection (one place: the server's connection loop).
    Refused(TcpStream, Refusal),
    /// The connection is over (the client left or quit, or a write failed).
    Closed,
}
