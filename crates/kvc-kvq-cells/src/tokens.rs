//! Reads for several ubatch tokens at once (a prefill's block of query positions): a tile of
//! cells that every one of them reads alike (each cell by the same row, main, window or sink)
//! is read once for all of their queries; any other tile (one that holds a window's edge for
//! the block) is read token by token. Each token's scores and sums are what
//! [`KvqCells::scores`] and [`KvqCells::accumulate`] give it, bit for bit (the multi-query
//! kernels equal one call per query), so a prefill reads the same whatever its blocks.

use crate::{Error, KvqCells, Result, MAX_QUERIES, WIN};

impl KvqCells {
    /// Whether every token reads cells `cell0..cell0 + n` alike: each cell by the same row
    /// (main, window or sink) for the first and the last of their positions, and so for every
    /// one between (a cell is read by its window row up to `window - 1` positions after it,
    /// by its main row from there on).
    fn tile_reads_alike(&self, cell0: u32, n: usize, tokens: &[u32]) -> bool {
        let pos = tokens.iter().map(|&t| self.ubatch.tokens[t as usize].0);
        let (lo, hi) = pos.fold((i32::MAX, i32::MIN), |(lo, hi), p| (lo.min(p), hi.max(p)));
        let end = (cell0 as usize).saturating_add(n).min(self.cells.len());
        let start = (cell0 as usize).min(end);
        self.cells[start..end].iter().enumerate().all(|(i, c)| {
            c.flags & WIN == 0 || {
                let cell = (start + i) as u32;
                self.read_of(cell, lo) == self.read_of(cell, hi)
            }
        })
    }

    /// Checks `tokens` (1 or more, each of the ubatch) and that `values` splits into one equal
    /// part per token; returns the part's length.
    fn split_per_token(&self, tokens: &[u32], values: usize, what: &'static str) -> Result<usize> {
        if tokens.is_empty() || !values.is_multiple_of(tokens.len()) {
            return Err(Error::invalid(
                what,
                format!("{values} values for {} tokens", tokens.len()),
            ));
        }
        if let Some(&t) = tokens
            .iter()
            .find(|&&t| t as usize >= self.ubatch.tokens.len())
        {
            return Err(Error::invalid(
                "token",
                format!(
                    "{t} is not below the ubatch's {} tokens",
                    self.ubatch.tokens.len()
                ),
            ));
        }
        Ok(values / tokens.len())
    }

    /// At most [`MAX_QUERIES`] queries of tensor `t` in `values` (`head_dim` each).
    fn check_block(&self, t: u32, values: usize) -> Result<()> {
        let queries = values / self.head_dim(t)?;
        if queries > MAX_QUERIES {
            return Err(Error::invalid(
                "queries",
                format!("{queries} queries in one block: at most {MAX_QUERIES}"),
            ));
        }
        Ok(())
    }

    /// One read for several tokens: `input` and `out` split into one equal part per token;
    /// `read(token, input, out)` once for all of them (one token, or a tile every token reads
    /// alike, at most [`MAX_QUERIES`] queries: `queries` values of tensor `t`), else once per
    /// token on its parts.
    #[allow(clippy::too_many_arguments)]
    fn read_tokens(
        &self,
        t: u32,
        cell0: u32,
        n: usize,
        tokens: &[u32],
        (input, input_name): (&[f32], &'static str),
        (out, out_name): (&mut [f32], &'static str),
        queries: usize,
        read: impl Fn(u32, &[f32], &mut [f32]) -> Result<()>,
    ) -> Result<()> {
        let per_in = self.split_per_token(tokens, input.len(), input_name)?;
        let per_out = self.split_per_token(tokens, out.len(), out_name)?;
        if tokens.len() == 1 {
            return read(tokens[0], input, out);
        }
        self.check_block(t, queries)?;
        if self.tile_reads_alike(cell0, n, tokens) {
            // no read depends on the query's position: one call for every query
            return read(tokens[0], input, out);
        }
        for ((&token, x), y) in tokens
            .iter()
            .zip(input.chunks_exact(per_in))
            .zip(out.chunks_exact_mut(per_out))
        {
            read(token, x, y)?;
        }
        Ok(())
    }

    /// [`scores`](Self::scores) for the queries of several ubatch tokens: `q_rot` holds each
    /// token's `g` queries in turn (`tokens.len() * g <= MAX_QUERIES`), `scores` each
    /// token's `g x n` scores in turn. Each token's are what `scores` gives it, bit for bit.
    #[allow(clippy::too_many_arguments)]
    pub fn scores_tokens(
        &self,
        t: u32,
        main: &[u8],
        kv_head: u32,
        cell0: u32,
        n: usize,
        tokens: &[u32],
        q_rot: &[f32],
        scores: &mut [f32],
    ) -> Result<()> {
        let queries = q_rot.len();
        self.read_tokens(
            t,
            cell0,
            n,
            tokens,
            (q_rot, "queries"),
            (scores, "scores"),
            queries,
            |token, q, s| self.scores(t, main, kv_head, cell0, n, token, q, s),
        )
    }

    /// [`accumulate`](Self::accumulate) for the queries of several ubatch tokens: `w` holds
    /// each token's `g x n` weights in turn, `acc` each token's `g x head_dim` sums in turn
    /// (`tokens.len() * g <= MAX_QUERIES`). Each token's sums are what `accumulate` gives it,
    /// bit for bit.
    #[allow(clippy::too_many_arguments)]
    pub fn accumulate_tokens(
        &self,
        t: u32,
        main: &[u8],
        kv_head: u32,
        cell0: u32,
        n: usize,
        tokens: &[u32],
        w: &[f32],
        acc: &mut [f32],
    ) -> Result<()> {
        let queries = acc.len();
        self.read_tokens(
            t,
            cell0,
            n,
            tokens,
            (w, "weights"),
            (acc, "sums"),
            queries,
            |token, wt, a| self.accumulate(t, main, kv_head, cell0, n, token, wt, a),
        )
    }
}
