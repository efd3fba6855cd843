//! The kv-prefix file (`KVCPRFIX`, docs/formats/kv-prefix.md): one prefix's token ids and
//! the kv-chunk blobs of its leading whole chunks in one self-describing, checksummed file,
//! so that an engine can save a sequence (llama-server's slot files) through kvc's codecs
//! and another process can load it into its own tiers.
//!
//! This module is the one writer ([`write()`]) and the one reader ([`PrefixFile::read`]) of
//! the file's bytes; the reader validates every field, the exact length, the checksum and
//! then every blob (the kv-chunk reader's checks, and its key against the chained key of
//! the file's tokens under the file's fingerprint) before it returns anything.
//!
//! It is not a tier (nothing is looked up in it by key), not a store of several prefixes,
//! and it decodes no chunk: [`crate::Tiers::export_prefix`] writes one from the blobs the
//! tiers hold, [`crate::Tiers::import_prefix`] puts its blobs into the first tier, and the
//! ordinary restore ([`crate::Tiers::restore`], [`crate::Tiers::restore_into`]) decodes
//! them there.

use crate::blob::{self, u16_at, u32_at, u64_at, verify};
use crate::error::{Error, Result};
use crate::key::{chain_keys, ChunkKey, Fingerprint};

/// The first 8 bytes of every kv-prefix file.
pub const MAGIC: [u8; 8] = *b"KVCPRFIX";
/// The format version this build writes and reads.
pub const VERSION: u16 = 1;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 64;
/// Bytes of the trailing BLAKE3 checksum.
pub const CHECKSUM_LEN: usize = 32;
/// The most token ids a file carries (2^26).
pub const MAX_TOKENS: usize = 1 << 26;
/// Bytes of the length that precedes each blob.
const BLOB_LEN_BYTES: usize = 8;
/// The shortest kv-chunk blob: its header and its checksum.
const MIN_BLOB: u64 = (blob::HEADER_LEN + blob::CHECKSUM_LEN) as u64;

/// A kv-prefix file that passed every check of [`PrefixFile::read`]: its fingerprint, chunk
/// size, token ids, and the blobs of its leading whole chunks (borrowed from the file's
/// bytes), each the chunk of the file's tokens at its position under the file's
/// fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixFile<'a> {
    fingerprint: Fingerprint,
    chunk_tokens: usize,
    tokens: Vec<u32>,
    /// Per chunk: its key (chained from the tokens), the blob's offset in the file, the blob.
    chunks: Vec<(ChunkKey, usize, &'a [u8])>,
}

fn bad(field: &'static str, offset: usize, reason: impl Into<String>) -> Error {
    Error::BadPrefixFile {
        field,
        offset: offset as u64,
        reason: reason.into(),
    }
}

/// Checks that a header field holds `expected`.
fn expect(field: &'static str, offset: usize, expected: u64, found: u64) -> Result<()> {
    if expected == found {
        Ok(())
    } else {
        Err(bad(field, offset, format!("{found}, expected {expected}")))
    }
}

impl<'a> PrefixFile<'a> {
    /// Reads and validates a whole kv-prefix file, in this order: length at least
    /// [`HEADER_LEN`] + [`CHECKSUM_LEN`], magic, version, reserved, header_len, n_tokens
    /// (at most [`MAX_TOKENS`]), chunk_tokens (at least 1), n_chunks (their tokens at most
    /// n_tokens), reserved; each blob length (at least a blob's header and checksum, within
    /// the bytes left); the exact total length; the checksum; then each blob: the kv-chunk
    /// reader's checks ([`crate::verify`]: its header, length, checksum, codec), its
    /// fingerprint the file's, its key the chained key of the file's tokens at its position
    /// under that fingerprint, its token count the file's chunk size. Any failure is
    /// [`Error::BadPrefixFile`] or [`Error::BadPrefixChunk`] (kind `CorruptData`); nothing
    /// is allocated beyond a size checked against `bytes` (the token ids, a few words per
    /// blob).
    pub fn read(bytes: &'a [u8]) -> Result<PrefixFile<'a>> {
        let len = bytes.len();
        if len < HEADER_LEN + CHECKSUM_LEN {
            return Err(bad(
                "length",
                len,
                format!(
                    "{len} bytes, shorter than the header and checksum ({})",
                    HEADER_LEN + CHECKSUM_LEN
                ),
            ));
        }
        if bytes[..8] != MAGIC {
            return Err(bad(
                "magic",
                0,
                format!("{:02x?}, expected \"KVCPRFIX\"", &bytes[..8]),
            ));
        }
        expect("version", 8, VERSION.into(), u16_at(bytes, 8).into())?;
        expect("reserved", 10, 0, u16_at(bytes, 10).into())?;
        expect(
            "header_len",
            12,
            HEADER_LEN as u64,
            u32_at(bytes, 12).into(),
        )?;
        let n_tokens = u32_at(bytes, 16) as usize;
        if n_tokens > MAX_TOKENS {
            return Err(bad(
                "n_tokens",
                16,
                format!("{n_tokens}, more than {MAX_TOKENS}"),
            ));
        }
        let chunk_tokens = u32_at(bytes, 20) as usize;
        if chunk_tokens == 0 {
            return Err(bad("chunk_tokens", 20, "0, expected at least 1"));
        }
        let n_chunks = u32_at(bytes, 24) as usize;
        let covered = (n_chunks as u64) * (chunk_tokens as u64);
        if covered > n_tokens as u64 {
            return Err(bad(
                "n_chunks",
                24,
                format!(
                    "{n_chunks} chunks of {chunk_tokens} tokens, more than n_tokens {n_tokens}"
                ),
            ));
        }
        expect("reserved", 28, 0, u32_at(bytes, 28).into())?;
        let mut fp = [0u8; 32];
        fp.copy_from_slice(&bytes[32..64]);
        let fingerprint = Fingerprint(fp);

        // The token ids, then n_chunks (length, blob) pairs, then the checksum: walk the
        // lengths (each blob at least a blob's header and checksum, so n_chunks pairs fit
        // in the file before anything is sized from n_chunks) to the exact total length.
        let body_end = len - CHECKSUM_LEN;
        let tokens_end = HEADER_LEN + 4 * n_tokens; // n_tokens <= 2^26: no overflow
        if tokens_end > body_end {
            return Err(bad(
                "length",
                len,
                format!(
                    "{len} bytes, shorter than the header, {n_tokens} token ids and the checksum ({})",
                    tokens_end + CHECKSUM_LEN
                ),
            ));
        }
        let mut at = tokens_end;
        let mut spans: Vec<(usize, usize)> = Vec::new();
        for i in 0..n_chunks {
            if body_end - at < BLOB_LEN_BYTES {
                return Err(bad(
                    "blob length",
                    at,
                    format!(
                        "chunk {i}: the file ends before its length ({n_chunks} chunks declared)"
                    ),
                ));
            }
            let blob_len = u64_at(bytes, at);
            let left = (body_end - at - BLOB_LEN_BYTES) as u64;
            if blob_len < MIN_BLOB || blob_len > left {
                return Err(bad(
                    "blob length",
                    at,
                    format!("chunk {i}: {blob_len} bytes, expected {MIN_BLOB}..={left}"),
                ));
            }
            at += BLOB_LEN_BYTES;
            spans.push((at, blob_len as usize));
            at += blob_len as usize;
        }
        if at != body_end {
            return Err(bad(
                "length",
                len,
                format!(
                    "{len} bytes, expected {} ({} bytes after the last blob)",
                    at + CHECKSUM_LEN,
                    body_end - at
                ),
            ));
        }
        if blake3::hash(&bytes[..body_end]).as_bytes()[..] != bytes[body_end..] {
            return Err(bad(
                "checksum",
                body_end,
                "BLAKE3 of the preceding bytes does not match",
            ));
        }
        let tokens: Vec<u32> = bytes[HEADER_LEN..tokens_end]
            .chunks_exact(4)
            .map(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]))
            .collect();
        let keys = chain_keys(&fingerprint, chunk_tokens, &tokens[..covered as usize]);
        debug_assert_eq!(keys.len(), n_chunks);
        let mut chunks = Vec::with_capacity(n_chunks);
        for (i, (&(offset, blob_len), key)) in spans.iter().zip(keys).enumerate() {
            let b = &bytes[offset..offset + blob_len];
            let wrap = |source: Error| Error::BadPrefixChunk {
                chunk: i,
                offset: offset as u64,
                source: Box::new(source),
            };
            let h = verify(b).map_err(wrap)?;
            if h.fingerprint != fingerprint {
                return Err(wrap(Error::ForeignBlob {
                    what: "model, layout or codec (fingerprint)",
                }));
            }
            if h.key != key {
                return Err(wrap(Error::ForeignBlob { what: "key" }));
            }
            if h.n_tokens as usize != chunk_tokens {
                return Err(wrap(Error::BadField {
                    field: "n_tokens",
                    expected: chunk_tokens as u64,
                    found: h.n_tokens.into(),
                }));
            }
            chunks.push((key, offset, b));
        }
        Ok(PrefixFile {
            fingerprint,
            chunk_tokens,
            tokens,
            chunks,
        })
    }

    /// The fingerprint (model, layout, dtype, chunk size, codec) the file was written for.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// Tokens per chunk.
    pub fn chunk_tokens(&self) -> usize {
        self.chunk_tokens
    }

    /// Every token id the file carries (the whole prefix its writer was given, also past
    /// its last whole chunk).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The token ids, by value.
    pub fn into_tokens(self) -> Vec<u32> {
        self.tokens
    }

    /// Chunks in the file (its leading whole chunks).
    pub fn n_chunks(&self) -> usize {
        self.chunks.len()
    }

    /// Tokens the chunks cover: `n_chunks * chunk_tokens`.
    pub fn tokens_covered(&self) -> usize {
        self.chunks.len() * self.chunk_tokens
    }

    /// Each chunk in order: its key (the chained key of the file's tokens) and its blob.
    pub fn chunks(&self) -> impl ExactSizeIterator<Item = (ChunkKey, &'a [u8])> + '_ {
        self.chunks.iter().map(|&(key, _, b)| (key, b))
    }

    /// The byte offset of chunk `i`'s blob in the file (for messages).
    pub fn blob_offset(&self, i: usize) -> Option<usize> {
        self.chunks.get(i).map(|c| c.1)
    }
}

/// [`Error::InvalidArgument`] when `n` token ids are more than a file carries
/// ([`MAX_TOKENS`]).
pub(crate) fn check_token_count(n: usize) -> Result<()> {
    if n > MAX_TOKENS {
        return Err(Error::invalid(
            "tokens",
            format!("{n} token ids, a kv-prefix file carries at most {MAX_TOKENS}"),
        ));
    }
    Ok(())
}

/// Writes a kv-prefix file: `tokens` (every token id of the prefix, at most
/// [`MAX_TOKENS`]), then `blobs`, the kv-chunk blobs of the leading whole chunks of
/// `tokens` (chunk `i` covers tokens `i·chunk_tokens ..`) under `fingerprint`. The writer
/// checks the counts (`chunk_tokens` in `1..=u32::MAX`, the blobs' tokens at most
/// `tokens.len()`) and takes the blobs as they are: [`PrefixFile::read`] checks them.
/// Errors: [`Error::InvalidArgument`].
pub fn write(
    fingerprint: &Fingerprint,
    chunk_tokens: usize,
    tokens: &[u32],
    blobs: &[&[u8]],
) -> Result<Vec<u8>> {
    check_token_count(tokens.len())?;
    let chunk = u32::try_from(chunk_tokens)
        .ok()
        .filter(|&c| c > 0)
        .ok_or_else(|| {
            Error::invalid(
                "chunk_tokens",
                format!("{chunk_tokens} is not in 1..={}", u32::MAX),
            )
        })?;
    if blobs.len().saturating_mul(chunk_tokens) > tokens.len() {
        return Err(Error::invalid(
            "blobs",
            format!(
                "{} chunks of {chunk_tokens} tokens, more than the {} token ids",
                blobs.len(),
                tokens.len()
            ),
        ));
    }
    let total = HEADER_LEN
        + 4 * tokens.len()
        + blobs
            .iter()
            .map(|b| BLOB_LEN_BYTES + b.len())
            .sum::<usize>()
        + CHECKSUM_LEN;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    for v in [
        HEADER_LEN as u32,
        tokens.len() as u32, // at most 2^26 (checked)
        chunk,
        blobs.len() as u32, // at most tokens.len() (checked)
        0,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&fingerprint.0);
    debug_assert_eq!(out.len(), HEADER_LEN);
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    for b in blobs {
        out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        out.extend_from_slice(b);
    }
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    debug_assert_eq!(out.len(), total);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_prefix_is_a_valid_file() {
        let fp = Fingerprint([3; 32]);
        let f = write(&fp, 4, &[1, 2, 3], &[]).unwrap();
        assert_eq!(f.len(), HEADER_LEN + 12 + CHECKSUM_LEN);
        let p = PrefixFile::read(&f).unwrap();
        assert_eq!(
            (p.fingerprint(), p.chunk_tokens(), p.tokens(), p.n_chunks()),
            (&fp, 4, &[1u32, 2, 3][..], 0)
        );
        assert_eq!(p.tokens_covered(), 0);
    }

    #[test]
    fn the_writer_refuses_inconsistent_counts() {
        let fp = Fingerprint([3; 32]);
        let blob = [0u8; 200];
        assert!(write(&fp, 0, &[1], &[]).is_err());
        assert!(write(&fp, 4, &[1, 2, 3], &[&blob]).is_err());
        assert!(write(&fp, 4, &[0; MAX_TOKENS + 1], &[]).is_err());
    }

    #[test]
    fn header_fields_are_checked_before_the_checksum() {
        let fp = Fingerprint([3; 32]);
        let good = write(&fp, 4, &[1, 2, 3, 4, 5], &[]).unwrap();
        for (at, field) in [
            (0, "magic"),
            (8, "version"),
            (10, "reserved"),
            (12, "header_len"),
            (20, "chunk_tokens"),
            (28, "reserved"),
        ] {
            let mut f = good.clone();
            f[at] ^= 1;
            if field == "chunk_tokens" {
                f[20..24].copy_from_slice(&0u32.to_le_bytes());
            }
            match PrefixFile::read(&f) {
                Err(Error::BadPrefixFile { field: got, .. }) => assert_eq!(got, field, "byte {at}"),
                other => panic!("byte {at}: {other:?}"),
            }
        }
        // n_tokens past 2^26, n_chunks past n_tokens, a claimed blob that is not there.
        for (at, v, field) in [
            (16, (MAX_TOKENS + 1) as u32, "n_tokens"),
            (24, 2, "n_chunks"),
            (24, 1, "blob length"),
        ] {
            let mut f = good.clone();
            f[at..at + 4].copy_from_slice(&v.to_le_bytes());
            match PrefixFile::read(&f) {
                Err(Error::BadPrefixFile { field: got, .. }) => assert_eq!(got, field),
                other => panic!("{field}: {other:?}"),
            }
        }
    }
}
