//! One module per command area (`codec`, `bench`, `h2o`, `mlp`, `quant`, ...), each with
//! its clap arguments and a `run` function returning `Result<(), CliError>`.

pub mod h2o;
pub mod mlp;
// Hooked under `kvc bench cache` by the integrator (the `kvc bench` command is being
// written in parallel); unused until then.
#[allow(dead_code)]
pub mod bench_cache;
pub mod quant;
