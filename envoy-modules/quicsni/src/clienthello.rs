//! The TLS 1.3 ClientHello (RFC 8446 section 4.1.2) at the start of the CRYPTO stream, and its server_name
//! extension (RFC 6066 section 3).

use crate::wire::Reader;
use crate::Error;

const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const NAME_TYPE_HOST_NAME: u8 = 0;

/// What the stream holds so far: a complete ClientHello's SNI, or a need for more bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    NeedMore,
    ServerName(String),
}

/// Reads the SNI once the ClientHello at the start of `stream` is complete. Checks the message type as soon as
/// the first byte is there, so a stream that is not a ClientHello fails without waiting.
pub fn server_name(stream: &[u8]) -> Result<Progress, Error> {
    let Some(&kind) = stream.first() else {
        return Ok(Progress::NeedMore);
    };
    if kind != HANDSHAKE_CLIENT_HELLO {
        return Err(Error::NotClientHello(kind));
    }
    if stream.len() < 4 {
        return Ok(Progress::NeedMore);
    }
    let len = u32::from_be_bytes([0, stream[1], stream[2], stream[3]]) as usize;
    if stream.len() < 4 + len {
        return Ok(Progress::NeedMore);
    }
    parse_body(&stream[4..4 + len]).map(Progress::ServerName)
}

fn parse_body(body: &[u8]) -> Result<String, Error> {
    let mal = Error::MalformedClientHello;
    let mut r = Reader::new(body);
    r.u16("legacy_version").map_err(|_| mal("legacy_version"))?;
    r.bytes(32, "random").map_err(|_| mal("random"))?;
    r.vec8("session id").map_err(|_| mal("legacy_session_id"))?;
    r.vec16("cipher suites").map_err(|_| mal("cipher_suites"))?;
    r.vec8("compression").map_err(|_| mal("legacy_compression_methods"))?;
    let mut exts = Reader::new(r.vec16("extensions").map_err(|_| mal("extensions"))?);
    if !r.is_empty() {
        return Err(mal("bytes after extensions"));
    }
    let mut found: Option<String> = None;
    while !exts.is_empty() {
        let kind = exts.u16("extension type").map_err(|_| mal("extension"))?;
        let data = exts.vec16("extension data").map_err(|_| mal("extension"))?;
        if kind == EXT_SERVER_NAME {
            if found.is_some() {
                return Err(mal("two server_name extensions"));
            }
            found = Some(host_name(data)?);
        }
    }
    found.ok_or(Error::NoServerName)
}

/// The one host_name entry of a server_name extension, lower-cased (DNS names compare case-insensitively).
fn host_name(data: &[u8]) -> Result<String, Error> {
    let mal = Error::MalformedClientHello;
    let mut ext = Reader::new(data);
    let mut list = Reader::new(ext.vec16("server_name_list").map_err(|_| mal("server_name_list"))?);
    if !ext.is_empty() {
        return Err(mal("bytes after server_name_list"));
    }
    let mut name: Option<&[u8]> = None;
    while !list.is_empty() {
        let kind = list.u8("name type").map_err(|_| mal("server_name"))?;
        let value = list.vec16("host name").map_err(|_| mal("server_name"))?;
        // RFC 6066 section 3: at most one name of each type.
        if kind == NAME_TYPE_HOST_NAME {
            if name.is_some() {
                return Err(mal("two host_name entries"));
            }
            name = Some(value);
        }
    }
    let name = name.ok_or(Error::NoServerName)?;
    if !is_host_name(name) {
        return Err(Error::BadServerName);
    }
    Ok(String::from_utf8_lossy(name).to_ascii_lowercase())
}

/// A DNS host name: ASCII labels of letters, digits, '-' and '_' (1-63 bytes each), no trailing dot (RFC 6066
/// section 3), 253 bytes at most.
fn is_host_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split(|&b| b == b'.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .iter()
                    .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names() {
        assert!(is_host_name(b"8080.web.default.mesh.local"));
        assert!(!is_host_name(b"example.com."));
        assert!(!is_host_name(b"a..b"));
        assert!(!is_host_name(b"caf\xc3\xa9.example"));
        assert!(!is_host_name(b""));
    }

    #[test]
    fn not_a_client_hello_fails_at_once() {
        assert_eq!(server_name(&[2]), Err(Error::NotClientHello(2)));
        assert_eq!(server_name(&[1, 0]), Ok(Progress::NeedMore));
    }
}
