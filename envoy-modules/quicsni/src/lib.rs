//! Reads the SNI of a QUIC connection from the client's Initial packets without terminating it.
//!
//! A client's Initial packets are protected with keys anyone can derive: HKDF from the Destination Connection ID
//! of its first Initial and a salt published per version (RFC 9001 section 5.2, RFC 9369 section 3.3.1). A gateway
//! that opens them reads the TLS ClientHello in the CRYPTO frames and its server_name, and nothing else: the
//! handshake keys and everything after them come from a Diffie-Hellman exchange it has no part in.
//!
//! [`Connection`] follows one client flight (a ClientHello may span several Initial packets, in any order, and a
//! Retry changes the keys); [`Tracker`] holds many, keyed by the caller (a 4-tuple), bounded in count and bytes.
//! The crate is pure: no sockets, no clock, no Envoy.

mod clienthello;
mod error;
mod frames;
pub mod gate;
mod initial;
pub mod pick;
mod tracker;
mod wire;

pub use clienthello::Progress;
pub use error::Error;
pub use initial::{parse_long_header, InitialKeys, LongHeader, QUIC_V1, QUIC_V2};
pub use tracker::{Tracker, TrackerLimits};

use frames::CryptoStream;

/// RFC 9000 section 14.1: a client's datagrams carrying Initial packets are at least 1,200 bytes.
pub const MIN_INITIAL_DATAGRAM: usize = 1200;

/// The reading state of one client connection.
pub struct Connection {
    keys: Option<(Vec<u8>, InitialKeys)>,
    crypto: CryptoStream,
    limit: usize,
}

impl Connection {
    /// A connection whose CRYPTO stream may hold up to `crypto_limit` bytes before it is refused.
    pub fn new(crypto_limit: usize) -> Self {
        Connection {
            keys: None,
            crypto: CryptoStream::new(crypto_limit),
            limit: crypto_limit,
        }
    }

    /// Bytes this connection holds.
    pub fn held(&self) -> usize {
        self.crypto.held()
    }

    /// Feeds one datagram from the client. Every coalesced Initial in it is opened; other long-header packets
    /// (0-RTT) after an Initial are skipped by their length.
    pub fn feed(&mut self, datagram: &[u8]) -> Result<Progress, Error> {
        if datagram.is_empty() {
            return Err(Error::Truncated("first byte"));
        }
        let mut rest = datagram;
        let mut first = true;
        while !rest.is_empty() {
            let header = match parse_long_header(rest) {
                Ok(h) => h,
                // Bytes after the last packet that are not a packet: RFC 9000 section 12.2 lets a receiver
                // ignore them once one packet was processed.
                Err(_) if !first => break,
                Err(e) => return Err(e),
            };
            if header.is_initial {
                if datagram.len() < MIN_INITIAL_DATAGRAM {
                    return Err(Error::DatagramTooSmall(datagram.len()));
                }
                let payload = self.open(&header, rest)?;
                self.crypto.add_frames(&payload)?;
                if let Progress::ServerName(name) = clienthello::server_name(self.crypto.contiguous())? {
                    return Ok(Progress::ServerName(name));
                }
            } else if first {
                return Err(Error::NotInitial);
            }
            first = false;
            rest = &rest[header.packet_len..];
        }
        Ok(Progress::NeedMore)
    }

    /// Opens with the keys of the connection's first Initial; after a Retry the client's Initials carry a new
    /// DCID and keys derived from it (RFC 9001 section 5.2), so a failure with the old keys tries the new DCID
    /// and, on success, restarts the CRYPTO stream (the client sends its ClientHello again).
    fn open(&mut self, header: &LongHeader<'_>, packet: &[u8]) -> Result<Vec<u8>, Error> {
        if let Some((dcid, keys)) = &self.keys {
            if keys.version() == header.version {
                match initial::open(keys, header, packet) {
                    Ok(payload) => return Ok(payload),
                    Err(e) if dcid.as_slice() == header.dcid => return Err(e),
                    Err(_) => {}
                }
            }
        }
        let keys = InitialKeys::client(header.version, header.dcid)?;
        let payload = initial::open(&keys, header, packet)?;
        if self.keys.is_some() {
            self.crypto = CryptoStream::new(self.limit);
        }
        self.keys = Some((header.dcid.to_vec(), keys));
        Ok(payload)
    }
}

/// The SNI of a ClientHello carried whole in one datagram (no state kept).
pub fn server_name_of_datagram(datagram: &[u8], crypto_limit: usize) -> Result<Progress, Error> {
    Connection::new(crypto_limit).feed(datagram)
}
