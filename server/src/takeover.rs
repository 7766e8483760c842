//! A connection handed from the command loop to something else and back: `SUBSCRIBE`
//! turns a command connection into a subscriber, which gives the connection back when
//! the last subscription goes. Its own module so that the command layer (which asks for
//! the takeover), the subscriber (which runs it) and the server (which lends the stream)
//! share the contract without depending on each other.

use std::future::Future;
use std::pin::Pin;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::protocol::Refusal;

/// A client connection's byte stream, plain TCP or TLS alike.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// What runs the connection after the command's reply is sent (see
/// `cmd::Outcome::takeover`). It borrows the stream for as long as it runs; the read
/// buffer (what the client sent after the command) is handed over and back.
pub type Takeover = Box<
    dyn for<'a> FnOnce(
            &'a mut dyn Io,
            BytesMut,
        ) -> Pin<Box<dyn Future<Output = Handback> + Send + 'a>>
        + Send,
>;

/// Boxes a takeover (a closure's higher-ranked signature is only inferred where the
/// bound names it, as here).
pub fn takeover<F>(f: F) -> Takeover
where
    F: for<'a> FnOnce(
            &'a mut dyn Io,
            BytesMut,
        ) -> Pin<Box<dyn Future<Output = Handback> + Send + 'a>>
        + Send
        + 'static,
{
    Box::new(f)
}

/// How a [`Takeover`] ends.
pub enum Handback {
    /// The connection takes commands again, with what the client sent meanwhile.
    Resume(BytesMut),
    /// The client broke a framing limit. The connection answers and closes it as it does
    /// for a command connection (one place: the server's connection loop).
    Refused(Refusal),
    /// The connection is over (the client left or quit, or a write failed).
    Closed,
}
