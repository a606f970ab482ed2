//! Writing to a peer that may have stopped reading: a write fails once the peer takes no
//! byte for a while, however long a steady but slow peer needs for the whole buffer.

use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Writes all of `buf`; fails with `TimedOut` if the peer takes no byte for `stall`.
pub async fn write_all_or_stall<W: AsyncWrite + Unpin>(
    writer: &mut W,
    mut buf: &[u8],
    stall: Duration,
) -> std::io::Result<()> {
    while !buf.is_empty() {
        match tokio::time::timeout(stall, writer.write(buf)).await {
            Ok(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => buf = &buf[n..],
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
        }
    }
    Ok(())
}
