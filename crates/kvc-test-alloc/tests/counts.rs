//! The allocator counts what a call holds: without this the limit tests that use it could
//! pass on a counter that never moves.

#[global_allocator]
static GLOBAL: kvc_test_alloc::Counting = kvc_test_alloc::Counting;

#[test]
fn measure_sees_the_peak_and_the_largest_request() {
    let (peak, largest) = kvc_test_alloc::measure(|| {
        let a = vec![1u8; 1000];
        let b = vec![2u8; 300];
        drop(a);
        let c = vec![3u8; 500];
        assert_eq!(b.len() + c.len(), 800);
    });
    assert!((1300..1400).contains(&peak), "peak {peak}");
    assert_eq!(largest, 1000);
    // outside measure nothing is counted
    let _v = vec![0u8; 1 << 20];
    let (peak, largest) = kvc_test_alloc::measure(|| {});
    assert_eq!((peak, largest), (0, 0));
}

#[test]
fn allocations_counts_every_request_of_this_thread() {
    let before = kvc_test_alloc::allocations();
    let a = std::hint::black_box(vec![1u8; 1000]);
    let mut b = std::hint::black_box(Vec::<u8>::with_capacity(10));
    b.resize(300, 2); // a realloc
    let c = std::hint::black_box(vec![0u8; 100]); // alloc_zeroed
    drop((a, b, c));
    assert_eq!(kvc_test_alloc::allocations() - before, 4);
    let before = kvc_test_alloc::allocations();
    let x = std::hint::black_box(5u64) * 3;
    assert_eq!(kvc_test_alloc::allocations(), before, "{x}");
}
