//! Constrained sampling: a grammar (a JSON schema, a Lark grammar or a regex) compiled by
//! `llguidance` against the model's vocabulary masks the logits at each step, so the output always
//! parses. [`Grammars`] is built once per tokenizer (the token trie); [`Constraint`] is one
//! request's parser state, held by its [`crate::sample::Sampler`].

use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;
use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::Arc;
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

/// What a request asks its output to match.
#[derive(Debug, Clone)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// A JSON schema.
    JsonSchema(Value),
    /// llguidance's Lark syntax (which may embed `%json {…}` schemas).
    Lark(String),
    /// A regular expression over the whole output.
    Regex(String),
}

/// Largest grammar source accepted (a schema's JSON, a Lark text or a regex), in bytes.
pub const MAX_GRAMMAR_BYTES: usize = 64 << 10;

/// The vocabulary as llguidance sees it: each token's bytes, control tokens marked with 0xFF (so
/// no grammar text can produce them), and mens's tokenizer for forced text.
struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tok
                .encode_text_plain(text, usize::MAX)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Compiles grammars for one tokenizer.
pub struct Grammars {
    factory: ParserFactory,
}

impl Grammars {
    /// Build the token trie : once per model.
    pub fn new(tok: Arc<Tokenizer>) -> Result<Self> {
        let n = tok.vocab_size();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                let b = tok.token_bytes(id);
                if tok.is_control(id) {
                    let mut w = Vec::with_capacity(b.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(b);
                    w
                } else {
                    b.to_vec()
                }
            })
            .collect();
        let mut info = TokRxInfo::new(n as u32, tok.eos);
        info.tok_bos = tok.bos;
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&tok.stop_tokens);
        let env: TokEnv = Arc::new(Env { trie, tok });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| Error::InvalidArgument(format!("grammar engine: {e}")))?;
        factory.quiet();
        // Work bounds per request and per token (llguidance's defaults, a smaller grammar size).
        *factory.limits_mut() = ParserLimits {
            max_grammar_size: 200_000,
            ..ParserLimits::default()
        };
        Ok(Grammars { factory })
    }

    /// Compile `spec`; an error names what could not be compiled.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint> {
        let bad = |m: String| Error::InvalidArgument(m);
        let size = match spec {
            GrammarSpec::JsonObject => 0,
            GrammarSpec::JsonSchema(v) => serde_json::to_string(v).map(|s| s.len()).unwrap_or(0),
            GrammarSpec::Lark(s) | GrammarSpec::Regex(s) => s.len(),
        };
        if size > MAX_GRAMMAR_BYTES {
            return Err(bad(format!(
                "the grammar is {size} bytes, more than the limit of {MAX_GRAMMAR_BYTES}"
            )));
        }
        let grammar = match spec {
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(json_options(json!({
                "type": "object"
            }))),
            GrammarSpec::JsonSchema(v) => {
                if !v.is_object() && !v.is_boolean() {
                    return Err(bad("the JSON schema must be an object".into()));
                }
                TopLevelGrammar::from_json_schema(json_options(v.clone()))
            }
            GrammarSpec::Lark(s) => TopLevelGrammar::from_lark(s.clone()),
            GrammarSpec::Regex(r) => TopLevelGrammar::from_regex(r),
        };
        // llguidance reports what it cannot compile as an error; a panic inside it is caught too.
        let parser = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.factory.create_parser(grammar)
        }))
        .map_err(|_| bad("the grammar could not be compiled".into()))?
        .map_err(|e| {
            bad(format!(
                "the grammar could not be compiled: {}",
                first_line(&e)
            ))
        })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(bad(format!("the grammar could not be compiled: {e}")));
        }
        Ok(Constraint { matcher })
    }
}

fn first_line(e: &impl std::fmt::Display) -> String {
    let s = e.to_string();
    s.lines().next().unwrap_or("").chars().take(300).collect()
}

/// Compact JSON with single spaces (`{"a": 1, "b": [2, 3]}`, the way code models write it) and no
/// free whitespace, so a model cannot loop on blank lines; `oneOf` taken as `anyOf`. A schema's
/// own `x-guidance` options win.
fn json_options(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
                "coerce_one_of": true,
            })
        });
    }
    schema
}

/// One request's grammar state.
pub struct Constraint {
    matcher: Matcher,
}

impl Constraint {
    /// Set the logits of tokens the grammar does not allow now to −∞ (stop tokens only, once it is
    /// complete).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<()> {
        let m: SimpleVob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| Error::InvalidArgument(format!("grammar: {}", first_line(&e))))?;
        let n = m.len().min(logits.len());
        m.iter_unset_entries(|i| {
            if let Some(l) = logits.get_mut(i) {
                *l = f32::NEG_INFINITY;
            }
        });
        // Rows past the tokenizer's vocabulary (padding) are never text.
        for l in logits.iter_mut().skip(n) {
            *l = f32::NEG_INFINITY;
        }
        Ok(())
    }

    /// Advance past the sampled token.
    pub fn accept(&mut self, token: u32) -> Result<()> {
        self.matcher
            .consume_token(token)
            .map_err(|e| Error::InvalidArgument(format!("grammar: {}", first_line(&e))))
    }

    /// The output is complete: nothing more may follow (generation stops).
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }
}
