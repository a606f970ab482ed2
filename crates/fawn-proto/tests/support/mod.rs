//! Shared by the parser property tests.

/// Splits `data` at the given cut points (taken modulo its length), as reads would.
pub fn split<'a>(data: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
    points.sort_unstable();
    let mut chunks = Vec::new();
    let mut start = 0;
    for p in points {
        chunks.push(&data[start..p]);
        start = p;
    }
    chunks.push(&data[start..]);
    chunks
}
