//! Summing attention probabilities into per-block accumulators: the hot path.
//!
//! Each (block, group) accumulator is a vector of [`LANES`] partial sums: token `t` of a
//! block adds into lane `(t - block_start) % LANES`, so a row adds into its blocks with
//! plain vertical adds and no horizontal reduction; the lanes are folded once per call.
//! The portable kernel is compiled again with AVX2 and with AVX-512 enabled and picked at
//! run time.

/// Partial sums per accumulator.
pub(crate) const LANES: usize = 16;

/// One accumulator's partial sums.
pub(crate) type Lanes = [f32; LANES];

/// Which compiled copy of the kernel runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// Baseline x86-64 / any target.
    Portable,
    /// AVX2 + FMA present.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512F present.
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Kernel {
    /// The best kernel this CPU runs.
    pub(crate) fn detect() -> Kernel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Kernel::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Kernel::Avx2;
            }
        }
        Kernel::Portable
    }

    /// Every kernel this CPU can run (for tests comparing them).
    #[cfg(test)]
    pub(crate) fn all_available() -> Vec<Kernel> {
        let mut v = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                v.push(Kernel::Avx2);
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                v.push(Kernel::Avx512);
            }
        }
        v
    }
}

/// A set of equally long rows of probabilities over consecutive tokens, all starting at
/// token `first_token`. Row `r` is `data[r * stride..][..len]` and adds into group
/// `group_base + r / rows_per_group`. Bounds are checked by the caller.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rows<'a> {
    pub data: &'a [f32],
    pub n_rows: usize,
    pub stride: usize,
    pub len: usize,
    pub first_token: usize,
    pub group_base: usize,
    pub rows_per_group: usize,
}

/// Where rows add: `lanes[block * n_groups + group]`, blocks of `block` tokens.
pub(crate) struct Target<'a> {
    pub lanes: &'a mut [Lanes],
    pub n_groups: usize,
    pub block: usize,
}

/// Adds every row into its blocks with the chosen kernel.
pub(crate) fn add_rows(kernel: Kernel, rows: Rows<'_>, target: &mut Target<'_>) {
    match kernel {
        Kernel::Portable => add_rows_portable(rows, target),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Kernel::Avx2` is only constructed after `is_x86_feature_detected!("avx2")`
        // returned true, so the CPU supports the instructions the function was compiled for.
        Kernel::Avx2 => unsafe { add_rows_avx2(rows, target) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above, for `avx512f`.
        Kernel::Avx512 => unsafe { add_rows_avx512(rows, target) },
    }
}

fn add_rows_portable(rows: Rows<'_>, target: &mut Target<'_>) {
    add_rows_body(rows, target);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn add_rows_avx2(rows: Rows<'_>, target: &mut Target<'_>) {
    add_rows_body(rows, target);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn add_rows_avx512(rows: Rows<'_>, target: &mut Target<'_>) {
    add_rows_body(rows, target);
}

#[inline(always)]
fn add_rows_body(rows: Rows<'_>, target: &mut Target<'_>) {
    for r in 0..rows.n_rows {
        let row = &rows.data[r * rows.stride..][..rows.len];
        let group = rows.group_base + r / rows.rows_per_group;
        add_row(row, rows.first_token, group, target);
    }
}

#[inline(always)]
fn add_row(row: &[f32], first_token: usize, group: usize, target: &mut Target<'_>) {
    let block = target.block;
    let n_groups = target.n_groups;
    let mut b = first_token / block;
    let in_block = first_token - b * block;
    // A leading partial block, then whole blocks; the division happens once per row.
    let take = (block - in_block).min(row.len());
    let (seg, mut rest) = row.split_at(take);
    add_segment(
        &mut target.lanes[b * n_groups + group],
        seg,
        in_block % LANES,
    );
    while !rest.is_empty() {
        b += 1;
        let take = block.min(rest.len());
        let (seg, tail) = rest.split_at(take);
        add_segment(&mut target.lanes[b * n_groups + group], seg, 0);
        rest = tail;
    }
}

#[inline(always)]
fn add_segment(lanes: &mut Lanes, seg: &[f32], lane0: usize) {
    let head = ((LANES - lane0) % LANES).min(seg.len());
    let (first, rest) = seg.split_at(head);
    for (i, &v) in first.iter().enumerate() {
        lanes[(lane0 + i) % LANES] += v;
    }
    // Sum the segment in registers first, then add it to the accumulator once.
    let mut acc: Lanes = [0.0; LANES];
    let mut chunks = rest.chunks_exact(LANES);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += *v;
        }
    }
    for (a, v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += *v;
    }
    for (l, a) in lanes.iter_mut().zip(acc) {
        *l += a;
    }
}

/// Folds each accumulator's lanes into one sum, adding into `out` (same indexing).
pub(crate) fn fold_lanes(lanes: &[Lanes], out: &mut [f32]) {
    for (o, l) in out.iter_mut().zip(lanes) {
        // Pairwise, so the result does not depend on the kernel.
        let mut v = *l;
        let mut w = LANES;
        while w > 1 {
            w /= 2;
            for i in 0..w {
                v[i] += v[i + w];
            }
        }
        *o += v[0];
    }
}
