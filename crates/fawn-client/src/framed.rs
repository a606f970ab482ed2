//! Reading native frames from a byte stream.

use fawn_proto::native::{decode_frame, FrameError, Message};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Read buffer growth step.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// Why a stream of frames ended.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("framing lost: {0}")]
    Frame(#[from] FrameError),
    #[error("connection closed in the middle of a frame")]
    Truncated,
}

/// Buffers a stream and yields whole frames.
pub struct FrameReader<R> {
    inner: R,
    buf: Vec<u8>,
    pos: usize,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        FrameReader { inner, buf: Vec::with_capacity(READ_CHUNK_BYTES), pos: 0 }
    }

    /// The next frame; `Ok(None)` on a clean end of stream between frames.
    pub async fn next(&mut self) -> Result<Option<(u64, Message)>, ReadError> {
        loop {
            if let Some((id, msg, used)) = decode_frame(&self.buf[self.pos..])? {
                self.pos += used;
                return Ok(Some((id, msg)));
            }
            if self.pos > 0 {
                self.buf.drain(..self.pos);
                self.pos = 0;
            }
            // read_buf fills spare capacity without zeroing it first.
            self.buf.reserve(READ_CHUNK_BYTES);
            let n = self.inner.read_buf(&mut self.buf).await?;
            if n == 0 {
                return if self.buf.is_empty() { Ok(None) } else { Err(ReadError::Truncated) };
            }
        }
    }
}
