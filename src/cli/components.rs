//! `rewire components`.

use std::fmt::Write as _;
use std::process::ExitCode;

use rewire::Registry;

/// Lists every registered kind and type with its description; a type
/// registered more than once is listed once per registration, with a note
/// that validation refuses it (and a warning on stderr).
pub fn components_command() -> ExitCode {
    let registry = Registry::collected();
    if registry.is_empty() {
        eprintln!("no component types are registered (the components crate is not linked)");
        return ExitCode::FAILURE;
    }
    super::print_stdout(&listing(&registry));
    let twice = registry
        .iter()
        .filter(|d| registry.submitted_twice(d.kind, d.type_name).is_some())
        .count();
    if twice > 0 {
        eprintln!("warning: {twice} type(s) are registered more than once in this binary: a component of such a type is refused by validation");
    }
    ExitCode::SUCCESS
}

/// One line per registration (`kind/type  description`), the example
/// metadata under it, and under a type registered more than once every
/// registration and the note that validation refuses it.
fn listing(registry: &Registry) -> String {
    let width = registry
        .iter()
        .map(|d| d.kind.len() + d.type_name.len() + 1)
        .max()
        .unwrap_or(0);
    let mut out = String::new();
    for descriptor in registry.iter() {
        let name = format!("{}/{}", descriptor.kind, descriptor.type_name);
        match registry.submitted_twice(descriptor.kind, descriptor.type_name) {
            Some(descriptions) => {
                for description in descriptions {
                    let _ = writeln!(out, "{name:<width$}  {description}");
                }
                let _ = writeln!(
                    out,
                    "{:<width$}  registered {} times: refused by validation (which one would serve depends on link order)",
                    "",
                    descriptions.len()
                );
            }
            None => {
                let _ = writeln!(out, "{name:<width$}  {}", descriptor.description);
            }
        }
        if descriptor.example_metadata != "{}" {
            let _ = writeln!(
                out,
                "{:<width$}  example metadata: {}",
                "", descriptor.example_metadata
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::listing;
    use rewire::{Buildable, ComponentDescriptor, Metadata, MetadataError, Registry};

    fn unbuildable(_: &Metadata) -> Result<Box<dyn Buildable>, MetadataError> {
        Err(MetadataError::Invalid {
            field: ".".into(),
            message: "not built in this test".into(),
        })
    }

    fn descriptor(type_name: &'static str, description: &'static str) -> ComponentDescriptor {
        ComponentDescriptor {
            kind: "state",
            type_name,
            description,
            example_metadata: "{}",
            validate: |_, _| Ok(()),
            build: unbuildable,
            check_refs: None,
            in_place: None,
        }
    }

    #[test]
    fn a_type_registered_twice_is_listed_per_registration_with_the_refusal() {
        let registry = Registry::submitted([
            descriptor("redis", "the built-in"),
            descriptor("memory", "in memory"),
            descriptor("redis", "mine"),
        ]);
        assert_eq!(
            listing(&registry),
            "state/memory  in memory\n\
             state/redis   the built-in\n\
             state/redis   mine\n              \
             registered 2 times: refused by validation (which one would serve depends on link order)\n"
        );
    }
}
