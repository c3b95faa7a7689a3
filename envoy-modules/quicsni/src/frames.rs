//! The frames a client Initial may carry (RFC 9000 section 17.2.2: PADDING, PING, ACK, CRYPTO,
//! CONNECTION_CLOSE of type 0x1c) and the reassembly of the CRYPTO stream, whose segments may arrive in any order
//! and across several Initial packets (RFC 9000 section 19.6).

use crate::wire::Reader;
use crate::Error;

/// The CRYPTO stream received so far, bounded by `limit` bytes.
#[derive(Debug, Clone)]
pub struct CryptoStream {
    buf: Vec<u8>,
    /// Received byte ranges, sorted, merged, half-open.
    have: Vec<(usize, usize)>,
    limit: usize,
}

impl CryptoStream {
    pub fn new(limit: usize) -> Self {
        CryptoStream {
            buf: Vec::new(),
            have: Vec::new(),
            limit,
        }
    }

    /// The bytes from offset 0 with no gap.
    pub fn contiguous(&self) -> &[u8] {
        match self.have.first() {
            Some(&(0, end)) => &self.buf[..end],
            _ => &[],
        }
    }

    /// Bytes held (for bounding a tracker's memory).
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    fn insert(&mut self, offset: u64, data: &[u8]) -> Result<(), Error> {
        let end = offset.checked_add(data.len() as u64).ok_or(Error::BadFrame(0x06))?;
        if end > self.limit as u64 {
            return Err(Error::CryptoTooLarge(self.limit as u64));
        }
        let (start, end) = (offset as usize, end as usize);
        if data.is_empty() {
            return Ok(());
        }
        if self.buf.len() < end {
            self.buf.resize(end, 0);
        }
        self.buf[start..end].copy_from_slice(data);
        self.have.push((start, end));
        self.have.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(self.have.len());
        for &(s, e) in &self.have {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        self.have = merged;
        Ok(())
    }

    /// Reads every frame of one decrypted Initial payload, adding its CRYPTO data.
    pub fn add_frames(&mut self, payload: &[u8]) -> Result<(), Error> {
        let mut r = Reader::new(payload);
        while !r.is_empty() {
            let kind = r.varint("frame type")?;
            match kind {
                0x00 | 0x01 => {}
                0x02 | 0x03 => skip_ack(&mut r, kind == 0x03)?,
                0x06 => {
                    let offset = r.varint("crypto offset")?;
                    let len = r.varint("crypto length")? as usize;
                    let data = r.bytes(len, "crypto data")?;
                    self.insert(offset, data)?;
                }
                0x1c => {
                    r.varint("error code")?;
                    r.varint("frame type")?;
                    let n = r.varint("reason length")? as usize;
                    r.bytes(n, "reason")?;
                }
                other => return Err(Error::BadFrame(other)),
            }
        }
        Ok(())
    }
}

fn skip_ack(r: &mut Reader<'_>, ecn: bool) -> Result<(), Error> {
    r.varint("largest acknowledged")?;
    r.varint("ack delay")?;
    let ranges = r.varint("ack range count")?;
    r.varint("first ack range")?;
    for _ in 0..ranges {
        r.varint("gap")?;
        r.varint("ack range length")?;
    }
    if ecn {
        for _ in 0..3 {
            r.varint("ecn count")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_out_of_order_join_into_one_prefix() {
        let mut s = CryptoStream::new(100);
        s.insert(5, b"world").unwrap();
        assert_eq!(s.contiguous(), b"");
        s.insert(0, b"hello").unwrap();
        assert_eq!(s.contiguous(), b"helloworld");
        s.insert(3, b"lowo").unwrap();
        assert_eq!(s.contiguous(), b"helloworld");
    }

    #[test]
    fn the_bound_holds() {
        let mut s = CryptoStream::new(8);
        assert_eq!(s.insert(4, b"12345"), Err(Error::CryptoTooLarge(8)));
    }

    #[test]
    fn a_stream_frame_is_refused() {
        let mut s = CryptoStream::new(8);
        assert_eq!(s.add_frames(&[0x08, 0x00]), Err(Error::BadFrame(0x08)));
    }
}
