//! What the host sends a step: rows, positions, token ids and page tables
//! staged in the planned step area (copied once before the launches that
//! read them), and the MoE row lists.

use fathom_plan::cuda::StepWords;

use super::abi::StepDesc;
use super::CudaBackend;
use crate::Step;

/// Parts of the step area (`CudaBackend::stage`): rows and sequences,
/// token ids, projected rows, recurrent-state slots, then one per KV
/// group's page tables.
pub(super) const STAGED_ROWS: usize = 0;

pub(super) const STAGED_TOKENS: usize = 1;

pub(super) const STAGED_PROJECTED: usize = 2;

pub(super) const STAGED_SLOTS: usize = 3;

pub(super) const STAGED_FIXED: usize = 4;

/// Where the uploads go (device addresses), sized for `tokens` rows and
/// `seqs` sequences of `table_stride` blocks.
#[derive(Debug, Clone, Copy)]
pub(super) struct Upload {
    /// The step area (`StepWords` says what lies where).
    pub(super) step: u64,
    pub(super) words: StepWords,
    /// MoE row lists and weights, written op by op.
    pub(super) idx: u64,
    pub(super) weights: u64,
    pub(super) tokens: usize,
    pub(super) seqs: usize,
    pub(super) table_stride: usize,
    /// Activations as f16/bf16 for a GEMM: `tokens × x16_cols`.
    pub(super) x16: u64,
    pub(super) x16_cols: usize,
    /// Dequantized weight rows (f16), `W16_STAGING` bytes.
    pub(super) w16: u64,
}

/// The word range `range` (if any) grown to take in `at .. end`.
pub(super) fn widened(range: Option<(usize, usize)>, at: usize, end: usize) -> (usize, usize) {
    match range {
        Some((lo, hi)) => (lo.min(at), hi.max(end)),
        None => (at, end),
    }
}

impl CudaBackend {
    /// Writes `words` into part `part` of the step area at word `at`, and
    /// returns their device address. Rewriting words of a part already
    /// written since the last issue with other values issues the queue
    /// first, so recorded launches read what was there when they were
    /// recorded; words of the part not yet written are just added.
    pub(super) fn stage(&mut self, part: usize, at: usize, words: &[u32]) -> u64 {
        let end = at + words.len();
        if let Some((lo, hi)) = self.staged[part] {
            if at < hi && lo < end && self.step_host[at..end] != *words {
                self.issue(false);
            }
        }
        self.step_host[at..end].copy_from_slice(words);
        self.staged[part] = Some(widened(self.staged[part], at, end));
        self.dirty = Some(widened(self.dirty, at, end));
        if self.eager {
            self.issue(false);
        }
        self.upload.step + 4 * at as u64
    }

    /// Stages the step's rows (sequence, position), sequences (start, first
    /// row) and, for `group`, each sequence's page table.
    pub(super) fn upload_step(&mut self, step: &Step, group: Option<usize>) -> StepDesc {
        let (t, s, stride) = (
            self.upload.tokens,
            self.upload.seqs,
            self.upload.table_stride,
        );
        let words = self.upload.words;
        let n_seqs = step.seqs.len();
        assert!(
            step.rows <= t && n_seqs <= s,
            "a step of {} rows in {n_seqs} sequences; {t} rows and {s} sequences planned",
            step.rows
        );
        // The step's own rows and sequences, packed: each layer's attention
        // stages them again (the same values, so nothing is issued), and
        // the planned lengths (the largest step's: a thousand words for a
        // 512-token chunk) had been filled, compared and copied each time,
        // host time in which the GPU waits for the step.
        let (rows, seq_at) = (step.rows, 2 * step.rows);
        let mut h = std::mem::take(&mut self.host_u32);
        h.clear();
        h.resize(seq_at + 2 * n_seqs, 0);
        let mut row = 0usize;
        for (i, seq) in step.seqs.iter().enumerate() {
            assert!(
                row + seq.tokens <= rows,
                "the step's sequences hold more than its {rows} rows"
            );
            for j in 0..seq.tokens {
                h[row + j] = i as u32;
                h[rows + row + j] = (seq.start + j) as u32;
            }
            h[seq_at + i] = seq.start as u32;
            h[seq_at + n_seqs + i] = row as u32;
            row += seq.tokens;
        }
        assert_eq!(
            row, rows,
            "the step's sequences hold {row} rows, not {rows}"
        );
        let base = self.stage(STAGED_ROWS, 0, &h);
        self.host_u32 = h;
        // Each sequence's page table at its planned stride, the rest of the
        // stride left as it was (only blocks of the sequence's positions are
        // read).
        let mut tables = 0;
        if let Some(g) = group {
            let at = words.tables(g as u64) as usize;
            tables = self.upload.step + 4 * at as u64;
            for (i, seq) in step.seqs.iter().enumerate() {
                let table = &seq.tables[g];
                assert!(
                    table.len() <= stride,
                    "a page table of {} blocks; {stride} planned per sequence",
                    table.len()
                );
                self.stage(STAGED_FIXED + g, at + i * stride, table);
            }
        }
        let word = |k: usize| base + 4 * k as u64;
        StepDesc {
            row_seq: base,
            row_pos: word(rows),
            seq_start: word(seq_at),
            seq_row0: word(seq_at + n_seqs),
            tables,
            table_stride: stride as i32,
            pad: 0,
        }
    }

    /// Stages the row list of a gather (`projected`) or the token ids of
    /// an embedding (`!projected`).
    pub(super) fn stage_rows(&mut self, rows: &[u32], projected: bool) -> u64 {
        assert!(
            rows.len() <= self.upload.tokens,
            "{} rows; {} planned",
            rows.len(),
            self.upload.tokens
        );
        let w = self.upload.words;
        if projected {
            self.stage(STAGED_PROJECTED, w.projected() as usize, rows)
        } else {
            self.stage(STAGED_TOKENS, w.token_ids() as usize, rows)
        }
    }

    /// Stages each sequence's recurrent-state slot (a hybrid model's
    /// linear layers read them; every layer stages the same words, so
    /// nothing is issued between them).
    pub(super) fn stage_slots(&mut self, slots: &[u32]) -> u64 {
        let w = self.upload.words;
        assert!(
            slots.len() as u64 <= w.slots,
            "{} state slots; {} planned",
            slots.len(),
            w.slots
        );
        self.stage(STAGED_SLOTS, w.state_slots() as usize, slots)
    }

    /// Uploads an expert's row indices (and weights) for its gather /
    /// scatter. Written op by op into one area, so what is recorded (which
    /// may read the previous list) is issued first.
    pub(super) fn upload_idx(&mut self, idx: &[u32], weights: Option<&[f32]>) -> (u64, u64) {
        self.issue(false);
        assert!(
            idx.len() <= self.upload.tokens,
            "{} rows; {} planned",
            idx.len(),
            self.upload.tokens
        );
        let (i, w) = (self.upload.idx, self.upload.weights);
        self.htod(i, idx);
        if let Some(wts) = weights {
            self.htod(w, wts);
        }
        (i, w)
    }
}
