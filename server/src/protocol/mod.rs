//! RESP on the wire: parse request frames into argument lists, encode replies. Knows
//! nothing of stock.
pub mod arg_error;
pub mod frame;
pub mod reply;

pub use frame::{
    parse_command, parse_command_into, parse_frame, Frame, Limits, Parsed, ProtocolError, Refusal,
};
pub use reply::Reply;
