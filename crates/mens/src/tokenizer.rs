//! The model's own tokenizer, built from GGUF metadata: byte-level BPE with the `tokenizers` crate
//! (`tokenizer.ggml.model = "gpt2"`, with the pre-tokenizer regex llama.cpp uses for the file's
//! `tokenizer.ggml.pre`) or SentencePiece-style merges by score ([`crate::spm`], model `"llama"`:
//! Gemma); and a streaming detokenizer that only emits complete UTF-8.
//!
//! Special tokens are split out here, not by `tokenizers`, because who wrote the text decides which
//! may appear: [`Tokenizer::encode`] (text the operator wrote: a CLI prompt) parses every special
//! token; [`Tokenizer::encode_text`] (text from a request) parses only user-defined tokens, as
//! llama.cpp's `parse_special = false` does, so `<|im_end|>` in a message is plain text;
//! [`Tokenizer::encode_rendered`] takes a chat template's output in which request text was
//! [escaped](Tokenizer::escape) before rendering: only the template's own markup yields control tokens.

use crate::error::{Error, Result};
use crate::gguf::{Array, Gguf};
use crate::spm::{self, Spm};
use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use std::borrow::Cow;
use std::collections::HashMap;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

// Pre-tokenizer regexes as llama.cpp's `llama-vocab.cpp` uses them per `tokenizer.ggml.pre`.
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_UNKNOWN: i64 = 2;
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;
const TOKEN_BYTE: i64 = 6;

/// How text without special tokens becomes ids.
enum Model {
    Bpe(tokenizers::Tokenizer),
    Spm(Spm),
}

pub struct Tokenizer {
    inner: Model,
    /// The bytes each token stands for, for streaming decode.
    token_bytes: Vec<Vec<u8>>,
    pub bos: Option<u32>,
    pub eos: u32,
    pub add_bos: bool,
    /// The file's `tokenizer.ggml.add_eos_token`: an embedding input ends with EOS (Qwen3-Embedding's
    /// last-token pooling reads it), as llama.cpp's tokenizer adds it with `add_special`.
    pub add_eos: bool,
    /// Tokens that end generation: eos and the end-of-turn tokens the vocabulary has.
    pub stop_tokens: Vec<u32>,
    vocab: HashMap<String, u32>,
    /// The pre-tokenizer also splits after a newline that precedes indentation (see `piece_end`).
    indent_splits: bool,
    /// Bytes of the longest token: text of n bytes is at least n / this many tokens.
    max_token_len: usize,
    /// The fill-in-the-middle tokens, when the model has them.
    pub fim: Option<crate::fim::FimTokens>,
    /// Control and user-defined tokens: their text and id.
    specials: Vec<(String, u32)>,
    /// Finds any of `specials` (leftmost-longest, as `tokenizers` and llama.cpp split them).
    all_specials: Option<AhoCorasick>,
    /// Finds the user-defined ones only, with their index in `specials`.
    user_specials: Option<(AhoCorasick, Vec<usize>)>,
}

/// Marks an escaped special token in request text handed to a chat template (a private-use
/// character; see [`Tokenizer::escape`]).
const ESC: char = '\u{10FFFD}';
/// Text segments longer than this are tokenized in pieces cut where the pre-tokenizer always
/// splits, so a token limit can stop early.
const PIECE: usize = 16 << 10;

/// GPT-2's byte → printable-character map used by byte-level BPE vocabularies.
pub fn byte_chars() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0u32..=255 {
        let printable =
            (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        out[b as usize] = if printable {
            char::from_u32(b).unwrap_or('?')
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('?')
        };
    }
    out
}

fn byte_decoder() -> HashMap<char, u8> {
    byte_chars()
        .iter()
        .enumerate()
        .map(|(b, &c)| (c, b as u8))
        .collect()
}

fn split(regex: &str) -> Result<PreTokenizerWrapper> {
    let s = Split::new(
        SplitPattern::Regex(regex.into()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex: {e}")))?;
    Ok(s.into())
}

impl Tokenizer {
    pub fn from_gguf(g: &Gguf) -> Result<Self> {
        let model = g.get_str("tokenizer.ggml.model")?.unwrap_or("");
        if model != "gpt2" && model != "llama" {
            return Err(Error::Tokenizer(format!(
                "tokenizer model {model:?} is not supported (byte-level BPE \"gpt2\" and SentencePiece \"llama\" are)"
            )));
        }
        let tokens = match g.get_array("tokenizer.ggml.tokens")? {
            Some(Array::Strings(t)) if !t.is_empty() => t,
            _ => {
                return Err(Error::Tokenizer(
                    "tokenizer.ggml.tokens is missing or not a list of strings".into(),
                ))
            }
        };
        let merges = match g.get_array("tokenizer.ggml.merges")? {
            Some(Array::Strings(m)) => m.as_slice(),
            None => &[],
            Some(_) => {
                return Err(Error::Tokenizer(
                    "tokenizer.ggml.merges is not a list of strings".into(),
                ))
            }
        };
        let types: Vec<i64> = match g.get_array("tokenizer.ggml.token_type")? {
            Some(Array::Ints(t)) if t.len() == tokens.len() => t.clone(),
            Some(_) => {
                return Err(Error::Tokenizer(
                    "tokenizer.ggml.token_type does not match the token list".into(),
                ))
            }
            None => vec![1; tokens.len()],
        };
        let n = tokens.len() as u64;
        let id = |key: &str| -> Result<Option<u32>> {
            match g.get_u64(key)? {
                Some(v) if v < n => Ok(Some(v as u32)),
                Some(v) => Err(Error::Tokenizer(format!(
                    "{key} = {v} is not below the vocabulary size {n}"
                ))),
                None => Ok(None),
            }
        };
        let eos = id("tokenizer.ggml.eos_token_id")?
            .ok_or_else(|| Error::Tokenizer("tokenizer.ggml.eos_token_id is missing".into()))?;
        let bos = id("tokenizer.ggml.bos_token_id")?;
        let add_bos = g
            .get("tokenizer.ggml.add_bos_token")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);
        let add_eos = g
            .get("tokenizer.ggml.add_eos_token")
            .and_then(|v| v.as_bool())
            .unwrap_or(false);

        let mut vocab: HashMap<String, u32> = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            // Duplicate strings exist in some vocabularies; the first id wins, as in llama.cpp.
            vocab.entry(t.clone()).or_insert(i as u32);
        }
        let (inner, indent_splits) = if model == "llama" {
            let scores = match g.get_array("tokenizer.ggml.scores")? {
                Some(Array::Floats(f)) => f.iter().map(|&x| x as f32).collect(),
                _ => {
                    return Err(Error::Tokenizer(
                        "tokenizer.ggml.scores is missing or not a list of numbers".into(),
                    ))
                }
            };
            let prefix = g
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(|v| v.as_bool())
                .unwrap_or(true);
            let unk = id("tokenizer.ggml.unknown_token_id")?;
            (
                Model::Spm(Spm::new(tokens, scores, &vocab, unk, prefix)?),
                false,
            )
        } else {
            let (b, indent) = bpe_model(g, &vocab, merges)?;
            (Model::Bpe(b), indent)
        };

        let (token_bytes, specials, all_specials, user_specials) =
            special_tables(tokens, &types, model == "llama")?;

        let mut stop_tokens = vec![eos];
        for name in [
            "<|im_end|>",
            "<|endoftext|>",
            "<|eot_id|>",
            "<|end_of_text|>",
            "<end_of_turn>",
        ] {
            if let Some(&i) = vocab.get(name) {
                if !stop_tokens.contains(&i)
                    && (types[i as usize] == TOKEN_CONTROL || name == "<|im_end|>")
                {
                    stop_tokens.push(i);
                }
            }
        }
        if let Some(v) = id("tokenizer.ggml.eot_token_id")? {
            if !stop_tokens.contains(&v) {
                stop_tokens.push(v);
            }
        }
        let max_token_len = token_bytes.iter().map(Vec::len).max().unwrap_or(1).max(1);
        let mut t = Tokenizer {
            indent_splits,
            max_token_len,
            inner,
            token_bytes,
            bos,
            eos,
            add_bos,
            add_eos,
            stop_tokens,
            vocab,
            specials,
            all_specials,
            user_specials,
            fim: None,
        };
        t.fim = crate::fim::FimTokens::of(&t, |k| g.get_u64(k).ok().flatten().map(|v| v as u32));
        Ok(t)
    }

    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The vocabulary must fit the model's embedding (as many rows or more).
    pub fn check_model(&self, embedding_rows: usize) -> Result<()> {
        if self.vocab_size() > embedding_rows {
            return Err(Error::Model(format!(
                "the vocabulary has {} tokens but the embedding only {embedding_rows} rows",
                self.vocab_size()
            )));
        }
        Ok(())
    }

    /// Token ids of `text` written by the operator (a CLI prompt): every special token written in
    /// it (`<|im_start|>`) becomes its id. A BOS is prepended when the model asks for one.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_special(text, usize::MAX)
    }

    /// As [`Self::encode`] (special tokens parsed), at most `limit` tokens: longer text is refused
    /// as soon as the count passes it (a request's `parse_special` prompt).
    pub fn encode_special(&self, text: &str, limit: usize) -> Result<Vec<u32>> {
        let mut ids = self.start();
        self.encode_into(text, true, &mut ids, limit)?;
        Ok(ids)
    }

    /// Token ids of `text` from a request: control tokens written in it stay plain text (only
    /// user-defined tokens are parsed, as llama.cpp's `parse_special = false`). At most `limit`
    /// tokens: longer text is refused as soon as the count passes it, without tokenizing the rest.
    pub fn encode_text(&self, text: &str, limit: usize) -> Result<Vec<u32>> {
        let mut ids = self.start();
        self.encode_into(text, false, &mut ids, limit)?;
        Ok(ids)
    }

    /// An embedding input's ids: as [`Self::encode_text`], then the EOS where the model adds one
    /// (`add_eos`). At most `limit` tokens.
    pub fn encode_embedding(&self, text: &str, limit: usize) -> Result<Vec<u32>> {
        let mut ids = self.encode_text(text, limit)?;
        if self.add_eos {
            if ids.len() >= limit {
                return Err(Error::Context(format!(
                    "the input has more than {limit} tokens"
                )));
            }
            ids.push(self.eos);
        }
        Ok(ids)
    }

    /// As [`Self::encode_text`], without a BOS (a piece of a larger prompt).
    pub fn encode_text_plain(&self, text: &str, limit: usize) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        self.encode_into(text, false, &mut ids, limit)?;
        Ok(ids)
    }

    /// Append the ids of `text` to `ids` (a prompt given in pieces): control-token text is text
    /// unless `special`; fails once `ids` would pass `limit`.
    pub fn encode_append(
        &self,
        text: &str,
        special: bool,
        ids: &mut Vec<u32>,
        limit: usize,
    ) -> Result<()> {
        self.encode_into(text, special, ids, limit)
    }

    /// Token ids of a chat template's output whose request text went through [`Self::escape`]:
    /// the special tokens in the template's own text become ids; escaped ones are plain text.
    pub fn encode_rendered(&self, rendered: &str, limit: usize) -> Result<Vec<u32>> {
        let mut ids = self.start();
        let mut from = 0;
        let mut text = String::new();
        let flush = |text: &mut String, ids: &mut Vec<u32>| -> Result<()> {
            if !text.is_empty() {
                self.encode_into(text, false, ids, limit)?;
                text.clear();
            }
            Ok(())
        };
        if let Some(m) = &self.all_specials {
            for hit in m.find_iter(rendered) {
                self.unescape_into(&rendered[from..hit.start()], &mut text);
                flush(&mut text, &mut ids)?;
                ids.push(self.specials[hit.pattern().as_usize()].1);
                over(ids.len(), limit)?;
                from = hit.end();
            }
        }
        self.unescape_into(&rendered[from..], &mut text);
        flush(&mut text, &mut ids)?;
        Ok(ids)
    }

    /// `text` (from a request) made safe to hand to a chat template: each control or user-defined
    /// token written in it is replaced by a private-use marker that [`Self::encode_rendered`] turns
    /// back into the same text, tokenized as text. Templates may trim or slice the result as they
    /// would the original.
    pub fn escape<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let Some(m) = &self.all_specials else {
            return escape_esc(text);
        };
        if !m.is_match(text) && !text.contains(ESC) {
            return Cow::Borrowed(text);
        }
        let mut out = String::with_capacity(text.len() + 16);
        let mut from = 0;
        for hit in m.find_iter(text) {
            out.push_str(&escape_esc(&text[from..hit.start()]));
            out.push(ESC);
            out.push_str(&hit.pattern().as_usize().to_string());
            out.push(ESC);
            from = hit.end();
        }
        out.push_str(&escape_esc(&text[from..]));
        Cow::Owned(out)
    }

    /// Undo [`Self::escape`]: markers become their special token's text; a cut marker stays as it is.
    fn unescape_into(&self, s: &str, out: &mut String) {
        let mut rest = s;
        while let Some(i) = rest.find(ESC) {
            out.push_str(&rest[..i]);
            let after = &rest[i + ESC.len_utf8()..];
            let digits = after.bytes().take_while(u8::is_ascii_digit).count();
            let closed = after[digits..].starts_with(ESC);
            match (closed, digits) {
                (true, 0) => out.push(ESC),
                (true, _) => match after[..digits]
                    .parse::<usize>()
                    .ok()
                    .and_then(|k| self.specials.get(k))
                {
                    Some((t, _)) => out.push_str(t),
                    None => out.push_str(&after[..digits]),
                },
                (false, _) => {
                    out.push(ESC);
                    rest = after;
                    continue;
                }
            }
            rest = &after[digits + ESC.len_utf8()..];
        }
        out.push_str(rest);
    }

    /// The ids every prompt starts with: the BOS, when the model adds one.
    pub fn start(&self) -> Vec<u32> {
        match (self.add_bos, self.bos) {
            (true, Some(b)) => vec![b],
            _ => Vec::new(),
        }
    }

    /// Append the ids of `text`, splitting out all special tokens (`trusted`) or the user-defined
    /// ones only.
    fn encode_into(
        &self,
        text: &str,
        trusted: bool,
        ids: &mut Vec<u32>,
        limit: usize,
    ) -> Result<()> {
        let (m, index): (Option<&AhoCorasick>, Option<&[usize]>) = if trusted {
            (self.all_specials.as_ref(), None)
        } else {
            match &self.user_specials {
                Some((m, i)) => (Some(m), Some(i)),
                None => (None, None),
            }
        };
        let mut from = 0;
        if let Some(m) = m {
            for hit in m.find_iter(text) {
                self.encode_plain(&text[from..hit.start()], ids, limit)?;
                let k = hit.pattern().as_usize();
                ids.push(self.specials[index.map_or(k, |ix| ix[k])].1);
                over(ids.len(), limit)?;
                from = hit.end();
            }
        }
        self.encode_plain(&text[from..], ids, limit)
    }

    /// Byte-level BPE over text with no special token in it, in pieces cut after a newline that
    /// is followed by an ASCII letter or digit: every pre-tokenizer regex here splits there, so the
    /// pieces give the same ids as the whole.
    fn encode_plain(&self, text: &str, ids: &mut Vec<u32>, limit: usize) -> Result<()> {
        // Text that cannot fit is refused before any of it is tokenized.
        over(ids.len() + text.len() / self.max_token_len, limit)?;
        let bpe = match &self.inner {
            Model::Bpe(b) => b,
            Model::Spm(s) => {
                // One pass over the whole text (merges by score may reach across any cut).
                s.encode(text, &self.vocab, ids);
                return over(ids.len(), limit);
            }
        };
        let mut rest = text;
        while !rest.is_empty() {
            let cut = if rest.len() <= PIECE {
                rest.len()
            } else {
                piece_end(rest, self.indent_splits)
            };
            let enc = bpe
                .encode(&rest[..cut], false)
                .map_err(|e| Error::Tokenizer(format!("encode: {e}")))?;
            ids.extend_from_slice(enc.get_ids());
            over(ids.len(), limit)?;
            rest = &rest[cut..];
        }
        Ok(())
    }

    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.token_bytes
            .get(id as usize)
            .map(|b| b.as_slice())
            .unwrap_or(&[])
    }

    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text).copied()
    }

    /// A control token (`<|im_end|>`): never produced by text. User-defined tokens (`<tool_call>`)
    /// are text.
    pub fn is_control(&self, id: u32) -> bool {
        let user = |i: usize| {
            self.user_specials
                .as_ref()
                .is_some_and(|(_, u)| u.contains(&i))
        };
        self.specials
            .iter()
            .enumerate()
            .any(|(i, &(_, t))| t == id && !user(i))
    }

    pub fn is_stop(&self, id: u32) -> bool {
        self.stop_tokens.contains(&id)
    }

    /// The whole text of `ids` (lossy for invalid UTF-8).
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&i| self.token_bytes(i).iter().copied())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The `tokenizers` BPE model with the pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre`, and
/// whether that pre-tokenizer splits after a newline before indentation (see `piece_end`).
fn bpe_model(
    g: &Gguf,
    vocab: &HashMap<String, u32>,
    merges: &[String],
) -> Result<(tokenizers::Tokenizer, bool)> {
    let mut merge_pairs = Vec::with_capacity(merges.len());
    for m in merges {
        let (a, b) = m
            .split_once(' ')
            .ok_or_else(|| Error::Tokenizer(format!("merge {m:?} is not two tokens")))?;
        if !vocab.contains_key(a) || !vocab.contains_key(b) {
            return Err(Error::Tokenizer(format!(
                "merge {m:?} names a token not in the vocabulary"
            )));
        }
        merge_pairs.push((a.to_string(), b.to_string()));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(
            vocab
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect::<tokenizers::models::bpe::Vocab>(),
            merge_pairs,
        )
        .build()
        .map_err(|e| Error::Tokenizer(format!("BPE: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);

    let pre = g.get_str("tokenizer.ggml.pre")?.unwrap_or("default");
    let byte_level = ByteLevel::new(false, false, false);
    let indent_splits = matches!(
        pre,
        "qwen2" | "deepseek-r1-qwen" | "llama3" | "llama-bpe" | "smaug-bpe"
    );
    let seq: Vec<PreTokenizerWrapper> = match pre {
        "qwen2" | "deepseek-r1-qwen" => vec![split(QWEN2_REGEX)?],
        "llama3" | "llama-bpe" | "smaug-bpe" => vec![split(LLAMA3_REGEX)?],
        "smollm" => vec![split(r"\p{N}")?, split(GPT2_REGEX)?],
        _ => vec![split(GPT2_REGEX)?],
    };
    let mut seq = seq;
    seq.push(byte_level.into());
    inner.with_pre_tokenizer(Some(Sequence::new(seq)));
    inner.with_decoder(Some(ByteLevel::default()));
    Ok((inner, indent_splits))
}

/// Each token's bytes (byte-level text decoded; special tokens as written), the control and
/// user-defined tokens, and the matchers that split them out of text.
#[allow(clippy::type_complexity)]
fn special_tables(
    tokens: &[String],
    types: &[i64],
    sentencepiece: bool,
) -> Result<(
    Vec<Vec<u8>>,
    Vec<(String, u32)>,
    Option<AhoCorasick>,
    Option<(AhoCorasick, Vec<usize>)>,
)> {
    let dec = byte_decoder();
    let mut token_bytes = Vec::with_capacity(tokens.len());
    let mut specials: Vec<(String, u32)> = Vec::new();
    let mut user = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let ty = types[i];
        if (ty == TOKEN_CONTROL || ty == TOKEN_USER_DEFINED) && !t.is_empty() {
            if ty == TOKEN_USER_DEFINED {
                user.push(specials.len());
            }
            specials.push((t.clone(), i as u32));
            token_bytes.push(t.as_bytes().to_vec());
        } else if sentencepiece {
            // As llama.cpp's `token_to_piece`: ▁ is a space, <0xXX> its byte, unknown "▅".
            let byte = t
                .strip_prefix("<0x")
                .and_then(|h| h.strip_suffix('>'))
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            token_bytes.push(match (ty, byte) {
                (TOKEN_BYTE, Some(b)) => vec![b],
                (TOKEN_UNKNOWN, _) => "\u{2585}".as_bytes().to_vec(),
                _ => t.replace(spm::SPACE, " ").into_bytes(),
            });
        } else {
            // Byte-level text; a character outside the map is kept as its UTF-8.
            let mut b = Vec::with_capacity(t.len());
            for c in t.chars() {
                match dec.get(&c) {
                    Some(&x) => b.push(x),
                    None => {
                        let mut buf = [0u8; 4];
                        b.extend_from_slice(c.encode_utf8(&mut buf).as_bytes())
                    }
                }
            }
            token_bytes.push(b);
        }
    }
    let matcher = |texts: Vec<&str>| -> Result<Option<AhoCorasick>> {
        if texts.is_empty() {
            return Ok(None);
        }
        AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(texts)
            .map(Some)
            .map_err(|e| Error::Tokenizer(format!("special tokens: {e}")))
    };
    let all_specials = matcher(specials.iter().map(|s| s.0.as_str()).collect())?;
    let user_specials =
        matcher(user.iter().map(|&i| specials[i].0.as_str()).collect())?.map(|m| (m, user));
    Ok((token_bytes, specials, all_specials, user_specials))
}

/// A literal [`ESC`] in request text, escaped as an empty marker.
fn escape_esc(s: &str) -> Cow<'_, str> {
    if s.contains(ESC) {
        Cow::Owned(s.replace(ESC, &format!("{ESC}{ESC}")))
    } else {
        Cow::Borrowed(s)
    }
}

/// Where the next piece of a long text ends: after the first newline at or past [`PIECE`] bytes
/// that every pre-tokenizer here splits after, or the whole text. A newline followed by an ASCII
/// letter or digit is such a place for all of them; with `indent` (the Qwen2 and Llama 3 regexes,
/// whose `\s*[\r\n]+` ends a whitespace run at its last newline) so is one followed by spaces or
/// tabs and then a character that is not whitespace.
fn piece_end(s: &str, indent: bool) -> usize {
    let b = s.as_bytes();
    let mut i = PIECE;
    while i + 1 < b.len() {
        if b[i] == b'\n' {
            let next = b[i + 1];
            if next.is_ascii_alphanumeric() {
                return i + 1;
            }
            if indent && (next == b' ' || next == b'\t') {
                let run = b[i + 1..]
                    .iter()
                    .take_while(|&&c| c == b' ' || c == b'\t')
                    .count();
                if b.get(i + 1 + run).is_some_and(|c| !c.is_ascii_whitespace()) {
                    return i + 1;
                }
            }
        }
        i += 1;
    }
    s.len()
}

fn over(n: usize, limit: usize) -> Result<()> {
    if n > limit {
        return Err(Error::Context(format!(
            "the prompt is more than {limit} tokens"
        )));
    }
    Ok(())
}

/// Turns a stream of token ids into text, holding back a multi-byte character split across tokens
/// until it is complete.
#[derive(Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    pub fn new() -> Self {
        Self {
            pending: Vec::with_capacity(64),
        }
    }

    /// Append one token and return the text that is now complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32, out: &mut String) {
        self.pending.extend_from_slice(tok.token_bytes(id));
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(s) => s.len(),
            Err(e) => {
                // An invalid byte (not merely an incomplete tail) is replaced, as a lossy decoder would.
                if e.error_len().is_some() {
                    out.push_str(&String::from_utf8_lossy(&self.pending));
                    self.pending.clear();
                    return;
                }
                e.valid_up_to()
            }
        };
        out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
        self.pending.drain(..valid);
    }

    /// Whatever is left at the end of generation (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self, out: &mut String) {
        if !self.pending.is_empty() {
            out.push_str(&String::from_utf8_lossy(&self.pending));
            self.pending.clear();
        }
    }
}
