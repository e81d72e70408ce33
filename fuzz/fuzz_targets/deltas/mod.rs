//! How the parser fuzz targets cut a text into streamed deltas.

/// `text` in deltas of 1 to 13 bytes, sizes drawn from `seed`, cut between characters.
pub fn deltas(text: &str, seed: u8) -> Vec<&str> {
    let (mut out, mut at, mut step) = (Vec::new(), 0, usize::from(seed));
    while at < text.len() {
        let mut end = (at + 1 + step % 13).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(&text[at..end]);
        at = end;
        step = step.wrapping_mul(31).wrapping_add(7);
    }
    out
}
