//! The logits read-back and the greedy pick on the device: a scan over
//! row pieces and a one-warp merge (`greedy.cu`).

use std::ffi::c_void;

use cudarc::driver::result;

use super::abi::{Banned, GREEDY_BANNED, GREEDY_BATCH, GREEDY_THREADS};
use super::CudaBackend;
use crate::{greedy_from_rows, Buf};

/// Threads of a `greedy_merge` block: one warp a row (`WARP` in common.cuh).
pub(super) const GREEDY_MERGE_THREADS: u32 = 32;

/// Most pieces (scan blocks) a logits row is cut into: a 128k vocabulary
/// takes 63, one batch a thread, on half the H200's multiprocessors.
pub(super) const GREEDY_PIECES: usize = 64;

impl CudaBackend {
    pub(super) fn logits(&mut self, rows: usize, width: usize) -> &mut [f32] {
        let n = rows * width;
        assert!(
            n <= self.logits.len(),
            "logits: {n} values; {} planned",
            self.logits.len()
        );
        if n <= self.logits_held {
            // Read back already, and no op has run since.
            return &mut self.logits[..n];
        }
        let src = self.buf(Buf::Logits, n * 4);
        if n > 0 && self.ready() {
            self.issue(true);
            // SAFETY: the host buffer holds at least n f32 (asserted), the
            // logits buffer n × 4 bytes (checked by `buf`).
            let r = unsafe { result::memcpy_dtoh_async(&mut self.logits[..n], src, self.stream) };
            if let Err(e) = r {
                self.fail("reading the logits", e);
            }
            self.sync();
            self.logits_held = n;
        }
        &mut self.logits[..n]
    }

    pub(super) fn greedy(
        &mut self,
        rows: usize,
        width: usize,
        banned: &[u32],
        out: &mut [[u32; 2]],
    ) {
        // The picks, and the scan's pieces after them, go to the attention
        // output, idle after the last layer's output projection (the
        // partials, used before, are not planned for short contexts).
        let at = (8 * rows).next_multiple_of(16);
        let pieces = width
            .div_ceil(GREEDY_THREADS as usize * GREEDY_BATCH)
            .min(GREEDY_PIECES);
        let room = self.arena[Buf::AttnOut as usize]
            .filter(|&(_, size)| (at + 16 * rows * pieces) as u64 <= size);
        let on_device = banned.len() <= GREEDY_BANNED && 2 * rows <= self.greedy_host.len();
        let (true, Some((picks, _))) = (on_device, room) else {
            greedy_from_rows(self.logits(rows, width), width, banned, out);
            return;
        };
        let mut src = self.buf(Buf::Logits, rows * width * 4);
        if rows == 0 || !self.ready() {
            return;
        }
        let mut b = Banned {
            n: banned.len() as i32,
            ids: [0; GREEDY_BANNED],
        };
        b.ids[..banned.len()].copy_from_slice(banned);
        let (mut w, mut dst, mut part, mut n) =
            (width as i32, picks, picks + at as u64, pieces as i32);
        let (scan, merge) = (self.k.greedy_scan, self.k.greedy_merge);
        self.launch(
            scan,
            (rows as u32, pieces as u32, 1),
            GREEDY_THREADS,
            &mut args![src, w, b, part],
        );
        self.launch(
            merge,
            (rows as u32, 1, 1),
            GREEDY_MERGE_THREADS,
            &mut args![part, n, b, dst],
        );
        self.issue(true);
        let mut host = std::mem::take(&mut self.greedy_host);
        if self.error.is_none() {
            // SAFETY: `host` holds 2 × rows u32 and the attention output
            // at least 8 × rows bytes (both checked above); pageable memory
            // is read once the stream reaches the copy (synchronized below).
            let r = unsafe { result::memcpy_dtoh_async(&mut host[..2 * rows], dst, self.stream) };
            if let Err(e) = r {
                self.fail("reading the greedy picks", e);
            }
            self.sync();
        }
        for (o, p) in out.iter_mut().zip(host.chunks_exact(2)) {
            *o = [p[0], p[1]];
        }
        self.greedy_host = host;
    }
}
