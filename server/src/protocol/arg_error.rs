//! The typed error of one bad command argument. It lives with the protocol, beside the
//! one place errors become replies (`reply::from_arg_error`); `cmd::args` produces it.

use thiserror::Error;

/// What is wrong with one argument. Each message names the argument and what it accepts,
/// in words; [`super::reply::from_arg_error`] puts the `ERR` code in front.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ArgError {
    /// Not digits at all (`two`, `1.5`, `10^30`, empty).
    #[error("{field} is not an integer (must be between {min} and {max})")]
    NotInteger {
        /// The argument's name, as the message shows it.
        field: &'static str,
        /// Smallest accepted value.
        min: i128,
        /// Largest accepted value.
        max: i128,
    },
    /// An integer, but outside the accepted range (also one too long for any integer type).
    #[error("{field} must be between {min} and {max}")]
    OutOfRange {
        /// The argument's name, as the message shows it.
        field: &'static str,
        /// Smallest accepted value.
        min: i128,
        /// Largest accepted value.
        max: i128,
    },
    /// Bytes that are not UTF-8 where text is expected.
    #[error("invalid {field}: must be UTF-8 text")]
    NotText {
        /// The argument's name, as the message shows it.
        field: &'static str,
    },
    /// A malformed identifier; the message states the identifier's rule.
    #[error("{}", crate::engine::ident::invalid_message(field))]
    Invalid {
        /// The argument's name, as the message shows it.
        field: &'static str,
    },
    /// A keyword argument that takes one of a few words.
    #[error("{field} must be one of {accepted}")]
    NotOneOf {
        /// The argument's name, as the message shows it.
        field: &'static str,
        /// The accepted words, as the message lists them.
        accepted: &'static str,
    },
}
