//! Engine pods handed to a batch scheduler (KAI or Volcano) when the graph asks for one
//! with the annotations `nvidia.com/dynamo-scheduler: kai|volcano` and, optionally,
//! `nvidia.com/dynamo-scheduler-queue: <queue>`. The operator's own gang gate and
//! domain pinning still apply: the batch scheduler binds pods the operator has released,
//! within the domain it chose, and enforces its queue's quota and priority.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodSpec;

use super::ReconcileError;

/// Annotation on the DGD naming the batch scheduler of its engine pods.
pub const SCHEDULER_ANNOTATION: &str = "nvidia.com/dynamo-scheduler";
/// Annotation on the DGD naming the scheduler's queue.
pub const QUEUE_ANNOTATION: &str = "nvidia.com/dynamo-scheduler-queue";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// KAI Scheduler: `schedulerName: kai-scheduler`, queue in the pod label
    /// `kai.scheduler/queue` (KAI's docs, "Configuring Workloads for KAI Scheduler").
    Kai,
    /// Volcano: `schedulerName: volcano`, queue in the pod annotation
    /// `scheduling.volcano.sh/queue-name` (Volcano's queue docs; unset: its `default` queue).
    Volcano,
}

/// The batch scheduler a graph's engine pods go to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BatchScheduler {
    kind: Kind,
    queue: Option<String>,
}

impl BatchScheduler {
    /// The graph's choice; `None` leaves pods to the default scheduler.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
    ) -> Result<Option<Self>, ReconcileError> {
        let Some(name) = annotations.get(SCHEDULER_ANNOTATION).map(|s| s.trim()) else {
            return Ok(None);
        };
        let kind = match name {
            "kai" => Kind::Kai,
            "volcano" => Kind::Volcano,
            other => {
                return Err(ReconcileError::UnknownScheduler {
                    value: other.to_string(),
                });
            }
        };
        let queue = annotations
            .get(QUEUE_ANNOTATION)
            .map(|q| q.trim().to_string())
            .filter(|q| !q.is_empty());
        Ok(Some(Self { kind, queue }))
    }

    /// Points `spec` at the scheduler (unless the service names its own) and puts the
    /// queue where the scheduler reads it.
    pub fn apply(
        &self,
        spec: &mut PodSpec,
        labels: &mut BTreeMap<String, String>,
        annotations: &mut BTreeMap<String, String>,
    ) {
        let (scheduler, queue_key, queue_in) = match self.kind {
            Kind::Kai => ("kai-scheduler", "kai.scheduler/queue", &mut *labels),
            Kind::Volcano => ("volcano", "scheduling.volcano.sh/queue-name", annotations),
        };
        spec.scheduler_name.get_or_insert_with(|| scheduler.into());
        if let Some(queue) = &self.queue {
            queue_in.insert(queue_key.into(), queue.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn applied(
        choice: &BatchScheduler,
        spec: PodSpec,
    ) -> (PodSpec, BTreeMap<String, String>, BTreeMap<String, String>) {
        let (mut spec, mut labels, mut annotations) = (spec, BTreeMap::new(), BTreeMap::new());
        choice.apply(&mut spec, &mut labels, &mut annotations);
        (spec, labels, annotations)
    }

    #[test]
    fn kai_takes_a_label_and_volcano_an_annotation() {
        let kai = BatchScheduler::from_annotations(&annotations(&[
            (SCHEDULER_ANNOTATION, "kai"),
            (QUEUE_ANNOTATION, "team-a"),
        ]))
        .unwrap()
        .unwrap();
        let (spec, labels, notes) = applied(&kai, PodSpec::default());
        assert_eq!(spec.scheduler_name.as_deref(), Some("kai-scheduler"));
        assert_eq!(labels["kai.scheduler/queue"], "team-a");
        assert!(notes.is_empty());

        let volcano =
            BatchScheduler::from_annotations(&annotations(&[(SCHEDULER_ANNOTATION, "volcano")]))
                .unwrap()
                .unwrap();
        let (spec, labels, notes) = applied(&volcano, PodSpec::default());
        assert_eq!(spec.scheduler_name.as_deref(), Some("volcano"));
        assert!(labels.is_empty() && notes.is_empty(), "no queue, no key");
    }

    #[test]
    fn a_service_naming_its_scheduler_keeps_it() {
        let kai = BatchScheduler::from_annotations(&annotations(&[(SCHEDULER_ANNOTATION, "kai")]))
            .unwrap()
            .unwrap();
        let own = PodSpec {
            scheduler_name: Some("my-scheduler".into()),
            ..PodSpec::default()
        };
        assert_eq!(
            applied(&kai, own).0.scheduler_name.as_deref(),
            Some("my-scheduler")
        );
    }

    #[test]
    fn no_annotation_is_no_choice_and_an_unknown_one_is_an_error() {
        assert_eq!(BatchScheduler::from_annotations(&BTreeMap::new()), Ok(None));
        assert_eq!(
            BatchScheduler::from_annotations(&annotations(&[(SCHEDULER_ANNOTATION, "slurm")])),
            Err(ReconcileError::UnknownScheduler {
                value: "slurm".into()
            })
        );
    }
}
