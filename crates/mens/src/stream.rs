//! From sampled tokens to the text a caller sees: complete UTF-8 only, held back while it could still
//! be the start of a stop string, cut before a stop string. One type for the generation loop and the
//! scheduler. Also the prompt-prefix rule both use to reuse a cache.

use crate::tokenizer::{StreamDecoder, Tokenizer};

/// Held-back text: emits what can no longer be the start of a stop string.
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    /// The stop string that ended generation.
    hit: Option<usize>,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops,
            pending: String::new(),
            hit: None,
        }
    }

    /// The stop string that was hit, if one was.
    pub fn hit(&self) -> Option<&str> {
        self.hit.map(|i| self.stops[i].as_str())
    }

    /// Add text; appends what is safe to emit to `out`; true when a stop string was hit.
    pub fn push(&mut self, text: &str, out: &mut String) -> bool {
        self.pending.push_str(text);
        if self.stops.is_empty() {
            out.push_str(&self.pending);
            self.pending.clear();
            return false;
        }
        if let Some((i, which)) = self
            .stops
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(k, s)| self.pending.find(s.as_str()).map(|i| (i, k)))
            .min()
        {
            self.hit = Some(which);
            out.push_str(&self.pending[..i]);
            self.pending.clear();
            return true;
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let mut keep_from = self.pending.len();
        for (i, _) in self.pending.char_indices().rev() {
            let tail = &self.pending[i..];
            if self.stops.iter().any(|s| s.starts_with(tail)) {
                keep_from = i;
            }
        }
        out.push_str(&self.pending[..keep_from]);
        self.pending.drain(..keep_from);
        false
    }

    pub fn finish(&mut self, out: &mut String) {
        out.push_str(&self.pending);
        self.pending.clear();
    }
}

/// Detokenizer + stop matcher for one generation.
pub struct TokenStream {
    decoder: StreamDecoder,
    matcher: StopMatcher,
    piece: String,
    emit: String,
    stopped: bool,
}

impl TokenStream {
    pub fn new(stops: Vec<String>) -> Self {
        TokenStream {
            decoder: StreamDecoder::new(),
            matcher: StopMatcher::new(stops),
            piece: String::with_capacity(64),
            emit: String::with_capacity(64),
            stopped: false,
        }
    }

    /// Add a generated token (not an end-of-generation token): the text now safe to show (maybe
    /// empty), and whether a stop string was hit (then generation ends; nothing more is shown).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> (&str, bool) {
        self.piece.clear();
        self.emit.clear();
        self.decoder.push(tok, id, &mut self.piece);
        self.stopped = self.matcher.push(&self.piece, &mut self.emit);
        (&self.emit, self.stopped)
    }

    /// The stop string that ended generation, if one did.
    pub fn stop_hit(&self) -> Option<&str> {
        self.matcher.hit()
    }

    /// At the end of generation: the text still held back (none after a stop string).
    pub fn finish(&mut self) -> &str {
        self.piece.clear();
        self.emit.clear();
        if !self.stopped {
            self.decoder.finish(&mut self.piece);
            self.matcher.push(&self.piece, &mut self.emit);
            self.matcher.finish(&mut self.emit);
        }
        &self.emit
    }
}

/// How much of a cache holding `cached` a new `prompt` can keep: the common prefix, leaving at least
/// the prompt's last token to run (its logits start the answer).
pub fn reusable_prefix(cached: &[u32], prompt: &[u32]) -> usize {
    let common = cached
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count();
    common.min(prompt.len().saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_matcher_holds_back_partial_stops() {
        let stops = vec!["</end>".to_string()];
        let mut m = StopMatcher::new(stops.clone());
        let mut out = String::new();
        assert!(!m.push("hello </", &mut out));
        assert_eq!(out, "hello ");
        assert!(m.push("end> more", &mut out));
        assert_eq!(out, "hello ");
        let mut m = StopMatcher::new(stops.clone());
        let mut out = String::new();
        assert!(!m.push("a </b", &mut out));
        assert_eq!(out, "a </b");
    }

    #[test]
    fn prefix_reuse_keeps_the_last_prompt_token() {
        assert_eq!(reusable_prefix(&[1, 2, 3, 4], &[1, 2, 9]), 2);
        assert_eq!(reusable_prefix(&[1, 2, 3], &[1, 2, 3]), 2);
        assert_eq!(reusable_prefix(&[1, 2, 3], &[1, 2, 3, 4, 5]), 3);
        assert_eq!(reusable_prefix(&[], &[7]), 0);
        assert_eq!(reusable_prefix(&[1], &[]), 0);
    }
}
