//! One module per command area (`codec`, `bench`, `h2o`, `mlp`, `quant`, ...), each with
//! its clap arguments and a `run` function returning `Result<(), CliError>`.

pub mod bench;
pub mod codec;
pub mod dump;
pub mod h2o;
pub mod kvq_apply;
pub mod kvq_inspect;
pub mod kvq_plan;
pub mod mlp;
pub mod mlp_train;
pub mod quant;
pub mod tc;
