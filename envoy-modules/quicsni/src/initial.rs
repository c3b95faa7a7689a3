//! One client Initial packet: its long header (RFC 9000 section 17.2), its Initial keys derived from the
//! Destination Connection ID and the version's public salt (RFC 9001 section 5.2; RFC 9369 section 3.3.1 for v2),
//! header protection removed (RFC 9001 section 5.4, AES-based) and the payload opened (AES-128-GCM, section 5.3).
//! Nothing here needs a key that is not public: anyone on the path can do this, which is why it reveals nothing
//! the ClientHello does not already show in the clear under TCP.

use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes128;
use aes_gcm::aead::{AeadInPlace, Nonce, Tag};
use aes_gcm::Aes128Gcm;
use hkdf::Hkdf;
use sha2::Sha256;

use crate::wire::Reader;
use crate::Error;

pub const QUIC_V1: u32 = 0x0000_0001;
pub const QUIC_V2: u32 = 0x6b33_43cf;
const SALT_V1: [u8; 20] = [
    0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17, 0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb, 0x7f,
    0x0a,
];
const SALT_V2: [u8; 20] = [
    0x0d, 0xed, 0xe3, 0xde, 0xf7, 0x00, 0xa6, 0xdb, 0x81, 0x93, 0x81, 0xbe, 0x6e, 0x26, 0x9d, 0xcb, 0xf9, 0xbd, 0x2e,
    0xd9,
];
const MAX_CID: usize = 20;
const TAG_LEN: usize = 16;
const SAMPLE_LEN: usize = 16;

/// The client's Initial keys for one connection (RFC 9001 section 5.2): public, derived from its first DCID.
#[derive(Clone)]
pub struct InitialKeys {
    version: u32,
    aead: Aes128Gcm,
    iv: [u8; 12],
    hp: Aes128,
}

impl InitialKeys {
    /// Keys for `version` (v1 or v2) from the Destination Connection ID of the client's first Initial.
    pub fn client(version: u32, dcid: &[u8]) -> Result<Self, Error> {
        let (salt, prefix) = match version {
            QUIC_V1 => (&SALT_V1, "quic"),
            QUIC_V2 => (&SALT_V2, "quicv2"),
            other => return Err(Error::UnsupportedVersion(other)),
        };
        let initial = Hkdf::<Sha256>::new(Some(salt), dcid);
        let mut secret = [0u8; 32];
        expand_label(&initial, "client in", &mut secret);
        let client = Hkdf::<Sha256>::from_prk(&secret).expect("32-byte PRK");
        let (mut key, mut iv, mut hp) = ([0u8; 16], [0u8; 12], [0u8; 16]);
        expand_label(&client, &format!("{prefix} key"), &mut key);
        expand_label(&client, &format!("{prefix} iv"), &mut iv);
        expand_label(&client, &format!("{prefix} hp"), &mut hp);
        Ok(InitialKeys {
            version,
            aead: Aes128Gcm::new(&key.into()),
            iv,
            hp: Aes128::new(&hp.into()),
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }
}

/// HKDF-Expand-Label (RFC 8446 section 7.1) with an empty context.
fn expand_label(prk: &Hkdf<Sha256>, label: &str, out: &mut [u8]) {
    let full = format!("tls13 {label}");
    let mut info = Vec::with_capacity(4 + full.len());
    info.extend_from_slice(&(out.len() as u16).to_be_bytes());
    info.push(full.len() as u8);
    info.extend_from_slice(full.as_bytes());
    info.push(0);
    prk.expand(&info, out).expect("output within 255 * 32 bytes");
}

/// The parts of a long header that come before the (protected) packet number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongHeader<'a> {
    pub version: u32,
    pub is_initial: bool,
    pub dcid: &'a [u8],
    pub scid: &'a [u8],
    /// Offset of the packet number within the packet.
    pub pn_offset: usize,
    /// Total length of this packet within the datagram (header, packet number, payload and tag).
    pub packet_len: usize,
}

/// Reads the long header at the start of `packet` (which may be followed by coalesced packets).
pub fn parse_long_header(packet: &[u8]) -> Result<LongHeader<'_>, Error> {
    let mut r = Reader::new(packet);
    let first = r.u8("first byte")?;
    if first & 0x80 == 0 {
        return Err(Error::ShortHeader);
    }
    let version = r.u32("version")?;
    if version == 0 {
        return Err(Error::VersionNegotiation);
    }
    if version != QUIC_V1 && version != QUIC_V2 {
        return Err(Error::UnsupportedVersion(version));
    }
    if first & 0x40 == 0 {
        return Err(Error::FixedBitClear);
    }
    let kind = (first >> 4) & 0x03;
    // RFC 9000 section 17.2: Initial is type 0 in v1; RFC 9369 section 3.2: type 1 in v2.
    let is_initial = if version == QUIC_V2 { kind == 1 } else { kind == 0 };
    let is_retry = if version == QUIC_V2 { kind == 0 } else { kind == 3 };
    let dcid = r.vec8("destination connection id")?;
    let scid = r.vec8("source connection id")?;
    for cid in [dcid, scid] {
        if cid.len() > MAX_CID {
            return Err(Error::ConnectionIdTooLong(cid.len()));
        }
    }
    if is_retry {
        return Err(Error::NotInitial);
    }
    if is_initial {
        let token_len = r.varint("token length")? as usize;
        r.bytes(token_len, "token")?;
    }
    let length = r.varint("length")? as usize;
    let pn_offset = r.pos();
    if r.remaining() < length {
        return Err(Error::Truncated("packet payload"));
    }
    Ok(LongHeader {
        version,
        is_initial,
        dcid,
        scid,
        pn_offset,
        packet_len: pn_offset + length,
    })
}

/// Removes header protection and opens one Initial packet (the first `header.packet_len` bytes of `packet`),
/// returning its plaintext frames. `packet` is copied: the datagram itself is forwarded unchanged.
pub fn open(keys: &InitialKeys, header: &LongHeader<'_>, packet: &[u8]) -> Result<Vec<u8>, Error> {
    let mut pkt = packet[..header.packet_len].to_vec();
    let sample_at = header.pn_offset + 4;
    if pkt.len() < sample_at + SAMPLE_LEN {
        return Err(Error::Truncated("header protection sample"));
    }
    let mut mask = aes::Block::clone_from_slice(&pkt[sample_at..sample_at + SAMPLE_LEN]);
    keys.hp.encrypt_block(&mut mask);
    pkt[0] ^= mask[0] & 0x0f;
    let pn_len = usize::from(pkt[0] & 0x03) + 1;
    let payload_at = header.pn_offset + pn_len;
    if pkt.len() < payload_at + TAG_LEN {
        return Err(Error::Truncated("packet payload"));
    }
    let mut pn: u64 = 0;
    for i in 0..pn_len {
        pkt[header.pn_offset + i] ^= mask[1 + i];
        pn = (pn << 8) | u64::from(pkt[header.pn_offset + i]);
    }
    let mut nonce = keys.iv;
    for (n, p) in nonce[4..].iter_mut().zip(pn.to_be_bytes()) {
        *n ^= p;
    }
    let (aad, body) = pkt.split_at_mut(payload_at);
    let (ciphertext, tag) = body.split_at_mut(body.len() - TAG_LEN);
    keys.aead
        .decrypt_in_place_detached(
            Nonce::<Aes128Gcm>::from_slice(&nonce),
            aad,
            ciphertext,
            Tag::<Aes128Gcm>::from_slice(tag),
        )
        .map_err(|_| Error::DecryptFailed)?;
    Ok(ciphertext.to_vec())
}
