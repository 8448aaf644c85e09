//! Where sanitized output goes, on a writer thread of its own.

use std::fs::File;
use std::io::{self, Write};

/// Where sanitized output goes: `output.log`, within the cap, surviving a full disk, with a
/// byte on the launcher's change channel per stored chunk.
pub(super) struct Output {
    pub(super) out: File,
    pub(super) cap: u64,
    pub(super) written: u64,
    pub(super) dropped: u64,
    pub(super) write_error: Option<String>,
    pub(super) events: Option<File>,
    /// The buffer handed out while writing inline, kept between reads (a fresh 256 KiB
    /// allocation per read is an mmap and a munmap each).
    pub(super) spare: Vec<u8>,
}

impl Output {
    /// Output into `out` under `cap` bytes, nothing written yet.
    pub(super) fn new(out: File, cap: u64) -> Output {
        Output {
            out,
            cap,
            written: 0,
            dropped: 0,
            write_error: None,
            events: None,
            spare: Vec::new(),
        }
    }

    /// Appends sanitized output, honouring the cap and surviving a full disk.
    pub(super) fn store(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if self.write_error.is_some() {
            self.dropped += data.len() as u64;
            return;
        }
        let room = self.cap.saturating_sub(self.written);
        let mut take = data.len().min(room as usize);
        if take < data.len() {
            // Never store half a character.
            while take > 0 && data[take] & 0xC0 == 0x80 {
                take -= 1;
            }
        }
        if take > 0 {
            if let Err(e) = self.out.write_all(&data[..take]) {
                self.write_error = Some(format!("output could not be stored: {e}"));
                self.dropped += data.len() as u64;
                return;
            }
            self.written += take as u64;
            self.notify();
        }
        self.dropped += (data.len() - take) as u64;
    }

    /// Tells the launcher (if it still listens) that output arrived; never blocks.
    pub(super) fn notify(&mut self) {
        if let Some(ev) = &mut self.events
            && let Err(e) = ev.write(b".")
            && e.kind() != io::ErrorKind::WouldBlock
        {
            self.events = None;
        }
    }
}

/// The size of one read from the job's pipe, and of the chunks handed to the writer.
pub(super) const CHUNK: usize = 256 * 1024;
/// The first read's size; each read that fills the buffer makes it four times larger, up
/// to [`CHUNK`].
pub(super) const FIRST_READ: usize = 16 * 1024;

/// The output, written here or on a writer thread: a flood is read and sanitized while the
/// previous chunk is being written, instead of one after the other.
pub(super) enum Sink {
    Inline(Output),
    Threaded {
        tx: std::sync::mpsc::SyncSender<Vec<u8>>,
        spare: std::sync::mpsc::Receiver<Vec<u8>>,
        handle: std::thread::JoinHandle<Output>,
    },
    /// Only while being converted, or if the writer thread died.
    Moved,
}

impl Sink {
    pub(super) fn set_events(&mut self, ev: Option<File>) {
        if let Sink::Inline(o) = self {
            o.events = ev;
        }
    }

    /// Moves the writing to its own thread. Signals stay blocked there too (a thread
    /// inherits the mask), so they still arrive only through the signalfd.
    pub(super) fn threaded(self) -> Sink {
        let Sink::Inline(output) = self else {
            return self;
        };
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(4);
        let (spare_tx, spare) = std::sync::mpsc::channel::<Vec<u8>>();
        let (otx, orx) = std::sync::mpsc::channel::<Output>();
        let spawned = std::thread::Builder::new()
            .name("output".into())
            .stack_size(64 << 10)
            .spawn(move || {
                let mut output = orx.recv().expect("the output is handed over at once");
                for mut chunk in rx {
                    output.store(&chunk);
                    chunk.clear();
                    let _ = spare_tx.send(chunk);
                }
                output
            });
        match spawned {
            Ok(handle) => match otx.send(output) {
                Ok(()) => Sink::Threaded { tx, spare, handle },
                Err(e) => Sink::Inline(e.0),
            },
            // No thread to be had: the closure (and the output it was to receive) is gone,
            // but the output itself was never moved into it.
            Err(_) => Sink::Inline(output),
        }
    }

    /// An empty buffer for the next chunk (recycled from the writer when it can be).
    pub(super) fn buffer(&mut self) -> Vec<u8> {
        match self {
            Sink::Threaded { spare, .. } => spare
                .try_recv()
                .unwrap_or_else(|_| Vec::with_capacity(CHUNK)),
            Sink::Inline(o) if o.spare.capacity() > 0 => std::mem::take(&mut o.spare),
            // Inline, output is small: a chunk grows with what it holds (and is kept as the
            // spare). A CHUNK up front would be an mmap and a munmap (a TLB flush on every
            // core the process ran on) for a job that printed a line, or nothing.
            Sink::Inline(_) => Vec::with_capacity(FIRST_READ),
            _ => Vec::with_capacity(CHUNK),
        }
    }

    /// True while output is written on this thread.
    pub(super) fn is_inline(&self) -> bool {
        matches!(self, Sink::Inline(_))
    }

    pub(super) fn store(&mut self, mut chunk: Vec<u8>) {
        match self {
            Sink::Inline(o) => {
                o.store(&chunk);
                chunk.clear();
                o.spare = chunk;
            }
            Sink::Threaded { tx, .. } => {
                if !chunk.is_empty() {
                    let _ = tx.send(chunk);
                }
            }
            Sink::Moved => {}
        }
    }

    /// Waits for the writer to store everything sent, and takes the output back.
    pub(super) fn joined(self) -> Sink {
        match self {
            Sink::Threaded { tx, handle, .. } => {
                drop(tx);
                handle.join().map(Sink::Inline).unwrap_or(Sink::Moved)
            }
            other => other,
        }
    }
}
