//! A file's bytes in the model, sparse: 64 KiB chunks, a missing chunk reads as zeros, so a
//! 16 MiB file with holes costs what was written (moving bytes is slow under emulation).

use std::collections::BTreeMap;

const CHUNK: u64 = 64 << 10;

#[derive(Default)]
pub struct Data {
    len: u64,
    chunks: BTreeMap<u64, Box<[u8]>>,
}

impl Data {
    pub fn from(bytes: &[u8]) -> Data {
        let mut d = Data::default();
        d.write(0, bytes);
        d
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// Bytes of [off, off+len) clipped at EOF.
    pub fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let end = (off + len as u64).min(self.len);
        if off >= end {
            return Vec::new();
        }
        let mut out = vec![0u8; (end - off) as usize];
        for (&k, c) in self.chunks.range(off / CHUNK..=(end - 1) / CHUNK) {
            let cs = k * CHUNK;
            let s = cs.max(off);
            let e = (cs + CHUNK).min(end);
            out[(s - off) as usize..(e - off) as usize]
                .copy_from_slice(&c[(s - cs) as usize..(e - cs) as usize]);
        }
        out
    }

    pub fn byte(&self, off: u64) -> u8 {
        self.chunks
            .get(&(off / CHUNK))
            .map_or(0, |c| c[(off % CHUNK) as usize])
    }

    /// Write, extending the file if needed.
    pub fn write(&mut self, off: u64, bytes: &[u8]) {
        let end = off + bytes.len() as u64;
        let mut pos = off;
        while pos < end {
            let k = pos / CHUNK;
            let cs = k * CHUNK;
            let e = (cs + CHUNK).min(end);
            let c = self
                .chunks
                .entry(k)
                .or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            c[(pos - cs) as usize..(e - cs) as usize]
                .copy_from_slice(&bytes[(pos - off) as usize..(e - off) as usize]);
            pos = e;
        }
        self.len = self.len.max(end);
    }

    /// Zeros over [off, off+len) within the file (hole punching).
    pub fn zero(&mut self, off: u64, len: u64) {
        let end = (off + len).min(self.len);
        let mut pos = off;
        while pos < end {
            let k = pos / CHUNK;
            let cs = k * CHUNK;
            let e = (cs + CHUNK).min(end);
            if pos == cs && e == cs + CHUNK {
                self.chunks.remove(&k);
            } else if let Some(c) = self.chunks.get_mut(&k) {
                c[(pos - cs) as usize..(e - cs) as usize].fill(0);
            }
            pos = e;
        }
    }

    /// Set the size: what lies past a shrink is gone (a later grow reads zeros there).
    pub fn truncate(&mut self, len: u64) {
        if len < self.len {
            let old = self.len;
            self.zero(len, old - len);
            self.chunks.retain(|&k, _| k * CHUNK < len);
        }
        self.len = len;
    }
}
