//! The one error type: every way a datagram can fail to yield an SNI.

use std::fmt;

/// Why no SNI came out of a datagram. A gateway drops the connection and counts the kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// The datagram ends inside a field (`what` names it).
    Truncated(&'static str),
    /// A short-header (1-RTT) packet: nothing to read without the connection's keys.
    ShortHeader,
    /// A long-header packet of a version this crate has no Initial keys for (RFC 8999 invariants hold).
    UnsupportedVersion(u32),
    /// Version 0: a Version Negotiation packet (RFC 9000 section 17.2.1); a client never sends one.
    VersionNegotiation,
    /// A long-header packet that is not an Initial (0-RTT, Handshake, Retry) and no Initial came before it.
    NotInitial,
    /// The fixed bit (0x40) is clear: not QUIC v1/v2 (RFC 9000 section 17.2).
    FixedBitClear,
    /// A connection ID over 20 bytes (RFC 9000 section 17.2).
    ConnectionIdTooLong(usize),
    /// A client Initial in a datagram under 1,200 bytes (RFC 9000 section 14.1).
    DatagramTooSmall(usize),
    /// AEAD authentication failed with the Initial keys: not a client Initial, or corrupted.
    DecryptFailed,
    /// A frame type a client Initial may not carry (RFC 9000 section 17.2.2), or a malformed frame.
    BadFrame(u64),
    /// The CRYPTO stream would grow past the configured bound.
    CryptoTooLarge(u64),
    /// The first handshake message is not a ClientHello.
    NotClientHello(u8),
    /// The ClientHello does not parse (`what` names the field).
    MalformedClientHello(&'static str),
    /// A ClientHello without a server_name extension.
    NoServerName,
    /// A server_name that is not a host name (RFC 6066 section 3).
    BadServerName,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated(what) => write!(f, "truncated in {what}"),
            Error::ShortHeader => write!(f, "short header packet"),
            Error::UnsupportedVersion(v) => write!(f, "unsupported QUIC version {v:#010x}"),
            Error::VersionNegotiation => write!(f, "version negotiation packet"),
            Error::NotInitial => write!(f, "long header packet is not an Initial"),
            Error::FixedBitClear => write!(f, "fixed bit clear"),
            Error::ConnectionIdTooLong(n) => write!(f, "connection ID of {n} bytes"),
            Error::DatagramTooSmall(n) => write!(f, "client Initial in a {n}-byte datagram"),
            Error::DecryptFailed => write!(f, "Initial packet does not decrypt"),
            Error::BadFrame(t) => write!(f, "frame type {t:#x} not allowed or malformed in Initial"),
            Error::CryptoTooLarge(n) => write!(f, "CRYPTO stream past {n} bytes"),
            Error::NotClientHello(t) => write!(f, "handshake message type {t} is not ClientHello"),
            Error::MalformedClientHello(what) => write!(f, "malformed ClientHello: {what}"),
            Error::NoServerName => write!(f, "ClientHello has no server_name"),
            Error::BadServerName => write!(f, "server_name is not a host name"),
        }
    }
}

impl std::error::Error for Error {}

impl Error {
    /// A short, stable name for counters (`aether_quic_sni_dropped_total{reason=...}`).
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Truncated(_) => "truncated",
            Error::ShortHeader => "short_header",
            Error::UnsupportedVersion(_) => "unsupported_version",
            Error::VersionNegotiation => "version_negotiation",
            Error::NotInitial => "not_initial",
            Error::FixedBitClear => "fixed_bit_clear",
            Error::ConnectionIdTooLong(_) => "cid_too_long",
            Error::DatagramTooSmall(_) => "datagram_too_small",
            Error::DecryptFailed => "decrypt_failed",
            Error::BadFrame(_) => "bad_frame",
            Error::CryptoTooLarge(_) => "crypto_too_large",
            Error::NotClientHello(_) => "not_client_hello",
            Error::MalformedClientHello(_) => "malformed_client_hello",
            Error::NoServerName => "no_server_name",
            Error::BadServerName => "bad_server_name",
        }
    }
}
