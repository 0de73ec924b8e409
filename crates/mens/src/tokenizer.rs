//! The model's own tokenizer, built from GGUF metadata with the `tokenizers` crate (byte-level BPE with
//! the pre-tokenizer regex llama.cpp uses for the file's `tokenizer.ggml.pre`), and a streaming
//! detokenizer that only emits complete UTF-8.

use crate::error::{Error, Result};
use crate::gguf::{Array, Gguf};
use std::collections::HashMap;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

// Pre-tokenizer regexes as llama.cpp's `llama-vocab.cpp` uses them per `tokenizer.ggml.pre`.
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT2_REGEX: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GGUF token types (llama.cpp's `llama_token_type`).
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The bytes each token stands for, for streaming decode.
    token_bytes: Vec<Vec<u8>>,
    pub bos: Option<u32>,
    pub eos: u32,
    pub add_bos: bool,
    /// Tokens that end generation: eos and the end-of-turn tokens the vocabulary has.
    pub stop_tokens: Vec<u32>,
    vocab: HashMap<String, u32>,
}

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
        if model != "gpt2" {
            return Err(Error::Tokenizer(format!(
                "tokenizer model {model:?} is not supported (byte-level BPE \"gpt2\" is)"
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

        let mut vocab: HashMap<String, u32> = HashMap::with_capacity(tokens.len());
        for (i, t) in tokens.iter().enumerate() {
            // Duplicate strings exist in some vocabularies; the first id wins, as in llama.cpp.
            vocab.entry(t.clone()).or_insert(i as u32);
        }
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

        let dec = byte_decoder();
        let mut token_bytes = Vec::with_capacity(tokens.len());
        let mut special = Vec::new();
        for (i, t) in tokens.iter().enumerate() {
            let ty = types[i];
            if ty == TOKEN_CONTROL || ty == TOKEN_USER_DEFINED {
                special.push(AddedToken::from(t.clone(), true));
                token_bytes.push(t.as_bytes().to_vec());
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
        inner.add_special_tokens(&special);

        let mut stop_tokens = vec![eos];
        for name in [
            "<|im_end|>",
            "<|endoftext|>",
            "<|eot_id|>",
            "<|end_of_text|>",
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
        Ok(Tokenizer {
            inner,
            token_bytes,
            bos,
            eos,
            add_bos,
            stop_tokens,
            vocab,
        })
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

    /// Token ids of `text`; special tokens written in the text (`<|im_start|>`) become their ids.
    /// A BOS is prepended when the model asks for one.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(format!("encode: {e}")))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos {
            if let Some(b) = self.bos {
                ids.push(b);
            }
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
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
