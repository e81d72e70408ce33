//! What the mock engine "says": its output token ids index a list of the model's
//! word-like tokens, so answers decode to readable (if meaningless) text and every
//! token is whole UTF-8 on its own, which keeps streaming one token per chunk exact.

use dynamo_llm::ModelDir;

#[derive(Debug)]
pub struct OutputVocab {
    pieces: Vec<String>,
    /// The model's token id of each piece (what `stop_token_ids` name).
    ids: Vec<u32>,
}

impl OutputVocab {
    /// Tokens that decode to one space and a lower-case word (`" the"`, `" cat"`).
    pub fn from_model(model: &ModelDir) -> Self {
        let size = model.tokenizer.get_vocab_size(false) as u32;
        let (ids, pieces): (Vec<u32>, Vec<String>) = (0..size)
            .filter_map(|id| Some((id, model.tokenizer.decode(&[id], false).ok()?)))
            .filter(|(_, piece)| {
                piece.strip_prefix(' ').is_some_and(|word| {
                    !word.is_empty() && word.chars().all(|c| c.is_ascii_lowercase())
                })
            })
            .unzip();
        assert!(!pieces.is_empty(), "the vocabulary has no word-like token");
        Self { pieces, ids }
    }

    /// How many distinct tokens the engine may emit.
    pub fn len(&self) -> u32 {
        self.pieces.len() as u32
    }

    /// Text of one output token.
    pub fn piece(&self, token: u32) -> &str {
        &self.pieces[token as usize % self.pieces.len()]
    }

    /// The model's token id of one output token.
    pub fn model_id(&self, token: u32) -> u32 {
        self.ids[token as usize % self.ids.len()]
    }
}
