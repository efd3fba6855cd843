//! kvc-owned KV storage in anonymous memory mappings, where releasing a token range
//! really returns its pages to the operating system (`madvise(MADV_DONTNEED)`), and
//! resident memory can be measured (`mincore`). Store mode relies on this: once a range
//! is compressed elsewhere, its raw pages stop costing memory.

use std::ptr::NonNull;

use crate::compact::token_spans;
use crate::error::{Error, Result};
use crate::layout::{KvLayout, LayerMut, TensorLayout};

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The operating system's page size in bytes.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p <= 0 {
        4096
    } else {
        p as usize
    }
}

/// A zero-initialised byte buffer in its own anonymous mapping.
#[derive(Debug)]
pub struct PagedBuffer {
    ptr: NonNull<u8>,
    len: usize,
    map_len: usize,
}

// SAFETY: PagedBuffer owns its mapping exclusively, like a Vec<u8>; access goes through
// &self / &mut self, so the usual borrow rules make sharing and sending sound.
unsafe impl Send for PagedBuffer {}
// SAFETY: as above; &PagedBuffer only gives shared read access.
unsafe impl Sync for PagedBuffer {}

impl PagedBuffer {
    /// Maps `len` zeroed bytes (`len >= 1`); pages are only backed by memory once written.
    pub fn new(len: usize) -> Result<PagedBuffer> {
        if len == 0 {
            return Err(Error::InvalidShape {
                field: "len",
                value: 0,
                reason: "must be at least 1",
            });
        }
        let ps = page_size();
        let map_len = len
            .checked_next_multiple_of(ps)
            .filter(|&m| m <= isize::MAX as usize)
            .ok_or(Error::SizeOverflow {
                what: "mapping length",
            })?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Os {
                call: "mmap",
                errno: errno(),
            });
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(Error::Os {
            call: "mmap",
            errno: 0,
        })?;
        Ok(PagedBuffer { ptr, len, map_len })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Always false (a buffer has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr maps map_len >= len readable bytes for the life of self; the
        // mapping is zero-initialised, so every byte is initialised.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Zeroes bytes `[start, end)` and returns the whole pages inside that range to the
    /// operating system; returns how many bytes were returned. The range reads as zero
    /// afterwards and is backed by memory again once written.
    pub fn release(&mut self, start: usize, end: usize) -> Result<usize> {
        if start > end || end > self.len {
            return Err(Error::InvalidRange {
                start,
                end,
                limit: self.len,
            });
        }
        let ps = page_size();
        let a = start.next_multiple_of(ps);
        // The last page may extend past len; its tail is ours (map_len) and unused.
        let b = if end == self.len {
            self.map_len
        } else {
            end - end % ps
        };
        if a >= b {
            self.as_mut_slice()[start..end].fill(0);
            return Ok(0);
        }
        self.as_mut_slice()[start..a].fill(0);
        if b < end {
            self.as_mut_slice()[b..end].fill(0);
        }
        // SAFETY: [a, b) is page-aligned and inside our mapping; MADV_DONTNEED on a
        // private anonymous mapping makes those pages read back as zero, which is the
        // state we promise, and no reference into them outlives &mut self.
        let rc =
            unsafe { libc::madvise(self.ptr.as_ptr().add(a).cast(), b - a, libc::MADV_DONTNEED) };
        if rc != 0 {
            return Err(Error::Os {
                call: "madvise",
                errno: errno(),
            });
        }
        Ok(b - a)
    }

    /// Bytes of this buffer currently resident in memory (whole pages).
    pub fn resident_bytes(&self) -> Result<usize> {
        let ps = page_size();
        let pages = self.map_len / ps;
        let mut vec = vec![0u8; pages];
        // SAFETY: the range is our page-aligned mapping and vec has one byte per page.
        let rc = unsafe {
            libc::mincore(
                self.ptr.as_ptr().cast(),
                self.map_len,
                vec.as_mut_ptr().cast(),
            )
        };
        if rc != 0 {
            return Err(Error::Os {
                call: "mincore",
                errno: errno(),
            });
        }
        Ok(vec.iter().filter(|&&b| b & 1 != 0).count() * ps)
    }
}

impl Drop for PagedBuffer {
    fn drop(&mut self) {
        // SAFETY: we own the mapping [ptr, ptr + map_len) and nothing borrows it now.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.map_len);
        }
    }
}

/// A whole cache in kvc-owned paged storage: one K and one V buffer per layer.
#[derive(Debug)]
pub struct OwnedCache {
    layers: Vec<(KvLayout, PagedBuffer, PagedBuffer)>,
}

impl OwnedCache {
    /// One layer per layout (layers may differ, e.g. in head count).
    pub fn new(layouts: &[KvLayout]) -> Result<OwnedCache> {
        let layers = layouts
            .iter()
            .map(|l| {
                Ok((
                    *l,
                    PagedBuffer::new(l.k.byte_len())?,
                    PagedBuffer::new(l.v.byte_len())?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(OwnedCache { layers })
    }

    /// `n_layers` layers of the same layout.
    pub fn uniform(layout: KvLayout, n_layers: usize) -> Result<OwnedCache> {
        OwnedCache::new(&vec![layout; n_layers])
    }

    /// Layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layer `i`'s layout.
    pub fn layout(&self, i: usize) -> Option<&KvLayout> {
        self.layers.get(i).map(|l| &l.0)
    }

    /// Layer `i`'s K and V bytes.
    pub fn layer(&self, i: usize) -> Option<(&[u8], &[u8])> {
        self.layers.get(i).map(|l| (l.1.as_slice(), l.2.as_slice()))
    }

    fn check_layer(&self, i: usize) -> Result<()> {
        if i >= self.layers.len() {
            return Err(Error::InvalidCell {
                what: "layer",
                value: i as i64,
                limit: self.layers.len() as i64,
            });
        }
        Ok(())
    }

    /// Layer `i`, borrowed for the in-place operations.
    pub fn layer_mut(&mut self, i: usize) -> Result<LayerMut<'_>> {
        self.check_layer(i)?;
        let (l, k, v) = &mut self.layers[i];
        LayerMut::new(*l, k.as_mut_slice(), v.as_mut_slice())
    }

    /// Every layer, borrowed at once.
    pub fn layers_mut(&mut self) -> Result<Vec<LayerMut<'_>>> {
        self.layers
            .iter_mut()
            .map(|(l, k, v)| LayerMut::new(*l, k.as_mut_slice(), v.as_mut_slice()))
            .collect()
    }

    /// Zeroes tokens `[start, end)` of layer `i` and returns their whole pages to the
    /// OS; returns the bytes returned.
    pub fn release_tokens(&mut self, i: usize, start: usize, end: usize) -> Result<usize> {
        self.check_layer(i)?;
        let (l, k, v) = &mut self.layers[i];
        Ok(release(k, &l.k, start, end)? + release(v, &l.v, start, end)?)
    }

    /// Bytes resident in memory, all layers.
    pub fn resident_bytes(&self) -> Result<usize> {
        let mut sum = 0;
        for (_, k, v) in &self.layers {
            sum += k.resident_bytes()? + v.resident_bytes()?;
        }
        Ok(sum)
    }

    /// Bytes mapped, all layers.
    pub fn byte_len(&self) -> usize {
        self.layers.iter().map(|(_, k, v)| k.len() + v.len()).sum()
    }
}

fn release(
    buf: &mut PagedBuffer,
    layout: &TensorLayout,
    start: usize,
    end: usize,
) -> Result<usize> {
    let es = layout.dtype().size();
    let mut n = 0;
    for (o, l) in token_spans(layout, start, end)? {
        n += buf.release(o * es, (o + l) * es)?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvc_types::Dtype;

    #[test]
    fn release_returns_pages_and_zeroes() {
        let ps = page_size();
        let mut b = PagedBuffer::new(64 * ps + 100).unwrap();
        assert_eq!(b.resident_bytes().unwrap(), 0);
        b.as_mut_slice().fill(7);
        assert_eq!(b.resident_bytes().unwrap(), 65 * ps);
        let got = b.release(ps / 2, 40 * ps + 3).unwrap();
        assert_eq!(got, 39 * ps);
        assert_eq!(b.resident_bytes().unwrap(), 26 * ps);
        let s = b.as_slice();
        assert!(s[..ps / 2].iter().all(|&x| x == 7));
        assert!(s[ps / 2..40 * ps + 3].iter().all(|&x| x == 0));
        assert!(s[40 * ps + 3..].iter().all(|&x| x == 7));
        // Releasing up to the end covers the partial last page too.
        assert_eq!(b.release(60 * ps, b.len()).unwrap(), 5 * ps);
        assert!(b.release(3, 2).is_err());
        assert!(b.release(0, b.len() + 1).is_err());
        assert!(PagedBuffer::new(0).is_err());
    }

    #[test]
    fn owned_cache_release_tokens() {
        let l = KvLayout::llama(Dtype::F16, 4, 64, 64, 4096, false).unwrap();
        let mut c = OwnedCache::uniform(l, 2).unwrap();
        for mut layer in c.layers_mut().unwrap() {
            let (k, v) = layer.kv_mut();
            k.fill(1);
            v.fill(1);
        }
        let full = c.resident_bytes().unwrap();
        assert_eq!(full, c.byte_len());
        let freed = c.release_tokens(1, 1024, 3072).unwrap();
        assert_eq!(freed, 2 * 2048 * 256 * 2);
        assert_eq!(c.resident_bytes().unwrap(), full - freed);
        let (k, _) = c.layer(1).unwrap();
        assert!(k[1024 * 512..3072 * 512].iter().all(|&x| x == 0));
        assert!(k[..1024 * 512].iter().all(|&x| x == 1));
        assert!(c.release_tokens(2, 0, 1).is_err());
        assert!(c.release_tokens(0, 0, 4097).is_err());
    }
}
