//! Guards `limits::return_large_frees`: a large block freed is given back to the system, also
//! after glibc has seen one freed (by default it then serves blocks that size from the heap,
//! where their pages stay resident once freed).

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn a_large_block_is_mapped_on_its_own_after_one_was_freed() {
    let mapped = || {
        // SAFETY: mallinfo2 only reads the allocator's counters.
        unsafe { libc::mallinfo2() }.hblkhd
    };
    assert!(fawn_kv::limits::return_large_frees());
    let size = 1 << 20;
    for round in 0..3 {
        let before = mapped();
        let block = std::hint::black_box(vec![1u8; size]);
        assert!(mapped() >= before + size, "round {round}: the block came from the heap");
        drop(block);
        assert!(mapped() < before + size, "round {round}: the freed block stayed mapped");
    }
}
