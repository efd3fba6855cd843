//! The element types a KV-cache tensor may hold: kvc's shared [`Dtype`]. The codecs never
//! interpret values: a dtype only fixes the element width, which is the number of byte
//! streams (lanes) a tensor is split into. fp16 and bf16 are treated alike.

pub use kvc_types::Dtype;

use crate::error::Error;

impl From<kvc_types::UnknownDtype> for Error {
    fn from(e: kvc_types::UnknownDtype) -> Error {
        Error::UnknownDtype { name: e.name }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_name_becomes_the_codec_error() {
        let err: Error = "fp16".parse::<Dtype>().unwrap_err().into();
        assert!(matches!(err, Error::UnknownDtype { ref name } if name == "fp16"));
        assert_eq!(
            err.to_string(),
            "unknown dtype \"fp16\" (expected f16, bf16, f32 or i8)"
        );
    }
}
