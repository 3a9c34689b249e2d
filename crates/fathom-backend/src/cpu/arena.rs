//! The activation arena on the host: one allocation carved at the plan's
//! offsets, addressed by [`Buf`] id.

use fathom_plan::activations::{ArenaBuffer, Buf, ARENA_ALIGN};

/// One cache line: the arena's unit, so every buffer is 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; ARENA_ALIGN as usize]);

const _: () = assert!(std::mem::size_of::<Line>() == ARENA_ALIGN as usize);

/// One MoE route: a token's chosen expert and its weight
/// ([`Buf::ExpertRoutes`] holds `k` of them per row).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct Route {
    pub expert: u32,
    pub weight: f32,
}

const _: () = assert!(std::mem::size_of::<Route>() == 8);

/// The backend's (device-side) buffers of the plan's arena.
pub struct Arena {
    lines: Vec<Line>,
    /// (byte offset, bytes) of each [`Buf`], by `Buf as usize`; (0, 0) for
    /// a buffer the plan does not list.
    spans: [(usize, usize); Buf::ALL.len()],
}

impl Arena {
    /// Allocates every device-side buffer of `buffers` at its offset, once.
    pub fn new(buffers: &[ArenaBuffer]) -> Self {
        let mut spans = [(0, 0); Buf::ALL.len()];
        let mut end = 0;
        for b in buffers.iter().filter(|b| !b.id.host_side()) {
            spans[b.id as usize] = (b.offset as usize, b.bytes as usize);
            end = end.max((b.offset + b.bytes) as usize);
        }
        Arena {
            lines: vec![Line([0; ARENA_ALIGN as usize]); end.div_ceil(ARENA_ALIGN as usize)],
            spans,
        }
    }

    /// Bytes allocated: the plan's device-side arena.
    pub fn bytes(&self) -> usize {
        self.lines.len() * ARENA_ALIGN as usize
    }

    /// The allocation's address (for page-locking it).
    pub fn base(&mut self) -> *mut u8 {
        self.lines.as_mut_ptr().cast()
    }

    /// Several distinct buffers at once, as bytes.
    pub fn get<const N: usize>(&mut self, ids: [Buf; N]) -> [&mut [u8]; N] {
        for (i, a) in ids.iter().enumerate() {
            assert!(!ids[..i].contains(a), "{a:?} borrowed twice");
        }
        let base = self.lines.as_mut_ptr().cast::<u8>();
        ids.map(|id| {
            let (offset, len) = self.spans[id as usize];
            // SAFETY: the plan's spans lie within the allocation (sized to
            // their end) and do not overlap (consecutive offsets); the ids
            // are distinct (asserted), so the slices are disjoint, and they
            // borrow `self` mutably for as long as they live.
            unsafe { std::slice::from_raw_parts_mut(base.add(offset), len) }
        })
    }

    /// Several distinct buffers at once, as f32 values.
    pub fn f32s<const N: usize>(&mut self, ids: [Buf; N]) -> [&mut [f32]; N] {
        self.get(ids).map(f32s)
    }

    /// One buffer as f32 values.
    pub fn f32(&mut self, id: Buf) -> &mut [f32] {
        let [x] = self.f32s([id]);
        x
    }
}

/// A buffer's bytes as f32 values.
pub fn f32s(bytes: &mut [u8]) -> &mut [f32] {
    // SAFETY: every span starts 64-byte aligned, any bit pattern is a valid
    // f32, and the length is rounded down to whole values.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<f32>(), bytes.len() / 4) }
}

/// A buffer's bytes as routes.
pub fn routes(bytes: &mut [u8]) -> &mut [Route] {
    // SAFETY: as for `f32s`: aligned, and `Route` is two 4-byte plain
    // values with no invalid bit patterns.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<Route>(), bytes.len() / 8) }
}
