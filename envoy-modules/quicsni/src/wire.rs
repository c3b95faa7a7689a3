//! A bounds-checked reader over bytes: QUIC variable-length integers (RFC 9000 section 16) and TLS's
//! fixed-width, length-prefixed fields (RFC 8446 section 3).

use crate::Error;

pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.remaining() == 0
    }

    pub fn bytes(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], Error> {
        if self.remaining() < n {
            return Err(Error::Truncated(what));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, Error> {
        Ok(self.bytes(1, what)?[0])
    }

    pub fn u16(&mut self, what: &'static str) -> Result<u16, Error> {
        let b = self.bytes(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, Error> {
        let b = self.bytes(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A QUIC variable-length integer: the two high bits of the first byte give its length (1, 2, 4, 8).
    pub fn varint(&mut self, what: &'static str) -> Result<u64, Error> {
        let first = self.u8(what)?;
        let len = 1usize << (first >> 6);
        let mut value = u64::from(first & 0x3f);
        for &b in self.bytes(len - 1, what)? {
            value = (value << 8) | u64::from(b);
        }
        Ok(value)
    }

    /// A field prefixed by its one-byte length (TLS `opaque x<0..2^8-1>`).
    pub fn vec8(&mut self, what: &'static str) -> Result<&'a [u8], Error> {
        let n = self.u8(what)? as usize;
        self.bytes(n, what)
    }

    /// A field prefixed by its two-byte length (TLS `opaque x<0..2^16-1>`).
    pub fn vec16(&mut self, what: &'static str) -> Result<&'a [u8], Error> {
        let n = self.u16(what)? as usize;
        self.bytes(n, what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_from_rfc9000_appendix_a1() {
        let cases: [(&[u8], u64); 4] = [
            (
                &[0xc2, 0x19, 0x7c, 0x5e, 0xff, 0x14, 0xe8, 0x8c],
                151_288_809_941_952_652,
            ),
            (&[0x9d, 0x7f, 0x3e, 0x7d], 494_878_333),
            (&[0x7b, 0xbd], 15_293),
            (&[0x25], 37),
        ];
        for (bytes, want) in cases {
            assert_eq!(Reader::new(bytes).varint("t"), Ok(want));
        }
        assert_eq!(Reader::new(&[0x40]).varint("t"), Err(Error::Truncated("t")));
    }
}
