//! What an engine does with a request. Pod labels, the endpoints file, the picker's and
//! the planner's metrics and the planner's decisions all name it with [`Role::as_str`].

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Prefill and decode on one engine (an aggregated graph). Dynamo calls it a
    /// `worker`, which is read as a synonym.
    #[default]
    #[serde(alias = "worker")]
    Aggregated,
    /// Prefill only; decode engines pull its KV blocks.
    Prefill,
    /// Decode only, after a prefill engine.
    Decode,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Aggregated, Role::Prefill, Role::Decode];

    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Aggregated => "aggregated",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownRole(pub String);

impl fmt::Display for UnknownRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown role {:?} (aggregated, worker, prefill or decode)",
            self.0
        )
    }
}

impl std::error::Error for UnknownRole {}

impl FromStr for Role {
    type Err = UnknownRole;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "aggregated" | "worker" => Ok(Role::Aggregated),
            "prefill" => Ok(Role::Prefill),
            "decode" => Ok(Role::Decode),
            other => Err(UnknownRole(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_reads_back_as_it_is_written() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse(), Ok(role));
        }
        assert_eq!("worker".parse(), Ok(Role::Aggregated));
        assert_eq!(
            "Prefill".parse::<Role>(),
            Err(UnknownRole("Prefill".into()))
        );
    }
}
