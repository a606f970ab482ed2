use super::*;
use crate::limits::OFFSET_UNIT;

fn kh(i: u64) -> KeyHash {
    KeyHash::of(&i.to_le_bytes())
}

fn assert_finds(idx: &Index, n: u64) {
    let mut out = Vec::new();
    for i in 0..n {
        out.clear();
        idx.find(kh(i), &mut out);
        assert!(out.iter().any(|c| c.units == units_of(i)), "lost {i}");
    }
}

#[test]
fn fills_past_90_percent_and_finds_everything() {
    let mut t = Table::with_buckets(4096);
    let n = (t.capacity() as f64 * 0.95) as u64;
    for i in 0..n {
        t.insert(kh(i), units_of(i));
    }
    assert!(t.stash.len() < 8, "stash {}", t.stash.len());
    let mut out = Vec::new();
    for i in 0..n {
        out.clear();
        t.find(kh(i), &mut out);
        assert!(out.iter().any(|c| c.units == units_of(i)), "lost {i}");
    }
}

/// A pretend log: key i's record is one unit at units i + 2 (right after the header).
fn units_of(i: u64) -> u32 {
    i as u32 + 2
}

/// Insert key `i` at its place in the pretend log (every record so far lies below its
/// end); returns whether a refresh scan started.
fn insert_next(idx: &mut Index, i: u64) -> bool {
    idx.insert(kh(i), units_of(i), [(units_of(i) as u64 + 1) * OFFSET_UNIT, 0])
}

/// An index grown from the smallest table until its first refresh scan started, and the
/// last key inserted (keys 0 to it are in).
fn grow_until_refresh() -> (Index, u64) {
    let mut idx = Index::for_keys(0);
    let mut i = 0u64;
    while !insert_next(&mut idx, i) {
        i += 1;
    }
    (idx, i)
}

/// Scan up to `bytes` of the pretend log the way the store does; returns whether a
/// refresh was in progress.
fn scan_step(idx: &mut Index, bytes: u64) -> bool {
    match idx.growth_work() {
        GrowthWork::Idle => false,
        GrowthWork::Finish => {
            let left = idx.finish_migration();
            assert_eq!(left, 0, "the scan left entries behind");
            true
        }
        GrowthWork::Scan(job) => {
            let upto = (job.pos + bytes).min(job.limit);
            let found: Vec<_> =
                (job.pos / OFFSET_UNIT..upto / OFFSET_UNIT).map(|u| (kh(u - 2), u as u32)).collect();
            idx.apply_scan(&job, upto, &found);
            true
        }
    }
}

/// The load never drops far below its target while the table grows from its smallest
/// size, so DRAM per key stays near 6 B / 0.94 at every size, not only right before a
/// doubling.
#[test]
fn grows_a_bucket_at_a_time_at_high_load() {
    let mut idx = Index::for_keys(0);
    let n = 300_000u64;
    let mut lowest = 1.0f64;
    let mut levels = 0;
    for i in 0..n {
        levels += insert_next(&mut idx, i) as u32;
        let owed = idx.owe(1);
        if owed > 0 {
            scan_step(&mut idx, owed);
        }
        if i > 10_000 {
            lowest = lowest.min(idx.live() as f64 / idx.capacity() as f64);
        }
        if i % 20_000 == 0 {
            idx.cur.assert_counts();
        }
    }
    let per_key = idx.bytes() as f64 / idx.live() as f64;
    eprintln!("{levels} levels, lowest load {lowest:.3}, {per_key:.3} B/key, stash {}", idx.cur.stash.len());
    assert!(levels >= 8, "{levels} levels");
    assert!(lowest > 0.93, "load fell to {lowest}");
    assert!(per_key < 6.5, "{per_key} B/key");
    assert!(
        idx.cur.stash.len() <= STASH_ENTRIES_GROW_AT + SPLITS_PER_INSERT_MAX,
        "stash {}",
        idx.cur.stash.len()
    );
    assert_finds(&idx, n);
}

#[test]
fn grows_by_log_scan_and_image_roundtrips() {
    let mut idx = Index::for_keys(0);
    let n = 20_000u64;
    let mut grew = 0;
    for i in 0..n {
        grew += insert_next(&mut idx, i) as u32;
        // Overwrite an earlier key now and then: a write refreshes its entry.
        if i % 7 == 0 && i > 0 {
            let j = i / 2;
            let mut out = Vec::new();
            idx.find(kh(j), &mut out);
            let c = out.iter().find(|c| c.units == units_of(j)).copied().expect("present");
            idx.update(c.loc, kh(j), units_of(j));
        }
        let owed = idx.owe(1);
        if owed > 0 {
            scan_step(&mut idx, owed);
        }
    }
    assert!(grew >= 5, "grew {grew} times");
    assert_eq!(idx.live(), n);
    idx.cur.assert_counts();
    let mut img = Vec::new();
    image::write(&idx, &mut img);
    let bounds = image::Bounds { first: 2, end: n + 2, cold_end: 0 };
    let mut back = image::read(&img, bounds).unwrap();
    assert_eq!(back.is_migrating(), idx.is_migrating());
    while scan_step(&mut back, 4096) {}
    assert!(!back.is_migrating());
    assert_eq!(back.live(), n);
    assert_finds(&back, n);
    assert!(image::read(&img[..img.len() - 1], bounds).is_err());
}

/// Entries whose records a refresh scan could not read end in the stash, still found by
/// their keys, and the table keeps growing past them.
#[test]
fn unscanned_entries_are_stashed_not_lost() {
    let (mut idx, i) = grow_until_refresh();
    // The scan reads nothing (as if every record failed its checksum).
    while let GrowthWork::Scan(job) = idx.growth_work() {
        idx.apply_scan(&job, job.limit, &[]);
    }
    let left = idx.finish_migration();
    assert!(left > 0);
    idx.cur.assert_counts();
    assert_eq!(idx.live(), i + 1);
    assert_finds(&idx, i + 1);
    let n = i + 1 + 5_000;
    for j in i + 1..n {
        insert_next(&mut idx, j);
        while idx.owe(1) > 0 && scan_step(&mut idx, 1 << 20) {}
    }
    assert!(idx.capacity() as f64 * 0.95 >= (n - left) as f64, "the table stopped growing");
    assert_finds(&idx, n);
}

/// A damaged checkpoint image is refused or read, never a panic nor a huge allocation:
/// every byte flip, and every truncation, of a grown index with a refresh scan running.
#[test]
fn damaged_images_never_panic() {
    let (idx, i) = grow_until_refresh();
    let mut img = Vec::new();
    image::write(&idx, &mut img);
    let bounds = image::Bounds { first: 2, end: i + 3, cold_end: 0 };
    assert!(image::read(&img, bounds).is_ok());
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for at in 0..img.len() {
        seed = mix(seed);
        let mut bad = img.clone();
        bad[at] ^= (seed as u8) | 1;
        let _ = image::read(&bad, bounds);
        let _ = image::read(&img[..at], bounds);
    }
}

/// A displaced entry's hash bits follow it: after kicks and many splits every key is
/// still in one of its two buckets.
#[test]
fn kicked_entries_keep_their_split_bits() {
    let mut idx = Index::for_keys(0);
    let n = 60_000u64;
    for i in 0..n {
        insert_next(&mut idx, i);
        while idx.owe(1) > 0 && scan_step(&mut idx, 1 << 20) {}
    }
    while scan_step(&mut idx, 1 << 20) {}
    let t = &idx.cur;
    for i in 0..n {
        let w = t.find_exact(kh(i), units_of(i));
        assert!(matches!(w, Some(Where::Slot(_)) | Some(Where::Stash(_))), "key {i} not in its buckets");
    }
}
