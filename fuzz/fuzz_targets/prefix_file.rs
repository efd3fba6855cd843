//! Fuzz the kv-prefix file reader (docs/formats/kv-prefix.md) the way a load meets a saved
//! file: `PrefixFile::read`, then `Tiers::import_prefix` into a front's memory tier and a
//! restore of the file's tokens. Any bytes give an error or an import, never a panic, an
//! out-of-bounds access or an allocation the file's length does not justify:
//! - `read` never allocates a single block over `input length + 4 KiB`, nor holds over
//!   `2 x input length + 4 KiB` at once (a counting global allocator);
//! - `read` and `import_prefix` agree: a file `read` refuses is refused by the import with
//!   the same kind (corrupt data); a file it accepts imports, or is refused as foreign
//!   exactly when no front has its fingerprint, or as corrupt for a blob the front's codec
//!   or layout refuses; nothing is imported from a refused file;
//! - an imported file: its tokens are the file's, its chunks all in the memory tier, a
//!   restore gives at most those tokens, and the writer given what the reader read writes
//!   the input back byte for byte (one encoding per content).
//!
//! Every input runs twice: as it is, and with its last 32 bytes replaced by the BLAKE3 of
//! the rest, so that mutations get past the file's checksum to the blob lengths, the
//! blobs' own checks and their keys.
//!
//! The fronts: every codec id (raw, gear-v1, gear-v2, the three kvq presets and tc with the
//! golden files' fixed calibration) on the golden files' layout (2 layers, 2 KV heads of
//! 64, f16, chunks of 4 tokens, model hash `0x5a` x 32), so the golden files of
//! `crates/kvc-store-tiers/tests/golden/kv-prefix-v1/` are seeds as they are.
//! With `KVC_FUZZ_WRITE_SEEDS=<dir>` the first call also writes, per codec, the file of the
//! embedded sample's (data/sample) first two chunks and two more tokens; scripts/fuzz-all.sh
//! does this.
#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use kvc_store_tiers::prefix_file::{self, PrefixFile, CHECKSUM_LEN, HEADER_LEN};
use kvc_store_tiers::{ChunkCodec, ChunkShape, ErrorKind, MemoryTier, Tier, Tiers, TiersConfig};
use kvc_transform_coder::golden::fixed_calibration;
use kvc_transform_coder::TransformCodec;
use kvc_types::Dtype;
use libfuzzer_sys::fuzz_target;

/// Counts what the armed thread allocates: bytes held now, their peak, the largest request.
/// Only that thread: the rayon workers a previous input's restore started may still be
/// starting up (allocating) while the next input is read.
struct Counting;

thread_local! {
    static ARMED: Cell<bool> = const { Cell::new(false) };
}
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);
static LARGEST: AtomicUsize = AtomicUsize::new(0);

fn armed() -> bool {
    // A const-initialised Cell has no destructor: never unavailable, never allocates.
    ARMED.try_with(Cell::get).unwrap_or(false)
}

fn grew(by: isize, request: usize) {
    if armed() {
        let now = LIVE.fetch_add(by, Relaxed) + by;
        PEAK.fetch_max(now, Relaxed);
        LARGEST.fetch_max(request, Relaxed);
    }
}

// SAFETY: every call is forwarded to `System` with the caller's layout and pointer
// unchanged; the counters are atomics and allocate nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size() as isize, layout.size());
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size() as isize, layout.size());
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        grew(-(layout.size() as isize), 0);
        // SAFETY: `ptr` was allocated by `System` (every allocation goes through here) with
        // `layout`, as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size as isize - layout.size() as isize, new_size);
        // SAFETY: as `dealloc`; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Runs `f` with the counters armed on this thread (`read` spawns nothing);
/// returns its result, the peak bytes held above what was held before, and the largest
/// single request.
fn counted<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    LIVE.store(0, Relaxed);
    PEAK.store(0, Relaxed);
    LARGEST.store(0, Relaxed);
    ARMED.with(|a| a.set(true));
    let r = f();
    ARMED.with(|a| a.set(false));
    (r, PEAK.load(Relaxed).max(0) as usize, LARGEST.load(Relaxed))
}

const SHAPE: ChunkShape = ChunkShape {
    n_layer: 2,
    n_kv_head: 2,
    head_dim: 64,
    dtype: Dtype::F16,
    chunk_tokens: 4,
};
/// The embedded sample: `[4][512][3][64]` f16.
const SAMPLE_K: &[u8] = include_bytes!("../../data/sample/textA.K.f16.bin");
const SAMPLE_V: &[u8] = include_bytes!("../../data/sample/textA.V.f16.bin");
const SAMPLE_TOKENS: usize = 512;
const SAMPLE_HEADS: usize = 3;
const SLACK: usize = 4096;

struct Front {
    mem: Arc<MemoryTier>,
    tiers: Tiers,
}

fn fronts() -> &'static [Front] {
    static F: OnceLock<Vec<Front>> = OnceLock::new();
    F.get_or_init(|| {
        ChunkCodec::ALL
            .into_iter()
            .map(|codec| {
                let mem = Arc::new(MemoryTier::new(1 << 30));
                let cfg = TiersConfig {
                    shape: SHAPE,
                    codec,
                    model_hash: [0x5a; 32],
                };
                let tiers: Vec<Box<dyn Tier>> = vec![Box::new(mem.clone())];
                let tiers = match codec {
                    ChunkCodec::Transform => {
                        let cal =
                            fixed_calibration(SHAPE.n_layer, SHAPE.n_kv_head, SHAPE.head_dim, 2);
                        let tc =
                            TransformCodec::from_file(&cal.to_bytes().unwrap(), "tc-0.05").unwrap();
                        Tiers::with_transform(cfg, Arc::new(tc), tiers)
                    }
                    _ => Tiers::new(cfg, tiers),
                }
                .unwrap();
                Front { mem, tiers }
            })
            .collect()
    })
}

/// Tokens `0..n` of the sample's first two layers and first two KV heads, layer-major, as
/// `Tiers::store` takes them.
fn sample(src: &[u8], n: usize) -> Vec<u8> {
    let row = SAMPLE_HEADS * SHAPE.head_dim * 2;
    let keep = SHAPE.row_bytes();
    let mut out = Vec::new();
    for l in 0..SHAPE.n_layer {
        for t in 0..n {
            let at = (l * SAMPLE_TOKENS + t) * row;
            out.extend_from_slice(&src[at..at + keep]);
        }
    }
    out
}

fn write_seeds(dir: &std::path::Path) {
    std::fs::create_dir_all(dir).unwrap();
    let tokens: Vec<u32> = (0..10).map(|i| 1000 + 37 * i).collect();
    let (k, v) = (sample(SAMPLE_K, 10), sample(SAMPLE_V, 10));
    for f in fronts() {
        f.tiers.store(&tokens, &k, &v, tokens.len()).unwrap();
        let bytes = f.tiers.export_prefix(&tokens).unwrap().bytes;
        for key in f.tiers.keys(&tokens) {
            f.mem.remove(&key).unwrap();
        }
        let name = f.tiers.codec().name();
        std::fs::write(dir.join(format!("sample-{name}")), bytes).unwrap();
    }
    let empty = fronts()[2].tiers.export_prefix(&tokens[..3]).unwrap().bytes;
    std::fs::write(dir.join("sample-no-chunks"), empty).unwrap();
}

fn check(data: &[u8]) {
    let n = data.len();
    let (read, peak, largest) = counted(|| PrefixFile::read(data));
    assert!(
        largest <= n + SLACK,
        "an allocation of {largest} bytes reading {n}"
    );
    assert!(
        peak <= 2 * n + SLACK,
        "{peak} bytes held at once reading {n}"
    );
    let fp = data.get(32..64);
    let front = fronts()
        .iter()
        .find(|f| Some(&f.tiers.fingerprint().0[..]) == fp)
        .unwrap_or(&fronts()[0]);
    let imported = front.tiers.import_prefix(data);
    let file = match read {
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::CorruptData, "{e}");
            let i = imported.expect_err("a file read refuses was imported");
            assert_eq!(i.kind(), ErrorKind::CorruptData, "{i}");
            assert_eq!(
                front.mem.stats().entries,
                0,
                "a refused file imported chunks"
            );
            return;
        }
        Ok(f) => f,
    };
    let foreign = file.fingerprint() != front.tiers.fingerprint();
    let imp = match imported {
        Err(e) => {
            if foreign {
                assert_eq!(e.kind(), ErrorKind::Foreign, "{e}");
            } else {
                assert_eq!(e.kind(), ErrorKind::CorruptData, "{e}");
            }
            assert_eq!(
                front.mem.stats().entries,
                0,
                "a refused file imported chunks"
            );
            return;
        }
        Ok(imp) => imp,
    };
    assert!(!foreign, "a foreign file was imported");
    assert_eq!(imp.tokens, file.tokens());
    assert_eq!(imp.chunks, file.n_chunks());
    assert_eq!(imp.tokens_covered, file.tokens_covered());
    let r = front.tiers.restore(&imp.tokens);
    assert!(r.tokens <= imp.tokens_covered);
    let blobs: Vec<&[u8]> = file.chunks().map(|(_, b)| b).collect();
    let again = prefix_file::write(
        file.fingerprint(),
        file.chunk_tokens(),
        file.tokens(),
        &blobs,
    )
    .unwrap();
    assert!(again == data, "the writer does not give the file back");
    for (key, _) in file.chunks() {
        front.mem.remove(&key).unwrap();
    }
    assert_eq!(front.mem.stats().entries, 0);
}

fuzz_target!(|data: &[u8]| {
    static SEEDS: OnceLock<()> = OnceLock::new();
    SEEDS.get_or_init(|| {
        if let Some(d) = std::env::var_os("KVC_FUZZ_WRITE_SEEDS") {
            write_seeds(std::path::Path::new(&d));
        }
    });
    check(data);
    if data.len() >= HEADER_LEN + CHECKSUM_LEN {
        let mut sealed = data.to_vec();
        let body = sealed.len() - CHECKSUM_LEN;
        let sum = *blake3::hash(&sealed[..body]).as_bytes();
        if sealed[body..] != sum {
            sealed[body..].copy_from_slice(&sum);
            check(&sealed);
        }
    }
});
