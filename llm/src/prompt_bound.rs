//! How few tokens a text can encode to, known without tokenizing it, so that a prompt
//! that cannot fit the context is refused before the tokenizer spends seconds and
//! gigabytes on it (`tokenizers` holds about 100 bytes per input byte while encoding and
//! does about 1 MB/s: 20 MB of text took 20 s and 2 GB with Qwen's tokenizer).
//!
//! Both bounds are lower bounds of what [`ModelDir::encode`](crate::ModelDir::encode)
//! returns, so a prompt that fits is never refused by them:
//!
//! - per byte: one token stands for at most [`PromptBound::bytes_per_token`] bytes of the
//!   raw text (the longest token, times how much the normalizer can shrink text). It
//!   costs nothing and is loose (512 bytes per token for Qwen).
//! - per segmentation, for byte-level BPE tokenizers: whatever BPE merges, its tokens
//!   are vocabulary entries whose bytes concatenate to the normalized text, so the
//!   fewest vocabulary entries that spell the text is a lower bound, and a close one (it
//!   equals the real count on the English-like prose of the tests). A shortest path over
//!   the text's token matches (one Aho-Corasick pass) finds it at 14 to 30 MB/s, in
//!   constant memory beyond the normalized text.
//!
//! Only tokenizers whose every step is understood get a bound: a normalizer or
//! pre-tokenizer that can delete text (`Strip`, `BertNormalizer`, `Whitespace`, ...) or a
//! model that can swallow any length into one token (WordPiece's `[UNK]`, fused unknowns)
//! has none, and their prompts are tokenized as before.

use std::collections::HashMap;
use std::sync::OnceLock;

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use serde_json::Value;
use tokenizers::models::ModelWrapper;
use tokenizers::{AddedToken, Tokenizer};
use unicode_normalization_alignments::{UnicodeNormalization, is_nfc, is_nfd, is_nfkc, is_nfkd};

/// How many times fewer bytes a Unicode normal form can make of a text. Measured over
/// every code point with its longest canonically (or compatibly) equivalent spelling:
/// NFC 3.5 (U+0390 from U+1FBE U+0308 U+0301), NFKC 4 (a 4-byte mathematical digit to
/// an ASCII one); see the test below.
const NORMAL_FORM_SHRINK: usize = 4;

/// `char::to_lowercase` shrinks a character at most threefold (U+212A KELVIN SIGN, 3
/// bytes, to `k`).
const LOWERCASE_SHRINK: usize = 3;

/// Texts up to this many bytes per token of room are tokenized without the segmentation
/// bound: a prompt that fits is rarely denser (English is 4 to 6 bytes per token), and
/// tokenizing such a text costs at most what tokenizing a fitting prompt does.
const DENSE_BYTES_PER_TOKEN: usize = 8;

/// Lower bounds on a tokenizer's token counts; see the module documentation.
#[derive(Debug)]
pub struct PromptBound {
    bytes_per_token: usize,
    segmentation: Option<Segmentation>,
}

/// What the segmentation bound needs to know of a byte-level BPE tokenizer.
#[derive(Debug)]
struct Segmentation {
    normal_form: Option<NormalForm>,
    /// Built on first use: half a second and 16 MB for Qwen's 151k tokens, which only
    /// a prompt far longer than the context ever needs.
    matchers: OnceLock<Matchers>,
}

#[derive(Debug)]
struct Matchers {
    /// Every vocabulary entry as the bytes it stands for, and the added tokens matched
    /// after normalization; all matches, overlapping.
    tokens: AhoCorasick,
    /// Added tokens matched in the raw text before normalization, leftmost-longest as
    /// `tokenizers` splits them (`AddedVocabulary::find_matches`); `None` when there are
    /// none.
    added: Option<AhoCorasick>,
    /// Bytes of the longest entry of `tokens`.
    longest: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NormalForm {
    Nfc,
    Nfd,
    Nfkc,
    Nfkd,
}

impl NormalForm {
    fn of(normalizer: &Value) -> Option<Self> {
        match normalizer["type"].as_str()? {
            "NFC" => Some(Self::Nfc),
            "NFD" => Some(Self::Nfd),
            "NFKC" => Some(Self::Nfkc),
            "NFKD" => Some(Self::Nfkd),
            _ => None,
        }
    }

    fn holds(self, s: &str) -> bool {
        match self {
            Self::Nfc => is_nfc(s),
            Self::Nfd => is_nfd(s),
            Self::Nfkc => is_nfkc(s),
            Self::Nfkd => is_nfkd(s),
        }
    }

    fn apply(self, s: &str) -> String {
        match self {
            Self::Nfc => s.nfc().map(|(c, _)| c).collect(),
            Self::Nfd => s.nfd().map(|(c, _)| c).collect(),
            Self::Nfkc => s.nfkc().map(|(c, _)| c).collect(),
            Self::Nfkd => s.nfkd().map(|(c, _)| c).collect(),
        }
    }
}

impl PromptBound {
    /// The bounds `tokenizer` admits, or `None` when a step of its pipeline can delete
    /// text or put any length of it into one token.
    pub fn of(tokenizer: &Tokenizer) -> Option<Self> {
        let ModelWrapper::BPE(bpe) = tokenizer.get_model() else {
            return None;
        };
        let normalizer = tokenizer
            .get_normalizer()
            .map(|n| serde_json::to_value(n).unwrap_or_default());
        let pre_tokenizer = tokenizer
            .get_pre_tokenizer()
            .map(|p| serde_json::to_value(p).unwrap_or_default());
        let shrink = normalizer.as_ref().map_or(Some(1), normalizer_shrink)?;
        let steps = pre_tokenizer
            .as_ref()
            .map_or_else(Vec::new, flatten_pre_tokenizers);
        if !steps.iter().all(keeps_text) {
            return None;
        }
        let byte_level = steps.iter().find(|s| s["type"] == "ByteLevel");
        let added = added_tokens(tokenizer);
        // Stripping added tokens take any run of whitespace beside them.
        if added.iter().any(|t| t.lstrip || t.rstrip) {
            return None;
        }
        let vocab = tokenizer.get_vocab(false);
        let longest_added = added.iter().map(|t| t.content.len()).max().unwrap_or(0);
        let longest_entry = if byte_level.is_some() {
            // Every character of a byte-level entry stands for one byte; entries with
            // other characters can never be produced.
            let bytes = byte_level_bytes();
            if !bytes.keys().all(|c| vocab.contains_key(&c.to_string())) {
                return None; // a byte without a token would be dropped silently
            }
            vocab
                .keys()
                .filter(|t| t.chars().all(|c| bytes.contains_key(&c)))
                .map(|t| t.chars().count())
                .max()
                .unwrap_or(1)
        } else {
            // Without byte-level input an unknown character becomes one `<unk>` (or its
            // bytes, one byte-fallback token each) unless unknowns fuse, or is dropped
            // when the model has neither.
            if bpe.fuse_unk || (bpe.unk_token.is_none() && !bpe.byte_fallback) {
                return None;
            }
            let longest = vocab.keys().map(String::len).max().unwrap_or(1);
            longest.max(char::MAX.len_utf8())
        };
        let segmentation = byte_level
            .filter(|b| b["add_prefix_space"] != true)
            .filter(|_| {
                let affix = |a: &Option<String>| a.as_ref().is_some_and(|a| !a.is_empty());
                !affix(&bpe.continuing_subword_prefix) && !affix(&bpe.end_of_word_suffix)
            })
            .filter(|_| !tokenizer.get_encode_special_tokens())
            .filter(|_| added.iter().all(|t| !t.single_word))
            .and_then(|_| match &normalizer {
                None => Some(None),
                Some(n) => NormalForm::of(n).map(Some),
            })
            .map(|normal_form| Segmentation {
                normal_form,
                matchers: OnceLock::new(),
            });
        Some(Self {
            bytes_per_token: longest_entry.max(longest_added) * shrink,
            segmentation,
        })
    }

    /// The most bytes of raw text one token can stand for.
    pub fn bytes_per_token(&self) -> usize {
        self.bytes_per_token
    }

    /// A lower bound of the number of tokens `text` encodes to with `tokenizer` (the one
    /// this bound was made for), tight enough to tell whether it exceeds `limit`: the
    /// per-byte bound, and when that cannot tell and the text is long for `limit`, the
    /// segmentation bound.
    pub fn min_tokens(&self, tokenizer: &Tokenizer, text: &str, limit: usize) -> usize {
        let per_byte = text.len().div_ceil(self.bytes_per_token);
        match &self.segmentation {
            Some(s) if per_byte <= limit && text.len() > limit * DENSE_BYTES_PER_TOKEN => {
                s.min_tokens(tokenizer, text)
            }
            _ => per_byte,
        }
    }
}

impl Segmentation {
    fn min_tokens(&self, tokenizer: &Tokenizer, text: &str) -> usize {
        let m = self.matchers.get_or_init(|| Matchers::build(tokenizer));
        let mut tokens = 0;
        let mut rest = 0;
        if let Some(added) = &m.added {
            for found in added.find_iter(text) {
                tokens += self.segment(m, &text[rest..found.start()]) + 1;
                rest = found.end();
            }
        }
        tokens + self.segment(m, &text[rest..])
    }

    /// One stretch between added tokens, normalized as the tokenizer normalizes it.
    fn segment(&self, m: &Matchers, raw: &str) -> usize {
        match self.normal_form {
            Some(form) if !form.holds(raw) => m.fewest(form.apply(raw).as_bytes()),
            _ => m.fewest(raw.as_bytes()),
        }
    }
}

impl Matchers {
    fn build(tokenizer: &Tokenizer) -> Self {
        let bytes = byte_level_bytes();
        let mut entries: Vec<Vec<u8>> = tokenizer
            .get_vocab(false)
            .into_keys()
            .filter_map(|t| t.chars().map(|c| bytes.get(&c).copied()).collect())
            .collect();
        let (normalized, raw): (Vec<AddedToken>, Vec<AddedToken>) = added_tokens(tokenizer)
            .into_iter()
            .filter(|t| !t.content.is_empty())
            .partition(|t| t.normalized);
        entries.extend(normalized.into_iter().map(|t| t.content.into_bytes()));
        let longest = entries.iter().map(Vec::len).max().unwrap_or(1);
        let tokens = AhoCorasick::builder()
            // 16 MB for 151k entries; a DFA would take 340 MB.
            .kind(Some(AhoCorasickKind::ContiguousNFA))
            .build(&entries)
            .expect("vocabulary entries are short enough for an automaton");
        let added = (!raw.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(raw.iter().map(|t| t.content.as_bytes()))
                .expect("added tokens are short enough for an automaton")
        });
        Self {
            tokens,
            added,
            longest,
        }
    }

    /// The fewest entries that spell `text`: a shortest path over positions, where each
    /// match is an edge from its start to its end. Overlapping matches come in order of
    /// their end, so a position is final before any edge leaves it, and only the last
    /// `longest` positions are kept.
    fn fewest(&self, text: &[u8]) -> usize {
        let window = self.longest + 1;
        let mut best = vec![usize::MAX; window];
        best[0] = 0;
        let mut reached = 0;
        for found in self.tokens.find_overlapping_iter(text) {
            let (start, end) = (found.start(), found.end());
            while reached < end {
                reached += 1;
                best[reached % window] = usize::MAX;
            }
            let via = best[start % window].saturating_add(1);
            if via < best[end % window] {
                best[end % window] = via;
            }
        }
        debug_assert_eq!(reached, text.len(), "every byte is an entry");
        best[text.len() % window]
    }
}

/// How many times fewer bytes the normalizer can make of a text; `None` when it can
/// delete text (`Strip`, `StripAccents`, `BertNormalizer`, `Nmt`, `Precompiled`, a
/// `Replace` by nothing or by a regex).
fn normalizer_shrink(normalizer: &Value) -> Option<usize> {
    match normalizer["type"].as_str()? {
        "NFC" | "NFD" | "NFKC" | "NFKD" => Some(NORMAL_FORM_SHRINK),
        "Lowercase" => Some(LOWERCASE_SHRINK),
        "Prepend" | "ByteLevel" => Some(1),
        "Replace" => {
            let from = normalizer["pattern"]["String"].as_str()?;
            let to = normalizer["content"].as_str().filter(|s| !s.is_empty())?;
            Some(from.len().div_ceil(to.len()).max(1))
        }
        "Sequence" => normalizer["normalizers"]
            .as_array()?
            .iter()
            .try_fold(1, |shrink, n| Some(shrink * normalizer_shrink(n)?)),
        _ => None,
    }
}

fn flatten_pre_tokenizers(pre_tokenizer: &Value) -> Vec<Value> {
    match pre_tokenizer["pretokenizers"].as_array() {
        Some(steps) if pre_tokenizer["type"] == "Sequence" => {
            steps.iter().flat_map(flatten_pre_tokenizers).collect()
        }
        _ => vec![pre_tokenizer.clone()],
    }
}

/// Whether a pre-tokenizer keeps every byte of its input: it splits or maps text, but
/// does not drop whitespace (`Whitespace`, `WhitespaceSplit`, `BertPreTokenizer`), a
/// delimiter (`CharDelimiterSplit`) or matches (`Removed`).
fn keeps_text(step: &Value) -> bool {
    match step["type"].as_str() {
        Some("ByteLevel" | "Metaspace" | "Digits" | "UnicodeScripts" | "FixedLength") => true,
        Some("Split" | "Punctuation") => step["behavior"] != "Removed",
        _ => false,
    }
}

fn added_tokens(tokenizer: &Tokenizer) -> Vec<AddedToken> {
    tokenizer.get_added_tokens_decoder().into_values().collect()
}

/// The byte each of the 256 characters byte-level tokenizers write bytes as stands for:
/// printable Latin-1 bytes stand for themselves and the others for U+0100 upwards in
/// byte order (GPT-2's `bytes_to_unicode` in openai/gpt-2 `src/encoder.py`, which
/// `tokenizers`' `ByteLevel` reproduces).
fn byte_level_bytes() -> &'static HashMap<char, u8> {
    static BYTES: OnceLock<HashMap<char, u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let mut shifted = 0;
        (0..=u8::MAX)
            .map(|byte| {
                let printable = matches!(byte, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
                let code = if printable {
                    u32::from(byte)
                } else {
                    shifted += 1;
                    0xFF + shifted
                };
                (char::from_u32(code).expect("below U+0200"), byte)
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use unicode_normalization_alignments::char::decompose_canonical;
    use unicode_normalization_alignments::char::decompose_compatible;

    #[test]
    fn the_byte_level_alphabet_is_gpt2s() {
        let b = byte_level_bytes();
        assert_eq!((b[&'!'], b[&'Ġ'], b[&'Ċ']), (b'!', b' ', b'\n'));
        assert_eq!(
            (b[&'\u{100}'], b[&'\u{121}'], b[&'\u{143}']),
            (0, 0x7F, 0xAD)
        );
        let mut values: Vec<u8> = b.values().copied().collect();
        values.sort_unstable();
        values.dedup();
        assert_eq!(values.len(), 256, "one character per byte");
    }

    #[test]
    fn normalizers_that_can_delete_text_give_no_bound() {
        let n = |v: Value| normalizer_shrink(&v);
        assert_eq!(n(serde_json::json!({"type": "NFC"})), Some(4));
        assert_eq!(
            n(
                serde_json::json!({"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]})
            ),
            Some(12)
        );
        assert_eq!(
            n(
                serde_json::json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"})
            ),
            Some(1)
        );
        assert_eq!(
            n(serde_json::json!({"type": "Replace", "pattern": {"String": "ab"}, "content": ""})),
            None
        );
        assert_eq!(
            n(serde_json::json!({"type": "Strip", "strip_left": true})),
            None
        );
        assert!(!keeps_text(&serde_json::json!({"type": "Whitespace"})));
        assert!(!keeps_text(
            &serde_json::json!({"type": "Split", "behavior": "Removed"})
        ));
        assert!(keeps_text(
            &serde_json::json!({"type": "Split", "behavior": "Isolated"})
        ));
    }

    /// Every code point, spelled with the longest characters equivalent to each part of
    /// its decomposition, normalizes to at least 1/NORMAL_FORM_SHRINK of those bytes.
    #[test]
    fn normal_forms_shrink_text_at_most_by_the_assumed_factor() {
        let chars = || (0..=0x10FFFFu32).filter_map(char::from_u32);
        let decompose = |c: char, compat: bool| {
            let mut parts = Vec::new();
            if compat {
                decompose_compatible(c, |p| parts.push(p));
            } else {
                decompose_canonical(c, |p| parts.push(p));
            }
            parts
        };
        for compat in [false, true] {
            // The longest character whose whole decomposition is one given character.
            let mut longest_spelling = std::collections::HashMap::new();
            for c in chars() {
                if let [part] = decompose(c, compat)[..] {
                    let e = longest_spelling.entry(part).or_insert(part.len_utf8());
                    *e = (*e).max(c.len_utf8());
                }
            }
            let forms: &[NormalForm] = if compat {
                &[NormalForm::Nfkc, NormalForm::Nfkd]
            } else {
                &[NormalForm::Nfc, NormalForm::Nfd]
            };
            for &form in forms {
                for c in chars() {
                    let spelled: usize = decompose(c, compat)
                        .iter()
                        .map(|p| longest_spelling.get(p).copied().unwrap_or(p.len_utf8()))
                        .sum::<usize>()
                        .max(c.len_utf8());
                    let normalized = form.apply(&c.to_string()).len();
                    assert!(
                        spelled <= normalized * NORMAL_FORM_SHRINK,
                        "{form:?} of U+{:04X}: {spelled} bytes to {normalized}",
                        c as u32
                    );
                }
            }
        }
    }
}
