//! From sampled tokens to the text a caller sees: complete UTF-8 only, held back while it could still
//! be the start of a stop string, cut before a stop string. One type for the generation loop and the
//! scheduler. Also the prompt-prefix rule both use to reuse a cache.

use crate::tokenizer::{StreamDecoder, Tokenizer};

/// The length of the longest suffix of `s` that is a proper prefix of `tag`: the text a stream
/// holds back while it may still become `tag` (a stop string, a tool-call or reasoning tag).
pub fn partial_tail(s: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&k| tag.is_char_boundary(k) && s.ends_with(&tag[..k]))
        .unwrap_or(0)
}

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
        let keep = self
            .stops
            .iter()
            .map(|s| partial_tail(&self.pending, s))
            .max()
            .unwrap_or(0);
        let keep_from = self.pending.len() - keep;
        out.push_str(&self.pending[..keep_from]);
        self.pending.drain(..keep_from);
        false
    }

    pub fn finish(&mut self, out: &mut String) {
        out.push_str(&self.pending);
        self.pending.clear();
    }
}

/// llama-server's `n_indent` (editor plugins send the cursor line's indentation): after the first
/// line, generation ends at a line indented by fewer than `min` spaces or tabs, cut before its
/// first other character (the newline before it and the indentation stay). As in llama-server, a
/// newline counts as such a character: a blank line less indented ends the output too.
#[derive(Default)]
pub struct IndentLimit {
    min: usize,
    at_line_start: bool,
    indent: usize,
}

impl IndentLimit {
    pub fn new(min: usize) -> Self {
        IndentLimit {
            min,
            ..Default::default()
        }
    }

    /// The byte offset in `text` where the output ends, if a line there is indented too little.
    pub fn push(&mut self, text: &str) -> Option<usize> {
        if self.min == 0 {
            return None;
        }
        for (i, c) in text.char_indices() {
            if self.at_line_start {
                if c == ' ' || c == '\t' {
                    self.indent += 1;
                    continue;
                }
                if self.indent < self.min {
                    return Some(i);
                }
                self.at_line_start = false;
            }
            if c == '\n' {
                self.at_line_start = true;
                self.indent = 0;
            }
        }
        None
    }
}

/// Detokenizer + stop matcher (+ indentation limit) for one generation.
pub struct TokenStream {
    decoder: StreamDecoder,
    matcher: StopMatcher,
    indent: IndentLimit,
    piece: String,
    emit: String,
    stopped: bool,
    indent_hit: bool,
}

impl TokenStream {
    pub fn new(stops: Vec<String>) -> Self {
        TokenStream {
            decoder: StreamDecoder::new(),
            matcher: StopMatcher::new(stops),
            indent: IndentLimit::default(),
            piece: String::with_capacity(64),
            emit: String::with_capacity(64),
            stopped: false,
            indent_hit: false,
        }
    }

    /// End at a line indented by fewer than `min` characters (see [`IndentLimit`]; 0: never).
    pub fn with_min_indent(mut self, min: usize) -> Self {
        self.indent = IndentLimit::new(min);
        self
    }

    /// Whether the indentation limit ended generation.
    pub fn indent_hit(&self) -> bool {
        self.indent_hit
    }

    /// The indentation limit over the text about to be shown: cut it there, and stop.
    fn limit(&mut self) {
        if let Some(at) = self.indent.push(&self.emit) {
            self.emit.truncate(at);
            self.stopped = true;
            self.indent_hit = true;
        }
    }

    /// Add a generated token (not an end-of-generation token): the text now safe to show (maybe
    /// empty), and whether a stop string (or the indentation limit) was hit (then generation
    /// ends; nothing more is shown).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> (&str, bool) {
        self.piece.clear();
        self.emit.clear();
        self.decoder.push(tok, id, &mut self.piece);
        self.stopped = self.matcher.push(&self.piece, &mut self.emit);
        self.limit();
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
            self.limit();
        }
        &self.emit
    }
}

/// The length of a prompt's next pass: `rem` tokens left, `room` in this step. With `uniform` > 1
/// (the runner computes a row the same way in any pass of at least that many rows:
/// [`crate::runner::Runner::uniform_pass`]), while `2 * uniform` tokens or more are left, the split
/// leaves every pass at least `uniform` rows when the room allows: the rows then get the bits a
/// cold prefill of the same text gives them, however it was chunked.
pub fn next_pass(rem: usize, room: usize, uniform: usize) -> usize {
    let len = rem.min(room);
    if len == rem || uniform <= 1 || rem < 2 * uniform {
        return len;
    }
    // Leave at least `uniform` rows for the next pass, and take at least `uniform`.
    let len = len.min(rem - uniform);
    if len >= uniform {
        len
    } else {
        rem.min(room)
    }
}

/// A reusable prefix `keep` of a `len`-token prompt, moved back so that the tokens left to run make
/// one pass of at least `uniform` rows (see [`next_pass`]): with `uniform` > 1 the prompt's last
/// rows, and so its logits, are then those of a cold prefill of the same text, bit for bit. Only
/// for prompts of `2 * uniform` tokens and more: a shorter one keeps its whole prefix (running 64
/// of its tokens again would cost more than half of its prefill).
pub fn uniform_keep(keep: usize, len: usize, uniform: usize) -> usize {
    if uniform > 1 && len >= 2 * uniform && len - keep < uniform {
        len - uniform
    } else {
        keep
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

/// A run of cached tokens that a new prompt holds again at another position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Where it is in the cache, where it goes in the prompt, and its length.
    pub src: usize,
    pub dst: usize,
    pub len: usize,
}

/// Most token comparisons one plan may make (the prompt comes from a request).
const REUSE_WORK: usize = 1 << 22;

/// Cache reuse across edits: after the kept prefix `keep`, the runs of at least `min` cached tokens
/// that the prompt holds again, in order, each possibly moved (text inserted or deleted before it).
/// Tokens between chunks are prefilled; the prompt's last token always is (its logits start the
/// answer). Greedy left to right, as llama-server's `--cache-reuse`, which also lets the prompt
/// skip new text before a chunk (llama-server only reuses a chunk when nothing was inserted).
pub fn reuse_chunks(cached: &[u32], prompt: &[u32], keep: usize, min: usize) -> Vec<Chunk> {
    let mut out = Vec::new();
    let end_p = prompt.len().saturating_sub(1);
    if min == 0 || keep >= end_p || keep >= cached.len() {
        return out;
    }
    // Index the cached tokens by their first `k` tokens; each candidate is then extended.
    let k = min.min(8);
    let mut index: std::collections::HashMap<&[u32], Vec<usize>> = Default::default();
    for c in keep..cached.len().saturating_sub(k - 1) {
        let v = index.entry(&cached[c..c + k]).or_default();
        if v.len() < 16 {
            v.push(c);
        }
    }
    let (mut hc, mut hp, mut work) = (keep, keep, 0usize);
    while hp + min <= end_p && work < REUSE_WORK {
        let mut best: Option<(usize, usize)> = None;
        for &c in index.get(&prompt[hp..hp + k]).into_iter().flatten() {
            if c < hc {
                continue;
            }
            let mut n = 0;
            while c + n < cached.len() && hp + n < end_p && cached[c + n] == prompt[hp + n] {
                n += 1;
            }
            work += n + 1;
            if n >= min && best.is_none_or(|(_, b)| n > b) {
                best = Some((c, n));
            }
        }
        match best {
            Some((c, n)) => {
                out.push(Chunk {
                    src: c,
                    dst: hp,
                    len: n,
                });
                hc = c + n;
                hp += n;
            }
            None => hp += 1,
        }
    }
    out
}

/// The order to move `chunks` (from [`reuse_chunks`]) in one cache so that no move overwrites rows
/// another has yet to read: those moving left in ascending order, then those moving right in
/// descending order.
pub fn move_order(chunks: &[Chunk]) -> Vec<Chunk> {
    let left = chunks.iter().filter(|c| c.dst <= c.src).copied();
    let right = chunks.iter().rev().filter(|c| c.dst > c.src).copied();
    left.chain(right).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama-server's rule, at every split of the text into pieces: the first line is free, a later
    /// line indented below the minimum (a blank one too) ends the output before its first
    /// character; deeper lines go on.
    #[test]
    fn the_indentation_limit_cuts_where_llama_server_does() {
        let cases = [
            (
                "    x = 1\n    return x\ny = 2",
                4,
                Some("    x = 1\n    return x\n"),
            ),
            ("x\n\n    y", 4, Some("x\n")),
            ("x\n    \n    y\n  z", 4, Some("x\n    \n    y\n  ")),
            ("a = 1\nb = 2", 0, None),
            ("\tif a:\n\t\tb()\n\tc()", 1, None),
            ("no newline, little indent", 8, None),
            ("ok\n\tbad", 2, Some("ok\n\t")),
        ];
        for (text, min, want) in cases {
            for cut in 0..=text.len() {
                if !text.is_char_boundary(cut) {
                    continue;
                }
                let mut l = IndentLimit::new(min);
                let got = match l.push(&text[..cut]) {
                    Some(i) => Some(&text[..i]),
                    None => l.push(&text[cut..]).map(|i| &text[..cut + i]),
                };
                assert_eq!(got, want, "{text:?} min {min} cut {cut}");
            }
        }
    }

    #[test]
    fn passes_and_kept_prefixes_respect_the_uniform_length() {
        // Every split of n tokens in steps of `room` has passes of 64 rows or more.
        for n in 128..1200 {
            for room in [64usize, 100, 512] {
                let (mut done, mut passes) = (0, Vec::new());
                while done < n {
                    let k = next_pass(n - done, room, 64);
                    assert!(k > 0 && k <= room);
                    passes.push(k);
                    done += k;
                }
                assert_eq!(done, n);
                if room >= 128 {
                    assert!(passes.iter().all(|&k| k >= 64), "{n} in {room}: {passes:?}");
                }
            }
        }
        assert_eq!(next_pass(530, 512, 1), 512);
        assert_eq!(next_pass(30, 512, 64), 30);
        // A cached prefix leaves at least 64 tokens to run, when the prompt has them.
        assert_eq!(uniform_keep(1000, 1010, 64), 946);
        assert_eq!(uniform_keep(900, 1010, 64), 900);
        assert_eq!(uniform_keep(40, 50, 64), 40);
        assert_eq!(uniform_keep(70, 100, 64), 70);
        assert_eq!(uniform_keep(1009, 1010, 1), 1009);
    }

    /// Moving chunks in `move_order` within one array gives every chunk its rows at `dst`, for
    /// random edits (insertions, deletions, replacements) of a random token sequence.
    #[test]
    fn reuse_plans_move_every_chunk_intact() {
        let mut seed = 7u64;
        let mut rnd = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for _ in 0..300 {
            let old: Vec<u32> = (0..200).map(|_| rnd(50) as u32).collect();
            let mut new = old.clone();
            for _ in 0..3 {
                let at = rnd(new.len() as u64) as usize;
                match rnd(3) {
                    0 => new
                        .splice(at..at, (0..rnd(30)).map(|_| 100 + rnd(50) as u32))
                        .count(),
                    1 => new
                        .drain(at..(at + rnd(30) as usize).min(new.len()))
                        .count(),
                    _ => new.splice(at..(at + 5).min(new.len()), [999, 998]).count(),
                };
            }
            let keep = reusable_prefix(&old, &new);
            let chunks = reuse_chunks(&old, &new, keep, 4);
            let mut cache = old.clone();
            cache.resize(400, u32::MAX);
            for c in move_order(&chunks) {
                cache.copy_within(c.src..c.src + c.len, c.dst);
            }
            let mut last = keep;
            for c in &chunks {
                assert!(c.dst >= last && c.len >= 4 && c.dst + c.len < new.len());
                assert_eq!(&cache[c.dst..c.dst + c.len], &new[c.dst..c.dst + c.len]);
                last = c.dst + c.len;
            }
            assert_eq!(&cache[..keep], &new[..keep]);
        }
        // An edit in the middle of a long file: everything after it is found again.
        let old: Vec<u32> = (0..1000).collect();
        let mut new = old.clone();
        new.splice(500..501, [5000, 5001, 5002]);
        let keep = reusable_prefix(&old, &new);
        let chunks = reuse_chunks(&old, &new, keep, 16);
        assert_eq!(keep, 500);
        assert_eq!(
            chunks,
            [Chunk {
                src: 501,
                dst: 503,
                len: 498
            }]
        );
    }

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
