//! The greedy pick.

use super::*;

/// skipped, `banned` ids counted as −∞; 0 when every value is NaN.
pub(crate) fn greedy_reference(row: &[f32], banned: &[u32]) -> u32 {
    let mut best: Option<(u32, f32)> = None;
    for (i, &v) in row.iter().enumerate() {
        let v = if banned.contains(&(i as u32)) {
            f32::NEG_INFINITY
        } else {
            v
        };
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v > b) {
            best = Some((i as u32, v));
        }
    }
    best.map_or(0, |(i, _)| i)
}

/// greedy: each logits row's pick without and with banned ids, exactly,
/// on rows built to hit a tie, a banned maximum, NaN, −∞ and all-NaN; rows
/// of 40,008 values, which the CUDA scan cuts into 20 pieces.
pub(crate) fn test_greedy<B: Backend + ?Sized>(h: &mut Harness<B>, rng: &mut Rng) {
    let (rows, width) = (9, 40_008);
    let banned = [7u32, 2, 4000];
    let mut x = uniform(rng, rows * width);
    let row = |r: usize| r * width..(r + 1) * width;
    x[row(1)][3] = 9.0; // a tie: the first wins
    x[row(1)][4095] = 9.0;
    x[row(2)][7] = 9.0; // a banned maximum, then a tie among the rest
    x[row(2)][11] = 8.0;
    x[row(2)][12] = 8.0;
    x[row(3)][..100].fill(f32::NAN); // NaN before the maximum
    x[row(3)][50] = 9.0;
    x[row(3)][200] = 8.5;
    x[row(4)].fill(f32::NAN); // nothing to pick
    x[row(5)].fill(f32::NEG_INFINITY); // −∞ everywhere but a NaN
    x[row(5)][0] = f32::NAN;
    x[row(6)].fill(f32::NAN); // only banned ids hold numbers
    x[row(6)][2] = 1.0;
    x[row(6)][4000] = 2.0;
    x[row(7)][4000] = f32::INFINITY; // +∞, banned
    x[row(8)][width - 1] = 9.0; // the maximum last, in the scan's last piece
    x[row(8)][20_000] = 8.9;
    h.set(Buf::Logits, &x, width);
    let mut got = vec![[u32::MAX; 2]; rows];
    h.b.greedy(rows, width, &banned, &mut got);
    if let Some(e) = h.b.take_error() {
        panic!("{}: device error: {e}", h.b.name());
    }
    for (r, g) in got.iter().enumerate() {
        // The sampler's rule: the argmax, unless it is banned.
        let plain = greedy_reference(&x[row(r)], &[]);
        let want = if banned.contains(&plain) {
            [plain, greedy_reference(&x[row(r)], &banned)]
        } else {
            [plain, plain]
        };
        let ok = *g == want;
        let line = format!(
            "{:5} greedy             row {r}: got {g:?} want {want:?} {}",
            h.b.name(),
            if ok { "ok" } else { "FAIL" }
        );
        println!("{line}");
        if !ok {
            h.failures.push(line);
        }
    }
}
