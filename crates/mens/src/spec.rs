//! Speculative decoding: propose several tokens, check them in one forward pass of the target
//! model, keep the longest agreeing prefix plus the model's own next token. [`ngram`] proposes by
//! prompt lookup: the continuation of the latest earlier occurrence of the last n tokens (code
//! repeats its input: an edit copies most of the file, a rename repeats the names).

/// How to speculate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecOptions {
    /// Most tokens proposed per step.
    pub max: usize,
    /// Longest suffix looked up (shorter ones are tried after it, down to 1).
    pub ngram: usize,
}

impl Default for SpecOptions {
    fn default() -> Self {
        SpecOptions { max: 8, ngram: 3 }
    }
}

/// Up to `max` tokens that followed the latest earlier occurrence of the longest suffix of `history`
/// (at most `n` tokens) found again in it; empty when none is found.
pub fn ngram(history: &[u32], n: usize, max: usize, out: &mut Vec<u32>) {
    out.clear();
    let len = history.len();
    for k in (1..=n.min(len.saturating_sub(1))).rev() {
        let pat = &history[len - k..];
        // Latest occurrence that ends before the suffix itself and has something after it.
        let found = (0..len - k).rev().find(|&i| &history[i..i + k] == pat);
        if let Some(i) = found {
            let from = i + k;
            out.extend_from_slice(&history[from..(from + max).min(len)]);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_the_continuation_of_the_latest_match() {
        let mut out = Vec::new();
        // "a b c d ... a b" → "c d ..." from the latest "a b".
        ngram(&[1, 2, 3, 4, 9, 1, 2, 7, 8, 1, 2], 3, 4, &mut out);
        assert_eq!(out, [7, 8, 1, 2]);
        // The longest suffix wins over a later shorter one.
        ngram(&[5, 6, 7, 1, 6, 7, 2, 5, 6, 7], 3, 2, &mut out);
        assert_eq!(out, [1, 6]);
        ngram(&[1, 2, 3], 3, 4, &mut out);
        assert!(out.is_empty());
        ngram(&[], 3, 4, &mut out);
        assert!(out.is_empty());
    }
}
