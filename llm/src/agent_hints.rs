//! Dynamo's per-request hints for agentic workloads, in a request's `nvext`:
//! `agent_hints.priority`, `agent_hints.osl`, `agent_hints.speculative_prefill`
//! (Dynamo's docs, "Agent Hints") and `cache_control` (Dynamo's prefix pinning: an
//! Anthropic-style `{"type": "ephemeral", "ttl": "5m"}`). A hint of the wrong shape is a
//! 400 naming it, never silently dropped.

use std::time::Duration;

use serde_json::Value;

use crate::ApiError;

/// How long a pinned prefix stays pinned when `cache_control` names no TTL (Dynamo's
/// default, "5m").
pub const DEFAULT_PIN_TTL: Duration = Duration::from_secs(300);

/// The longest pin accepted: a pin outliving a day would be a leak, not a cache.
const MAX_PIN_TTL: Duration = Duration::from_secs(24 * 3600);

/// The hints of one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentHints {
    /// Higher is served sooner when requests queue (router queue and engine scheduling).
    pub priority: i64,
    /// Expected output tokens: the router's estimate of the request's decode load.
    pub osl: Option<u64>,
    /// After the answer, prefill the next turn's prefix (the conversation with this
    /// answer appended) on the same pod.
    pub speculative_prefill: bool,
    /// Pin the prompt's blocks on the pod that serves it for this long, renewed by each
    /// request that hits them.
    pub pin_ttl: Option<Duration>,
}

impl AgentHints {
    /// The hints in `nvext` (absent: none).
    pub fn from_nvext(nvext: Option<&Value>) -> Result<Self, ApiError> {
        let Some(nvext) = nvext.filter(|v| !v.is_null()) else {
            return Ok(Self::default());
        };
        let hints = nvext.get("agent_hints").filter(|v| !v.is_null());
        let field = |name: &str| hints.and_then(|h| h.get(name)).filter(|v| !v.is_null());
        let priority = match field("priority") {
            None => 0,
            Some(v) => v
                .as_i64()
                .ok_or_else(|| invalid("agent_hints.priority", "an integer"))?,
        };
        let osl = field("osl")
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| invalid("agent_hints.osl", "a non-negative integer"))
            })
            .transpose()?;
        let speculative_prefill = match field("speculative_prefill") {
            None => false,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| invalid("agent_hints.speculative_prefill", "true or false"))?,
        };
        let pin_ttl = nvext
            .get("cache_control")
            .filter(|v| !v.is_null())
            .map(cache_control_ttl)
            .transpose()?;
        Ok(Self {
            priority,
            osl,
            speculative_prefill,
            pin_ttl,
        })
    }
}

fn invalid(name: &str, expected: &str) -> ApiError {
    ApiError::bad_request(format!("nvext.{name} must be {expected}"), Some("nvext"))
}

/// The TTL of a `cache_control` object: `{"type": "ephemeral", "ttl": "30s" | "5m" |
/// "1h"}`, the TTL optional ([`DEFAULT_PIN_TTL`]).
fn cache_control_ttl(control: &Value) -> Result<Duration, ApiError> {
    let expected = r#"{"type": "ephemeral", "ttl": "<n>s|m|h"}"#;
    if control.get("type").and_then(Value::as_str) != Some("ephemeral") {
        return Err(invalid("cache_control", expected));
    }
    let Some(ttl) = control.get("ttl").filter(|v| !v.is_null()) else {
        return Ok(DEFAULT_PIN_TTL);
    };
    let ttl = ttl.as_str().and_then(parse_ttl).ok_or_else(|| {
        invalid(
            "cache_control.ttl",
            "a duration such as \"30s\", \"5m\" or \"1h\"",
        )
    })?;
    if ttl.is_zero() || ttl > MAX_PIN_TTL {
        return Err(invalid("cache_control.ttl", "more than 0 and at most 24h"));
    }
    Ok(ttl)
}

/// `"<n>s"`, `"<n>m"` or `"<n>h"`.
fn parse_ttl(text: &str) -> Option<Duration> {
    let unit = match text.chars().last()? {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        _ => return None,
    };
    let n: u64 = text[..text.len() - 1].parse().ok()?;
    n.checked_mul(unit).map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_hint_is_read() {
        let hints = AgentHints::from_nvext(Some(&json!({
            "agent_hints": {"priority": -2, "osl": 512, "speculative_prefill": true},
            "cache_control": {"type": "ephemeral", "ttl": "30s"}
        })))
        .unwrap();
        assert_eq!(
            hints,
            AgentHints {
                priority: -2,
                osl: Some(512),
                speculative_prefill: true,
                pin_ttl: Some(Duration::from_secs(30)),
            }
        );
        assert_eq!(AgentHints::from_nvext(None).unwrap(), AgentHints::default());
        let default_ttl =
            AgentHints::from_nvext(Some(&json!({"cache_control": {"type": "ephemeral"}})));
        assert_eq!(default_ttl.unwrap().pin_ttl, Some(DEFAULT_PIN_TTL));
        assert_eq!(parse_ttl("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_ttl("5m"), Some(Duration::from_secs(300)));
    }

    #[test]
    fn misshapen_hints_are_refused_by_name() {
        for (nvext, named) in [
            (json!({"agent_hints": {"osl": -1}}), "agent_hints.osl"),
            (json!({"agent_hints": {"osl": "long"}}), "agent_hints.osl"),
            (
                json!({"agent_hints": {"priority": 1.5}}),
                "agent_hints.priority",
            ),
            (
                json!({"agent_hints": {"speculative_prefill": "yes"}}),
                "agent_hints.speculative_prefill",
            ),
            (
                json!({"cache_control": {"type": "persistent"}}),
                "cache_control",
            ),
            (
                json!({"cache_control": {"type": "ephemeral", "ttl": "5 minutes"}}),
                "cache_control.ttl",
            ),
            (
                json!({"cache_control": {"type": "ephemeral", "ttl": "0s"}}),
                "cache_control.ttl",
            ),
            (
                json!({"cache_control": {"type": "ephemeral", "ttl": "25h"}}),
                "cache_control.ttl",
            ),
        ] {
            let err = AgentHints::from_nvext(Some(&nvext)).unwrap_err();
            assert_eq!(err.status, 400);
            assert!(err.message.contains(named), "{nvext}: {}", err.message);
        }
    }
}
