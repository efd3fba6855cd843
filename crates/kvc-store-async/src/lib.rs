//! An asynchronous compressed KV store that really frees memory and restores on demand.
//!
//! `kvc-store-async` compresses cold token ranges of a kvc-owned cache on a worker pool,
//! releases the raw range only after the blob has been verified, and restores ranges
//! bit-exactly before a layer's attention through a two-level decode cache. It does not
//! choose which tokens are cold (that is the caller's scope and policy) and does not define
//! a codec (the codec is a parameter).
