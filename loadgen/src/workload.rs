//! What a run sends: prompts as token ids and output lengths, generated on demand (a
//! Mooncake prompt can be 190k tokens, so a workload never holds them all).
//!
//! - Shared prefix: `prefixes` x `suffixes` requests; request `i` is one prefix of
//!   `prefix_tokens` followed by `unique_tokens` of its own, in an order shuffled by the
//!   seed, so each prefix comes back over the whole run.
//! - Multi-turn conversations ([`Sessions`]): each turn's prompt is the previous
//!   turn's prompt, a stand-in for its answer and a new message; turns of a session are
//!   sent one after the other (see [`bench`](crate::bench), and `dynamo-e2e`'s replay).
//! - Mooncake trace: one JSON line per request (`timestamp` ms, `input_length`,
//!   `output_length`, `hash_ids` of 512-token blocks); the mocker's
//!   [`synthesize_prompt`] turns equal hash ids into equal tokens.

use std::path::Path;

use anyhow::Context;
use dynamo_mocker::Request;
use dynamo_mocker::replay::{TraceRecord, parse_trace, synthesize_prompt};
use dynamo_mocker::tokens::{stream_key, token_at};
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Serialize;

/// Prompt token ids are drawn from `0..PROMPT_VOCAB`: ordinary (not special) tokens of
/// Qwen's (151k) and Llama's (32k and up) vocabularies, so any engine accepts them.
pub const PROMPT_VOCAB: u32 = 32_000;

/// Keeps the unique tails' token streams apart from the prefixes'.
const UNIQUE_SALT: u64 = 0x7461_696c;

/// Keep the multi-turn workload's streams apart: the common system prompt, each
/// session's first prompt, the answers' stand-ins and the later user messages.
const SYSTEM_SALT: u64 = 0x7379_7374_656d;
const SESSION_SALT: u64 = 0x0073_6573_7369_6f6e;
const ANSWER_SALT: u64 = 0x616e_7377_6572;
const MESSAGE_SALT: u64 = 0x006d_6573_7361_6765;

/// One request to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkItem {
    pub token_ids: Vec<u32>,
    pub max_tokens: usize,
}

impl WorkItem {
    /// The simulated engine's request `id` for this item (no seed, no pin).
    pub fn into_request(self, id: usize) -> Request {
        Request {
            id: id as u64,
            token_ids: self.token_ids,
            max_tokens: self.max_tokens,
            seed: None,
            pin_ttl: None,
        }
    }
}

/// The synthetic shared-prefix workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SharedPrefix {
    pub prefixes: usize,
    /// Requests per prefix.
    pub suffixes: usize,
    pub prefix_tokens: usize,
    /// Tokens after the prefix that no other request has.
    pub unique_tokens: usize,
    pub output_tokens: usize,
    pub seed: u64,
}

/// The multi-turn conversation workload: `sessions` users, each holding a conversation
/// of `turns` requests. Turn 1's prompt is the common system prompt and the session's
/// own first prompt; turn k+1's prompt is turn k's prompt, a stand-in for turn k's
/// answer (`output_tokens` tokens of deterministic filler: the mocked model's real
/// answer does not matter) and a new user message of `turn_tokens`, so every turn's
/// prompt starts with the exact tokens of the previous one.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Sessions {
    pub sessions: usize,
    pub turns: usize,
    /// Tokens every session starts with (a common system prompt); may be 0.
    pub system_tokens: usize,
    /// Tokens of each session's own first prompt, after the system prompt.
    pub session_prefix_tokens: usize,
    /// Tokens of each later user message.
    pub turn_tokens: usize,
    /// Each answer's length, and the length of its stand-in in the next prompt.
    pub output_tokens: usize,
    /// Pause between the end of a turn's answer and the next turn.
    pub think_time_ms: f64,
    pub seed: u64,
}

impl Sessions {
    /// Prompt length of turn `turn` (0-based).
    pub fn prompt_tokens(&self, turn: usize) -> usize {
        self.system_tokens
            + self.session_prefix_tokens
            + turn * (self.output_tokens + self.turn_tokens)
    }

    /// The prompt of turn `turn` (0-based) of session `session`.
    pub fn prompt(&self, session: usize, turn: usize) -> Vec<u32> {
        let mut tokens = Vec::with_capacity(self.prompt_tokens(turn));
        let mut extend = |salt: u64, stream: usize, len: usize| {
            let key = stream_key(self.seed ^ salt, stream as u64);
            tokens.extend((0..len as u64).map(|pos| token_at(key, pos, PROMPT_VOCAB)));
        };
        extend(SYSTEM_SALT, 0, self.system_tokens);
        extend(SESSION_SALT, session, self.session_prefix_tokens);
        let first = session * self.turns;
        for k in 0..turn {
            extend(ANSWER_SALT, first + k, self.output_tokens);
            extend(MESSAGE_SALT, first + k + 1, self.turn_tokens);
        }
        tokens
    }
}

#[derive(Clone, Debug)]
pub enum Workload {
    SharedPrefix {
        spec: SharedPrefix,
        /// The prefix of each request, in sending order.
        order: Vec<usize>,
    },
    Trace {
        records: Vec<TraceRecord>,
    },
    /// Request `i` is turn `i % turns` of session `i / turns`.
    Sessions {
        spec: Sessions,
    },
}

impl Workload {
    pub fn shared_prefix(spec: SharedPrefix) -> anyhow::Result<Self> {
        anyhow::ensure!(
            spec.prefixes > 0 && spec.suffixes > 0,
            "--prefixes and --suffixes must be at least 1"
        );
        anyhow::ensure!(
            spec.prefix_tokens + spec.unique_tokens > 0,
            "a prompt needs at least one token (--prefix-tokens + --unique-tokens)"
        );
        anyhow::ensure!(spec.output_tokens > 0, "--output-tokens must be at least 1");
        let mut order: Vec<usize> = (0..spec.prefixes)
            .flat_map(|p| std::iter::repeat_n(p, spec.suffixes))
            .collect();
        order.shuffle(&mut StdRng::seed_from_u64(spec.seed));
        Ok(Self::SharedPrefix { spec, order })
    }

    pub fn sessions(spec: Sessions) -> anyhow::Result<Self> {
        anyhow::ensure!(
            spec.sessions > 0 && spec.turns > 0,
            "--sessions and --turns must be at least 1"
        );
        anyhow::ensure!(
            spec.system_tokens + spec.session_prefix_tokens > 0,
            "a first turn needs at least one token (--system-tokens + --session-prefix-tokens)"
        );
        anyhow::ensure!(spec.output_tokens > 0, "--output-tokens must be at least 1");
        anyhow::ensure!(
            spec.think_time_ms.is_finite() && spec.think_time_ms >= 0.0,
            "--think-time-s must be >= 0"
        );
        Ok(Self::Sessions { spec })
    }

    /// The multi-turn shape, for a conversation workload.
    pub fn conversations(&self) -> Option<&Sessions> {
        match self {
            Self::Sessions { spec } => Some(spec),
            _ => None,
        }
    }

    /// Session and turn (both 0-based) of request `i`, for a conversation workload.
    pub fn session_turn(&self, i: usize) -> Option<(usize, usize)> {
        self.conversations().map(|s| (i / s.turns, i % s.turns))
    }

    /// Reads a Mooncake trace, keeping records with at most `max_input_tokens` prompt
    /// tokens (when set), then the first `max_requests` of them (when set).
    pub fn trace(
        path: &Path,
        max_requests: Option<usize>,
        max_input_tokens: Option<usize>,
    ) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the trace {}", path.display()))?;
        let mut records = parse_trace(&text).with_context(|| path.display().to_string())?;
        records.retain(|r| max_input_tokens.is_none_or(|max| r.input_length <= max));
        records.truncate(max_requests.unwrap_or(usize::MAX));
        anyhow::ensure!(
            !records.is_empty(),
            "{}: no request to send",
            path.display()
        );
        anyhow::ensure!(
            records.windows(2).all(|w| w[0].timestamp <= w[1].timestamp),
            "{}: timestamps must not decrease",
            path.display()
        );
        Ok(Self::Trace { records })
    }

    pub fn len(&self) -> usize {
        match self {
            Self::SharedPrefix { order, .. } => order.len(),
            Self::Trace { records } => records.len(),
            Self::Sessions { spec } => spec.sessions * spec.turns,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Request `i` (`i < len()`); the same every time for the same workload.
    pub fn request(&self, i: usize) -> WorkItem {
        match self {
            Self::SharedPrefix { spec, order } => {
                let prefix = stream_key(spec.seed, order[i] as u64);
                let own = stream_key(spec.seed ^ UNIQUE_SALT, i as u64);
                let token_ids = (0..spec.prefix_tokens as u64)
                    .map(|pos| token_at(prefix, pos, PROMPT_VOCAB))
                    .chain(
                        (0..spec.unique_tokens as u64).map(|pos| token_at(own, pos, PROMPT_VOCAB)),
                    )
                    .collect();
                WorkItem {
                    token_ids,
                    max_tokens: spec.output_tokens,
                }
            }
            Self::Trace { records } => WorkItem {
                token_ids: synthesize_prompt(&records[i], i as u64, PROMPT_VOCAB),
                max_tokens: records[i].output_length.max(1),
            },
            Self::Sessions { spec } => WorkItem {
                token_ids: spec.prompt(i / spec.turns, i % spec.turns),
                max_tokens: spec.output_tokens,
            },
        }
    }

    /// The trace's own arrival times (ms, from its first record), if it has them.
    pub fn timestamps_ms(&self) -> Option<Vec<f64>> {
        match self {
            Self::SharedPrefix { .. } | Self::Sessions { .. } => None,
            Self::Trace { records } => {
                let first = records[0].timestamp;
                Some(records.iter().map(|r| r.timestamp - first).collect())
            }
        }
    }

    /// A one-line description for reports.
    pub fn describe(&self) -> String {
        match self {
            Self::SharedPrefix { spec, .. } => format!(
                "shared prefix: {} prefixes x {} requests, ISL {} + {} unique, OSL {}, seed {}",
                spec.prefixes,
                spec.suffixes,
                spec.prefix_tokens,
                spec.unique_tokens,
                spec.output_tokens,
                spec.seed
            ),
            Self::Trace { records } => {
                let isl: usize = records.iter().map(|r| r.input_length).sum();
                let osl: usize = records.iter().map(|r| r.output_length).sum();
                format!(
                    "Mooncake trace: {} requests, mean ISL {:.0}, mean OSL {:.0}",
                    records.len(),
                    isl as f64 / records.len() as f64,
                    osl as f64 / records.len() as f64
                )
            }
            Self::Sessions { spec } => format!(
                "conversations: {} sessions x {} turns, ISL {} system + {} own + {} per turn \
                 (answer {} + message {}), ISL {} to {}, OSL {}, think time {} s, seed {}",
                spec.sessions,
                spec.turns,
                spec.system_tokens,
                spec.session_prefix_tokens,
                spec.output_tokens + spec.turn_tokens,
                spec.output_tokens,
                spec.turn_tokens,
                spec.prompt_tokens(0),
                spec.prompt_tokens(spec.turns - 1),
                spec.output_tokens,
                spec.think_time_ms / 1000.0,
                spec.seed
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn spec(seed: u64) -> SharedPrefix {
        SharedPrefix {
            prefixes: 4,
            suffixes: 3,
            prefix_tokens: 100,
            unique_tokens: 20,
            output_tokens: 7,
            seed,
        }
    }

    #[test]
    fn shared_prefix_requests_share_exactly_their_prefix() {
        let w = Workload::shared_prefix(spec(1)).unwrap();
        assert_eq!(w.len(), 12);
        let Workload::SharedPrefix { order, .. } = &w else {
            unreachable!()
        };
        let items: Vec<WorkItem> = (0..w.len()).map(|i| w.request(i)).collect();
        for item in &items {
            assert_eq!(item.token_ids.len(), 120);
            assert_eq!(item.max_tokens, 7);
            assert!(item.token_ids.iter().all(|&t| t < PROMPT_VOCAB));
        }
        for p in 0..4 {
            let same: Vec<&WorkItem> = (0..12)
                .filter(|&i| order[i] == p)
                .map(|i| &items[i])
                .collect();
            assert_eq!(same.len(), 3, "every prefix is used `suffixes` times");
            for pair in same.windows(2) {
                assert_eq!(pair[0].token_ids[..100], pair[1].token_ids[..100]);
                assert_ne!(pair[0].token_ids[100..], pair[1].token_ids[100..]);
            }
        }
        // Different prefixes differ from their first token block on.
        let firsts: std::collections::HashSet<&[u32]> =
            items.iter().map(|i| &i.token_ids[..16]).collect();
        assert_eq!(firsts.len(), 4);
    }

    #[test]
    fn a_seed_fixes_the_workload_and_another_seed_changes_it() {
        let a = Workload::shared_prefix(spec(5)).unwrap();
        let b = Workload::shared_prefix(spec(5)).unwrap();
        let c = Workload::shared_prefix(spec(6)).unwrap();
        let all = |w: &Workload| (0..w.len()).map(|i| w.request(i)).collect::<Vec<_>>();
        assert_eq!(all(&a), all(&b));
        assert_ne!(all(&a), all(&c));
    }

    #[test]
    fn bad_shapes_are_refused() {
        let zero = SharedPrefix {
            prefixes: 0,
            ..spec(0)
        };
        assert!(Workload::shared_prefix(zero).is_err());
        let empty = SharedPrefix {
            prefix_tokens: 0,
            unique_tokens: 0,
            ..spec(0)
        };
        assert!(Workload::shared_prefix(empty).is_err());
    }

    #[test]
    fn traces_are_parsed_filtered_and_synthesised_by_block() {
        let file = write_trace(concat!(
            r#"{"timestamp": 100, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 2]}"#,
            "\n",
            r#"{"timestamp": 150, "input_length": 90000, "output_length": 4, "hash_ids": [9]}"#,
            "\n\n",
            r#"{"timestamp": 300, "input_length": 1100, "output_length": 0, "hash_ids": [0, 1, 3]}"#,
            "\n",
            r#"{"timestamp": 400, "input_length": 10, "output_length": 2, "hash_ids": [5]}"#,
            "\n",
        ));
        let w = Workload::trace(&file.0, Some(2), Some(32_768)).unwrap();
        assert_eq!(w.len(), 2, "the long record is dropped, then two are kept");
        assert_eq!(w.timestamps_ms().unwrap(), [0.0, 200.0]);
        let (a, b) = (w.request(0), w.request(1));
        assert_eq!((a.token_ids.len(), a.max_tokens), (1100, 4));
        assert_eq!(
            b.max_tokens, 1,
            "an output length of 0 still asks for one token"
        );
        // Hash ids 0 and 1 are two shared 512-token blocks; the third differs.
        assert_eq!(a.token_ids[..1024], b.token_ids[..1024]);
        assert_ne!(a.token_ids[1024..], b.token_ids[1024..]);
        assert!(w.describe().contains("2 requests"));
    }

    #[test]
    fn broken_traces_say_where() {
        let file =
            write_trace("{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1}\n{oops\n");
        let err = format!("{:#}", Workload::trace(&file.0, None, None).unwrap_err());
        assert!(err.contains("line 2"), "{err}");
        let file = write_trace(concat!(
            r#"{"timestamp": 5, "input_length": 5, "output_length": 1}"#,
            "\n",
            r#"{"timestamp": 1, "input_length": 5, "output_length": 1}"#,
        ));
        let err = Workload::trace(&file.0, None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("must not decrease"), "{err}");
    }

    fn conversation(seed: u64) -> Sessions {
        Sessions {
            sessions: 3,
            turns: 4,
            system_tokens: 10,
            session_prefix_tokens: 50,
            turn_tokens: 20,
            output_tokens: 7,
            think_time_ms: 0.0,
            seed,
        }
    }

    #[test]
    fn each_turn_starts_with_the_previous_prompt_and_its_answer() {
        let spec = conversation(2);
        let w = Workload::sessions(spec).unwrap();
        assert_eq!(w.len(), 12);
        assert!(
            w.describe().contains("3 sessions x 4 turns"),
            "{}",
            w.describe()
        );
        for s in 0..3 {
            for k in 0..4 {
                let i = s * 4 + k;
                assert_eq!(w.session_turn(i), Some((s, k)));
                let item = w.request(i);
                assert_eq!(item.max_tokens, 7);
                assert_eq!(item.token_ids.len(), 60 + k * 27);
                assert_eq!(item.token_ids.len(), spec.prompt_tokens(k));
                assert!(item.token_ids.iter().all(|&t| t < PROMPT_VOCAB));
                if k > 0 {
                    let before = w.request(i - 1).token_ids;
                    assert_eq!(item.token_ids[..before.len()], before[..]);
                    // What follows is the answer's stand-in (as long as the answer), then
                    // a message that only this session's later turns repeat.
                    let tail = &item.token_ids[before.len()..];
                    assert_eq!(tail.len(), 7 + 20);
                    for other in (0..12).filter(|&j| j / 4 != s || j % 4 < k) {
                        let o = w.request(other).token_ids;
                        assert!(!o.windows(20).any(|win| win == &tail[7..]), "{i} {other}");
                    }
                }
            }
        }
        // Sessions share the system prompt and nothing after it.
        let firsts: Vec<Vec<u32>> = (0..3).map(|s| w.request(s * 4).token_ids).collect();
        for pair in [(0, 1), (0, 2), (1, 2)] {
            let (a, b) = (&firsts[pair.0], &firsts[pair.1]);
            assert_eq!(a[..10], b[..10]);
            assert_ne!(a[10..26], b[10..26], "{pair:?}");
        }
        // A seed fixes the workload; another changes it.
        let again = Workload::sessions(spec).unwrap();
        let other = Workload::sessions(conversation(3)).unwrap();
        assert_eq!(w.request(5), again.request(5));
        assert_ne!(w.request(5), other.request(5));
        assert_eq!(w.timestamps_ms(), None);
        assert_eq!(
            Workload::shared_prefix(self::spec(0))
                .unwrap()
                .session_turn(0),
            None
        );
    }

    #[test]
    fn bad_conversations_are_refused() {
        for bad in [
            Sessions {
                sessions: 0,
                ..conversation(0)
            },
            Sessions {
                turns: 0,
                ..conversation(0)
            },
            Sessions {
                output_tokens: 0,
                ..conversation(0)
            },
            Sessions {
                system_tokens: 0,
                session_prefix_tokens: 0,
                ..conversation(0)
            },
            Sessions {
                think_time_ms: -1.0,
                ..conversation(0)
            },
        ] {
            assert!(Workload::sessions(bad).is_err(), "{bad:?}");
        }
        // No later message is fine: each turn adds the answer only.
        let w = Workload::sessions(Sessions {
            turn_tokens: 0,
            ..conversation(0)
        })
        .unwrap();
        assert_eq!(w.request(1).token_ids.len(), 67);
    }

    /// A trace file, removed when dropped.
    struct TraceFile(PathBuf);

    impl Drop for TraceFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn write_trace(text: &str) -> TraceFile {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "dynamo-loadgen-trace-{}-{}.jsonl",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&path, text).unwrap();
        TraceFile(path)
    }
}
