//! What each service of a graph is: decided here once, for the operator's pods and the
//! local runner alike (which engine a graph's workers run is the wiring plan's
//! `engines`, which knows every backend's launchers).
//!
//! Dynamo's own manifests often do not say: `componentType` may be absent (Dynamo's
//! "default" component), the worker's command (`python3 -m dynamo.vllm`, say) telling its
//! operator what runs. So the role falls back to the main container's command.

use dynamo_names::Role;

use crate::{ComponentSpec, ComponentType};

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
    Engine(Role),
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

impl ComponentSpec {
    /// The service's role: its `componentType` (with `subComponentType` for a worker);
    /// without one, what its main container runs (a Dynamo frontend or planner module),
    /// else an engine worker, as Dynamo's operator treats a default component.
    pub fn role(&self) -> ServiceRole {
        let engine = |sub: Option<&str>| {
            ServiceRole::Engine(match sub.map(str::to_ascii_lowercase).as_deref() {
                Some("prefill") => Role::Prefill,
                Some("decode") => Role::Decode,
                _ => Role::Aggregated,
            })
        };
        let sub = self.sub_component_type.as_deref();
        match self.component_type {
            Some(ComponentType::Frontend) => ServiceRole::Frontend,
            Some(ComponentType::Epp) => ServiceRole::Epp,
            Some(ComponentType::Planner) => ServiceRole::Planner,
            Some(ComponentType::Prefill) => ServiceRole::Engine(Role::Prefill),
            Some(ComponentType::Decode) => ServiceRole::Engine(Role::Decode),
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
    pub fn launched_program(&self) -> Option<&str> {
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
                ServiceRole::Engine(Role::Aggregated),
            ),
            (
                "{componentType: worker, subComponentType: Prefill}",
                ServiceRole::Engine(Role::Prefill),
            ),
            ("componentType: decode", ServiceRole::Engine(Role::Decode)),
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
                ServiceRole::Engine(Role::Decode),
            ),
            ("{}", ServiceRole::Engine(Role::Aggregated)),
        ];
        for (yaml, role) in cases {
            assert_eq!(service(yaml).role(), role, "{yaml}");
        }
    }
}
