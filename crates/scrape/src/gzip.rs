//! gzip for the merged scrape, compressed once per shared read: the
//! shared read's compressor (deflate blocks, each ending on a sync flush,
//! on a second windowed list), and each client's own tail (its part as the
//! final block, and a trailer whose CRC continues the shared stream's), so
//! a client's answer is one gzip member.

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use flate2::write::DeflateEncoder;
use flate2::Compression;
use tokio_util::sync::CancellationToken;

use crate::counters::Incomplete;
use crate::read::{bounded, GzChunk, Read};
use crate::window::{Cursor, End, List, Next};

/// The gzip member header: deflate, no name, no time, unknown OS.
pub(crate) const GZIP_HEADER: [u8; 10] = [0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];

/// Compresses `read.plain` into `out` as it grows, once for every client
/// of the read that wants gzip.
pub(crate) async fn compress(
    read: Arc<Read>,
    mut source: Cursor<Bytes>,
    out: Arc<List<GzChunk>>,
    shutdown: CancellationToken,
) {
    let mut encoder = DeflateEncoder::new(Vec::new(), Compression::fast());
    let mut crc = crc32fast::Hasher::new();
    let mut len = 0u64;
    let mut i = 0u64;
    loop {
        let next = tokio::select! {
            next = source.next(None) => next,
            _ = shutdown.cancelled() => Next::End(End::Cut(Incomplete::Error)),
        };
        let chunk = match next {
            Next::Item(chunk) => chunk,
            Next::End(end) => return out.end(end),
            Next::Timeout => return out.end(End::Cut(Incomplete::Error)),
        };
        i += 1;
        crc.update(&chunk);
        len += chunk.len() as u64;
        // Writing to a Vec cannot fail; flush() is a sync flush.
        let _ = encoder.write_all(&chunk);
        let _ = encoder.flush();
        let data = Bytes::from(std::mem::take(encoder.get_mut()));
        out.push(GzChunk {
            data,
            crc: crc.clone().finalize(),
            len,
        });
        // The compressed copy waits for its slowest reader too.
        match bounded(&read, out.room(read.deadline())).await {
            Some(Ok(())) => {}
            Some(Err(end)) => return out.end(end),
            None => return out.end(End::Cut(Incomplete::Timeout)),
        }
        if i % 16 == 0 {
            tokio::task::yield_now().await;
        }
    }
}

/// A client's own deflate blocks after the shared ones, and the gzip
/// trailer whose CRC continues the shared stream's.
pub(crate) struct GzTail {
    encoder: DeflateEncoder<Vec<u8>>,
    crc: crc32fast::Hasher,
    len: u64,
}

impl GzTail {
    /// After shared blocks of plain text of CRC `crc` and length `len`.
    pub(crate) fn new(crc: u32, len: u64) -> Self {
        Self {
            encoder: DeflateEncoder::new(Vec::new(), Compression::default()),
            crc: crc32fast::Hasher::new_with_initial_len(crc, len),
            len,
        }
    }

    /// `plain`, compressed up to a sync flush.
    pub(crate) fn write(&mut self, plain: &[u8]) -> Bytes {
        // Writing to a Vec cannot fail; flush() is a sync flush.
        let _ = self.encoder.write_all(plain);
        let _ = self.encoder.flush();
        self.crc.update(plain);
        self.len += plain.len() as u64;
        Bytes::from(std::mem::take(self.encoder.get_mut()))
    }

    /// `plain` as the final block, and the trailer.
    pub(crate) fn finish(mut self, plain: &[u8]) -> Bytes {
        let _ = self.encoder.write_all(plain);
        self.crc.update(plain);
        let total = self.len + plain.len() as u64;
        let mut out = self.encoder.finish().unwrap_or_default();
        out.extend_from_slice(&self.crc.finalize().to_le_bytes());
        out.extend_from_slice(&(total as u32).to_le_bytes());
        Bytes::from(out)
    }
}

/// `ours` as the final deflate block of a gzip member whose earlier blocks
/// (plain text of CRC `crc` and length `len`) were sent, and the trailer.
#[cfg(test)]
fn finish_gzip(ours: &[u8], crc: u32, len: u64) -> Bytes {
    GzTail::new(crc, len).finish(ours)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;

    #[test]
    fn a_gzip_member_built_from_shared_blocks_and_a_final_part_decodes() {
        // Shared blocks, each ending on a sync flush, as compress() makes.
        let parts: [&[u8]; 3] = [b"envoy_a 1\n", b"envoy_b 2\nenvoy_c 3\n", b"envoy_d 4\n"];
        let mut encoder = DeflateEncoder::new(Vec::new(), Compression::fast());
        let mut crc = crc32fast::Hasher::new();
        let mut body = GZIP_HEADER.to_vec();
        let mut len = 0;
        for p in parts {
            encoder.write_all(p).unwrap();
            encoder.flush().unwrap();
            body.extend_from_slice(&std::mem::take(encoder.get_mut()));
            crc.update(p);
            len += p.len() as u64;
        }
        body.extend_from_slice(&finish_gzip(b"lifeguard_ready 1\n", crc.finalize(), len));
        let mut text = String::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "envoy_a 1\nenvoy_b 2\nenvoy_c 3\nenvoy_d 4\nlifeguard_ready 1\n");
        // With no Envoy part at all.
        let mut body = GZIP_HEADER.to_vec();
        body.extend_from_slice(&finish_gzip(b"x 1\n", 0, 0));
        let mut text = String::new();
        flate2::read::GzDecoder::new(&body[..])
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "x 1\n");
    }
}
