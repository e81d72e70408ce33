//! What each service of a graph is, and which engine a graph's workers run: decided here
//! once, for the operator's pods and the local runner alike.
//!
//! Dynamo's own manifests often say neither: `componentType` may be absent (Dynamo's
//! "default" component) and `backendFramework` is optional, the worker's command
//! (`python3 -m dynamo.vllm`, say) telling its operator which engine runs. So both fall
//! back to the main container's command.

use crate::{BackendFramework, ComponentSpec, ComponentType, DynamoGraphDeploymentSpec};

/// The role of a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServiceRole {
    /// The OpenAI HTTP entry point (served by the endpoint picker).
    Frontend,
    /// The endpoint picker.
    Epp,
    /// The SLA planner.
    Planner,
    /// Engine workers, each pod with a sidecar.
    Engine(EngineRole),
}

/// What an engine worker does with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EngineRole {
    /// Prefill and decode in one (an aggregated graph).
    Aggregated,
    /// Prefill only; decode pods pull its KV blocks.
    Prefill,
    /// Decode only, after a prefill pod.
    Decode,
}

impl EngineRole {
    /// As pod labels, the picker's endpoint files and metrics spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            EngineRole::Aggregated => "aggregated",
            EngineRole::Prefill => "prefill",
            EngineRole::Decode => "decode",
        }
    }
}

/// Python modules and programs that start a Dynamo frontend or planner, as Dynamo's
/// manifests run them (`python3 -m dynamo.frontend`, `python3 -m planner_sla`, ...).
const FRONTEND_PROGRAMS: [&str; 1] = ["dynamo.frontend"];
/// Dynamo's planner launchers (the operator runs its own planner in their place).
pub const PLANNER_PROGRAMS: [&str; 3] = [
    "dynamo.planner",
    "planner_sla",
    "dynamo.planner.planner_sla",
];

/// Engine launchers and the backend each starts: Dynamo's worker modules and the
/// engines' own servers.
const ENGINE_PROGRAMS: [(&str, BackendFramework); 9] = [
    ("dynamo.vllm", BackendFramework::Vllm),
    ("vllm", BackendFramework::Vllm),
    ("vllm.entrypoints.openai.api_server", BackendFramework::Vllm),
    ("dynamo.sglang", BackendFramework::Sglang),
    ("sglang.launch_server", BackendFramework::Sglang),
    ("dynamo.trtllm", BackendFramework::Trtllm),
    ("trtllm-serve", BackendFramework::Trtllm),
    ("dynamo.mocker", BackendFramework::Mocker),
    ("dynamo-mocker", BackendFramework::Mocker),
];

impl ComponentSpec {
    /// The service's role: its `componentType` (with `subComponentType` for a worker);
    /// without one, what its main container runs (a Dynamo frontend or planner module),
    /// else an engine worker, as Dynamo's operator treats a default component.
    pub fn role(&self) -> ServiceRole {
        let engine = |sub: Option<&str>| {
            ServiceRole::Engine(match sub.map(str::to_ascii_lowercase).as_deref() {
                Some("prefill") => EngineRole::Prefill,
                Some("decode") => EngineRole::Decode,
                _ => EngineRole::Aggregated,
            })
        };
        let sub = self.sub_component_type.as_deref();
        match self.component_type {
            Some(ComponentType::Frontend) => ServiceRole::Frontend,
            Some(ComponentType::Epp) => ServiceRole::Epp,
            Some(ComponentType::Planner) => ServiceRole::Planner,
            Some(ComponentType::Prefill) => ServiceRole::Engine(EngineRole::Prefill),
            Some(ComponentType::Decode) => ServiceRole::Engine(EngineRole::Decode),
            Some(ComponentType::Worker) => engine(sub),
            Some(ComponentType::Main | ComponentType::Default) | None => {
                match self.launched_program() {
                    Some(p) if FRONTEND_PROGRAMS.contains(&p) => ServiceRole::Frontend,
                    Some(p) if PLANNER_PROGRAMS.contains(&p) => ServiceRole::Planner,
                    _ => engine(sub),
                }
            }
        }
    }

    /// The engine the main container's command starts, when it names one.
    pub fn launched_backend(&self) -> Option<BackendFramework> {
        let program = self.launched_program()?;
        ENGINE_PROGRAMS
            .iter()
            .find(|(p, _)| *p == program)
            .map(|(_, backend)| *backend)
    }

    /// The main container's command and args, in order.
    pub fn main_command(&self) -> Vec<String> {
        let main = self
            .extra_pod_spec
            .as_ref()
            .and_then(|e| e.main_container.as_ref());
        let mut argv = main.and_then(|m| m.command.clone()).unwrap_or_default();
        argv.extend(main.and_then(|m| m.args.clone()).unwrap_or_default());
        argv
    }

    /// What the main container's command runs (see [`launched_program`]).
    fn launched_program(&self) -> Option<&str> {
        let main = self.extra_pod_spec.as_ref()?.main_container.as_ref()?;
        let argv: Vec<&str> = main
            .command
            .iter()
            .flatten()
            .chain(main.args.iter().flatten())
            .map(String::as_str)
            .collect();
        launched_program(&argv)
    }
}

/// What a command line runs: the module of `python3 -m MODULE`, else the program's file
/// name (`/usr/local/bin/vllm` -> `vllm`).
pub fn launched_program<'a>(argv: &[&'a str]) -> Option<&'a str> {
    let program = *argv.first()?;
    let file = program.rsplit('/').next().unwrap_or(program);
    if file.starts_with("python") {
        let module = argv.iter().position(|a| *a == "-m")?;
        return argv.get(module + 1).copied();
    }
    Some(file)
}

impl DynamoGraphDeploymentSpec {
    /// The engine the workers run: `backendFramework`, else the one the engine services'
    /// commands start (Dynamo infers it the same way), else `None`.
    pub fn backend(&self) -> Option<BackendFramework> {
        self.backend_framework.or_else(|| {
            self.services
                .values()
                .filter(|s| matches!(s.role(), ServiceRole::Engine(_)))
                .find_map(ComponentSpec::launched_backend)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(yaml: &str) -> ComponentSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn roles_come_from_the_component_type_then_the_command() {
        let cases = [
            ("componentType: frontend", ServiceRole::Frontend),
            ("componentType: epp", ServiceRole::Epp),
            ("componentType: planner", ServiceRole::Planner),
            (
                "componentType: worker",
                ServiceRole::Engine(EngineRole::Aggregated),
            ),
            (
                "{componentType: worker, subComponentType: Prefill}",
                ServiceRole::Engine(EngineRole::Prefill),
            ),
            (
                "componentType: decode",
                ServiceRole::Engine(EngineRole::Decode),
            ),
            (
                "{extraPodSpec: {mainContainer: {command: [python3, -m, dynamo.frontend]}}}",
                ServiceRole::Frontend,
            ),
            (
                "{extraPodSpec: {mainContainer: {command: [python3], args: [-m, planner_sla, --x]}}}",
                ServiceRole::Planner,
            ),
            (
                "{subComponentType: decode, extraPodSpec: {mainContainer: {command: [python3, -m, dynamo.vllm]}}}",
                ServiceRole::Engine(EngineRole::Decode),
            ),
            ("{}", ServiceRole::Engine(EngineRole::Aggregated)),
        ];
        for (yaml, role) in cases {
            assert_eq!(service(yaml).role(), role, "{yaml}");
        }
    }

    #[test]
    fn the_backend_is_the_field_else_what_the_workers_run() {
        let graph =
            |yaml: &str| -> DynamoGraphDeploymentSpec { serde_saphyr::from_str(yaml).unwrap() };
        let dynamo = graph(
            "{services: {
               Frontend: {componentType: frontend, extraPodSpec: {mainContainer: {command: [python3, -m, dynamo.frontend]}}},
               worker: {componentType: worker, extraPodSpec: {mainContainer: {command: [python3, -m, dynamo.sglang]}}}}}",
        );
        assert_eq!(dynamo.backend(), Some(BackendFramework::Sglang));
        let own = graph(
            "{services: {w: {extraPodSpec: {mainContainer: {command: [/usr/local/bin/vllm], args: [serve, m]}}}}}",
        );
        assert_eq!(own.backend(), Some(BackendFramework::Vllm));
        let explicit = graph(
            "{backendFramework: mocker,
              services: {w: {extraPodSpec: {mainContainer: {command: [python3, -m, dynamo.vllm]}}}}}",
        );
        assert_eq!(explicit.backend(), Some(BackendFramework::Mocker));
        let unknown =
            graph("{services: {w: {extraPodSpec: {mainContainer: {command: [my-engine]}}}}}");
        assert_eq!(unknown.backend(), None);
    }
}
