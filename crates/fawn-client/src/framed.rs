//! Reading native frames from a byte stream.

use std::time::Duration;

use fawn_proto::native::{decode_frame, FrameError, Message};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

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
    #[error("no frame began within {0:?}")]
    Idle(Duration),
    #[error("a frame took longer than {0:?} to arrive")]
    SlowFrame(Duration),
}

/// How long a reader waits for frames (see [`FrameReader::next_within`]).
#[derive(Clone, Copy, Debug)]
pub struct ReadTimeouts {
    /// Most time between frames: from the end of one frame to the first byte of the next.
    pub idle: Duration,
    /// Most time from a frame's first byte to its last (a peer dripping bytes holds a
    /// connection and its buffer no longer than this).
    pub frame: Duration,
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
            if let Some(frame) = self.decode()? {
                return Ok(Some(frame));
            }
            if self.fill().await? == 0 {
                return self.end();
            }
        }
    }

    /// As [`FrameReader::next`], but gives up when no frame begins within `timeouts.idle` or
    /// a begun frame does not complete within `timeouts.frame`.
    pub async fn next_within(&mut self, timeouts: ReadTimeouts) -> Result<Option<(u64, Message)>, ReadError> {
        let started = Instant::now();
        let mut frame_started = (self.buf.len() > self.pos).then_some(started);
        loop {
            if let Some(frame) = self.decode()? {
                return Ok(Some(frame));
            }
            let (deadline, error) = match frame_started {
                Some(at) => (at + timeouts.frame, ReadError::SlowFrame(timeouts.frame)),
                None => (started + timeouts.idle, ReadError::Idle(timeouts.idle)),
            };
            let n = match tokio::time::timeout_at(deadline, self.fill()).await {
                Ok(n) => n?,
                Err(_) => return Err(error),
            };
            if n == 0 {
                return self.end();
            }
            frame_started.get_or_insert_with(Instant::now);
        }
    }

    /// The next frame if it is already read in whole, without reading more.
    pub fn buffered(&mut self) -> Result<Option<(u64, Message)>, ReadError> {
        self.decode()
    }

    fn decode(&mut self) -> Result<Option<(u64, Message)>, ReadError> {
        match decode_frame(&self.buf[self.pos..])? {
            Some((id, msg, used)) => {
                self.pos += used;
                Ok(Some((id, msg)))
            }
            None => Ok(None),
        }
    }

    /// Reads more bytes; 0 at end of stream.
    async fn fill(&mut self) -> std::io::Result<usize> {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        // read_buf fills spare capacity without zeroing it first.
        self.buf.reserve(READ_CHUNK_BYTES);
        self.inner.read_buf(&mut self.buf).await
    }

    fn end(&self) -> Result<Option<(u64, Message)>, ReadError> {
        if self.buf.len() == self.pos {
            Ok(None)
        } else {
            Err(ReadError::Truncated)
        }
    }
}
