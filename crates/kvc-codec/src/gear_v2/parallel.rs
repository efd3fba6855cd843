//! Encoding and decoding over chunks in parallel with rayon.

use super::decode::OpenBlob;
use super::encode::{EncodeParams, Encoder};
use crate::error::{Error, Result};
use rayon::prelude::*;

impl Encoder {
    /// Like [`Encoder::encode_into`], with the chunks encoded in parallel on rayon's pool.
    /// The output is byte-identical to the serial encoder's.
    pub fn encode_into_parallel(
        &mut self,
        params: &EncodeParams,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        self.plan_and_encode(params, input, out, Self::encode_parallel)
    }

    fn encode_parallel(
        &mut self,
        params: &EncodeParams,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let entries = self.prepare(params, input, out)?;
        let mut bufs = std::mem::take(&mut self.chunk_bufs);
        bufs.resize_with(entries.max(bufs.len()), Vec::new);
        let enc: &Encoder = self;
        bufs[..entries]
            .par_iter_mut()
            .enumerate()
            .for_each(|(e, buf)| {
                buf.clear();
                enc.encode_entry(params, input, e, buf);
            });
        for buf in &bufs[..entries] {
            out.extend_from_slice(&(buf.len() as u32).to_le_bytes());
        }
        for buf in &bufs[..entries] {
            out.extend_from_slice(buf);
        }
        self.chunk_bufs = bufs;
        Ok(())
    }
}

impl OpenBlob<'_, '_> {
    /// Like [`OpenBlob::decode_into`], with the chunks decoded in parallel on rayon's pool.
    pub fn decode_into_parallel(&self, out: &mut [u8]) -> Result<usize> {
        let total = self.header().decoded_len();
        if out.len() < total {
            return Err(Error::OutputTooSmall {
                needed: total,
                available: out.len(),
            });
        }
        if total == 0 {
            return Ok(0);
        }
        let chunk_bytes = self.chunk_len(0);
        out[..total]
            .par_chunks_mut(chunk_bytes)
            .enumerate()
            .try_for_each(|(i, o)| self.decode_chunk_into(i, o).map(|_| ()))?;
        Ok(total)
    }
}
