//! SentencePiece-style tokenization as llama.cpp runs it for `tokenizer.ggml.model = "llama"`
//! (Gemma, Llama 2, Mistral): spaces become `▁`, the text is split into characters, and adjacent
//! pieces are merged while their concatenation is a token, highest score first (ties: leftmost);
//! a character with no token becomes its `<0xXX>` byte tokens.
//!
//! Written here because the GGUF file carries scores, not merges: the `tokenizers` crate's BPE
//! needs a merge list, and its Unigram model picks pieces by a different rule (Viterbi), so neither
//! gives llama.cpp's ids.

use crate::error::{Error, Result};
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// SentencePiece's whitespace marker.
pub const SPACE: char = '\u{2581}';

pub struct Spm {
    scores: Vec<f32>,
    /// The token of each byte (`<0xXX>`, or the unknown token where the vocabulary lacks one).
    bytes: [u32; 256],
    /// Put a space before each piece of text (llama.cpp's `add_space_prefix`, true by default).
    pub add_space_prefix: bool,
}

/// A candidate merge of the pieces starting at `left` and `right` (indices into the symbols).
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    len: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// The heap's top is the highest score, then the leftmost (llama.cpp's `llm_bigram_spm`).
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

/// A piece of the text: bytes `start..start + len`; `len == 0` once merged into its left neighbour.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Spm {
    pub fn new(
        tokens: &[String],
        scores: Vec<f32>,
        vocab: &HashMap<String, u32>,
        unknown: Option<u32>,
        add_space_prefix: bool,
    ) -> Result<Self> {
        if scores.len() != tokens.len() {
            return Err(Error::Tokenizer(format!(
                "tokenizer.ggml.scores has {} entries for {} tokens",
                scores.len(),
                tokens.len()
            )));
        }
        let mut bytes = [0u32; 256];
        for (b, slot) in bytes.iter_mut().enumerate() {
            *slot = match vocab.get(&format!("<0x{b:02X}>")).copied().or(unknown) {
                Some(id) => id,
                None => {
                    return Err(Error::Tokenizer(format!(
                        "the vocabulary has no byte token <0x{b:02X}> and no unknown token"
                    )))
                }
            };
        }
        Ok(Spm {
            scores,
            bytes,
            add_space_prefix,
        })
    }

    /// Append the ids of `text` (no special tokens in it) to `ids`.
    pub fn encode(&self, text: &str, vocab: &HashMap<String, u32>, ids: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        let mut s = String::with_capacity(text.len() + text.len() / 2 + 3);
        if self.add_space_prefix {
            s.push(SPACE);
        }
        for c in text.chars() {
            s.push(if c == ' ' { SPACE } else { c });
        }
        let mut symbols: Vec<Symbol> = Vec::with_capacity(s.len());
        for (i, (start, c)) in s.char_indices().enumerate() {
            symbols.push(Symbol {
                start,
                len: c.len_utf8(),
                prev: i.checked_sub(1),
                next: None,
            });
            if i > 0 {
                symbols[i - 1].next = Some(i);
            }
        }
        let mut heap = BinaryHeap::new();
        let add =
            |heap: &mut BinaryHeap<Bigram>, syms: &[Symbol], l: Option<usize>, r: Option<usize>| {
                let (Some(l), Some(r)) = (l, r) else { return };
                let (a, b) = (syms[l], syms[r]);
                let piece = &s[a.start..b.start + b.len];
                if let Some(&id) = vocab.get(piece) {
                    heap.push(Bigram {
                        left: l,
                        right: r,
                        score: self.scores[id as usize],
                        len: piece.len(),
                    });
                }
            };
        for i in 1..symbols.len() {
            add(&mut heap, &symbols, Some(i - 1), Some(i));
        }
        while let Some(bg) = heap.pop() {
            let (l, r) = (symbols[bg.left], symbols[bg.right]);
            // Stale: one side was merged away since this pair was seen.
            if l.len == 0 || r.len == 0 || l.len + r.len != bg.len {
                continue;
            }
            symbols[bg.left].len += r.len;
            symbols[bg.right].len = 0;
            symbols[bg.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(bg.left);
            }
            add(&mut heap, &symbols, l.prev, Some(bg.left));
            add(&mut heap, &symbols, Some(bg.left), symbols[bg.left].next);
        }
        // Every merged piece is a token (it was merged because it is one); a single character
        // without a token becomes its bytes.
        let mut i = Some(0);
        while let Some(k) = i {
            let sym = symbols[k];
            let piece = &s[sym.start..sym.start + sym.len];
            match vocab.get(piece) {
                Some(&id) => ids.push(id),
                None => ids.extend(piece.bytes().map(|b| self.bytes[b as usize])),
            }
            i = sym.next;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spm(tokens: &[(&str, f32)], prefix: bool) -> (Spm, HashMap<String, u32>) {
        let mut toks: Vec<String> = tokens.iter().map(|t| t.0.to_string()).collect();
        let mut scores: Vec<f32> = tokens.iter().map(|t| t.1).collect();
        for b in 0..256 {
            toks.push(format!("<0x{b:02X}>"));
            scores.push(0.0);
        }
        let vocab = toks
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        (
            Spm::new(&toks, scores, &vocab, None, prefix).unwrap(),
            vocab,
        )
    }

    #[test]
    fn merges_by_score_then_leftmost_and_falls_back_to_bytes() {
        // "abc": "ab" (-1) and "bc" (-2) compete; the higher score merges first.
        let t = [
            ("a", -5.0),
            ("b", -5.0),
            ("c", -5.0),
            ("ab", -1.0),
            ("bc", -2.0),
        ];
        let (s, v) = spm(&t, false);
        let mut ids = Vec::new();
        s.encode("abc", &v, &mut ids);
        assert_eq!(ids, [3, 2]);
        // Scores swapped: "bc" wins.
        let t = [
            ("a", -5.0),
            ("b", -5.0),
            ("c", -5.0),
            ("ab", -2.0),
            ("bc", -1.0),
        ];
        let (s, v) = spm(&t, false);
        ids.clear();
        s.encode("abc", &v, &mut ids);
        assert_eq!(ids, [0, 4]);
        // Equal scores: the leftmost pair merges first ("aa" "a", not "a" "aa").
        let t = [("a", -5.0), ("aa", -1.0)];
        let (s, v) = spm(&t, false);
        ids.clear();
        s.encode("aaa", &v, &mut ids);
        assert_eq!(ids, [1, 0]);
        // Spaces become ▁; a prefix space when asked; "é" has no token: its two UTF-8 bytes.
        let t = [("▁a", -1.0), ("a", -2.0), ("▁", -3.0)];
        let (s, v) = spm(&t, true);
        ids.clear();
        s.encode("a é", &v, &mut ids);
        let byte = |b: u8| 3 + b as u32;
        assert_eq!(ids, [0, 2, byte(0xC3), byte(0xA9)]);
    }
}
