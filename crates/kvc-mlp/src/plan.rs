//! How a sequence is split and how long it becomes: pure arithmetic, no tensors.

use crate::error::{Error, Result};

/// The options of one compression call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressParams {
    /// Tokens per group (must match the weights: the first Linear takes `head_dim * factor`).
    pub factor: usize,
    /// A segment with fewer than this many whole groups is left unchanged.
    pub min_seq_len: usize,
    /// Length of the image prefix, compressed with the image MLPs; 0 for text only.
    pub image_kv_len: usize,
}

/// The lengths after compression. Engines disagree on which one the next token's RoPE uses,
/// so both are kept: `rope_position` is the original sequence length, `kv_len` the number of
/// cache rows now holding data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressedLen {
    /// The original length `S`: the position of the next token in the text.
    pub rope_position: usize,
    /// The new cache length `S_new <= S`.
    pub kv_len: usize,
}

/// What happens to one segment (the image prefix or the text rest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentPlan {
    /// First input token of the segment.
    pub start: usize,
    /// Input tokens in the segment.
    pub len: usize,
    /// Groups pushed through the MLP (0: the segment is copied unchanged).
    pub groups: usize,
    /// Tokens the segment occupies after compression.
    pub out_len: usize,
}

impl SegmentPlan {
    fn new(start: usize, len: usize, factor: usize, min_seq_len: usize, has_mlp: bool) -> Self {
        let groups = len / factor;
        if !has_mlp || groups == 0 || groups < min_seq_len {
            SegmentPlan {
                start,
                len,
                groups: 0,
                out_len: len,
            }
        } else {
            SegmentPlan {
                start,
                len,
                groups,
                out_len: groups + len % factor,
            }
        }
    }
}

/// The whole plan for one sequence: `[image | text]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SequencePlan {
    /// The image prefix `[0, image_kv_len)`.
    pub image: SegmentPlan,
    /// The text rest `[image_kv_len, S)`.
    pub text: SegmentPlan,
}

impl SequencePlan {
    /// Plans a sequence of `seq_len` tokens. With no text MLPs nothing is compressed; with no
    /// image MLPs the image prefix is copied unchanged.
    pub fn new(
        seq_len: usize,
        params: &CompressParams,
        has_text_mlps: bool,
        has_image_mlps: bool,
    ) -> Result<Self> {
        if params.factor == 0 {
            return Err(Error::invalid("factor", "must be at least 1"));
        }
        if params.image_kv_len > seq_len {
            return Err(Error::invalid(
                "image_kv_len",
                format!(
                    "{} exceeds the sequence length {seq_len}",
                    params.image_kv_len
                ),
            ));
        }
        let n = params.image_kv_len;
        let image = SegmentPlan::new(
            0,
            n,
            params.factor,
            params.min_seq_len,
            has_text_mlps && has_image_mlps,
        );
        let text = SegmentPlan::new(
            n,
            seq_len - n,
            params.factor,
            params.min_seq_len,
            has_text_mlps,
        );
        Ok(SequencePlan { image, text })
    }

    /// The lengths after compression.
    pub fn lengths(&self) -> CompressedLen {
        CompressedLen {
            rope_position: self.image.len + self.text.len,
            kv_len: self.image.out_len + self.text.out_len,
        }
    }

    /// Whether any token is changed.
    pub fn is_identity(&self) -> bool {
        self.image.groups == 0 && self.text.groups == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(factor: usize, min_seq_len: usize, image_kv_len: usize) -> CompressParams {
        CompressParams {
            factor,
            min_seq_len,
            image_kv_len,
        }
    }

    #[test]
    fn text_only_groups_and_remainder() {
        let plan = SequencePlan::new(4096, &p(5, 2, 0), true, true).unwrap();
        assert_eq!(plan.text.groups, 819);
        assert_eq!(
            plan.lengths(),
            CompressedLen {
                rope_position: 4096,
                kv_len: 820
            }
        );
    }

    #[test]
    fn below_min_seq_len_is_unchanged() {
        let plan = SequencePlan::new(9, &p(5, 2, 0), true, true).unwrap();
        assert!(plan.is_identity());
        assert_eq!(plan.lengths().kv_len, 9);
        let plan = SequencePlan::new(10, &p(5, 2, 0), true, true).unwrap();
        assert_eq!(plan.lengths().kv_len, 2);
    }

    #[test]
    fn image_prefix_and_missing_mlps() {
        let plan = SequencePlan::new(33, &p(4, 1, 13), true, true).unwrap();
        assert_eq!((plan.image.groups, plan.image.out_len), (3, 4));
        assert_eq!(
            (plan.text.start, plan.text.groups, plan.text.out_len),
            (13, 5, 5)
        );
        let plan = SequencePlan::new(33, &p(4, 1, 13), true, false).unwrap();
        assert_eq!(plan.image.out_len, 13);
        assert_eq!(plan.lengths().kv_len, 18);
        let plan = SequencePlan::new(33, &p(4, 1, 13), false, true).unwrap();
        assert!(plan.is_identity());
        assert_eq!(plan.lengths().kv_len, 33);
    }

    #[test]
    fn bad_params() {
        assert!(SequencePlan::new(10, &p(0, 2, 0), true, true).is_err());
        assert!(SequencePlan::new(10, &p(5, 2, 11), true, true).is_err());
        assert!(SequencePlan::new(10, &p(5, 2, 10), true, true).is_ok());
    }
}
