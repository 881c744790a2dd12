//! `rewire components`.

use std::process::ExitCode;

use rewire::Registry;

/// Lists every registered kind and type with its description.
pub fn components_command() -> ExitCode {
    let registry = Registry::collected();
    if registry.is_empty() {
        eprintln!("no component types are registered (the components crate is not linked)");
        return ExitCode::FAILURE;
    }
    let width = registry
        .iter()
        .map(|d| d.kind.len() + d.type_name.len() + 1)
        .max()
        .unwrap_or(0);
    for descriptor in registry.iter() {
        let name = format!("{}/{}", descriptor.kind, descriptor.type_name);
        println!("{name:<width$}  {}", descriptor.description);
        if descriptor.example_metadata != "{}" {
            println!(
                "{:<width$}  example metadata: {}",
                "", descriptor.example_metadata
            );
        }
    }
    ExitCode::SUCCESS
}
