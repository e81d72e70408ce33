//! Errors of the controllers. A reconcile that returns one is retried with back-off.

use std::fmt;

use crate::reconcile::ObjectKind;

/// What the controller tried to do to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    Apply,
    Create,
    Delete,
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verb::Apply => "server-side apply of",
            Verb::Create => "creating",
            Verb::Delete => "deleting",
        })
    }
}

/// One write to a generated object that the API server refused.
#[derive(Debug, thiserror::Error)]
#[error("{verb} {kind:?} {name} failed: {source}")]
pub struct ChildError {
    pub verb: Verb,
    pub kind: ObjectKind,
    pub name: String,
    #[source]
    pub source: kube::Error,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Some generated objects could not be written; the rest were.
    #[error("{} of {total} writes failed; first: {}", .failed.len(), .failed[0])]
    Children {
        failed: Vec<ChildError>,
        total: usize,
    },
    #[error("patching the status of {kind} {name} failed: {source}")]
    Status {
        kind: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "setting replicas of service {service} of graph {graph} to {replicas} failed: {source}"
    )]
    Scale {
        graph: String,
        service: String,
        replicas: i32,
        #[source]
        source: kube::Error,
    },
    /// An object a request generated could not be applied.
    #[error("server-side apply of {kind} {name} failed: {source}")]
    Apply {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading {kind} {name} failed: {source}")]
    Read {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// A reflector stopped, so the caches the reconcile reads are gone.
    #[error("the watch caches stopped")]
    CachesStopped,
}

impl Error {
    /// Label value of the `errors` metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Children { .. } => "children",
            Error::Status { .. } => "status",
            Error::Scale { .. } => "scale",
            Error::Apply { .. } => "apply",
            Error::Read { .. } => "read",
            Error::CachesStopped => "caches",
        }
    }
}
