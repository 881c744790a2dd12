//! Stage three: the path generated code uses to reach the runtime.
//!
//! Component authors depend on the `rewire` facade; the workspace's own
//! components depend on `rewire-runtime`. Like serde, an explicit
//! `#[component(crate = "...")]` wins; otherwise the calling crate's
//! `Cargo.toml` decides, `rewire` first.

use proc_macro2::Span;
use proc_macro_crate::{crate_name, FoundCrate};
use syn::Path;

/// The crates the generated code can go through, preferred first.
const RUNTIME_CRATES: &[&str] = &["rewire", "rewire-runtime"];

/// The runtime crate's path for the crate being compiled: `explicit`
/// when given.
pub(crate) fn resolve(explicit: Option<&Path>) -> syn::Result<Path> {
    if let Some(path) = explicit {
        return Ok(path.clone());
    }
    let mut failures = Vec::new();
    for package in RUNTIME_CRATES {
        match crate_name(package) {
            Ok(found) => return Ok(path_of(package, found)),
            Err(proc_macro_crate::Error::CrateNotFound { .. }) => {}
            Err(error) => failures.push(format!("{package}: {error}")),
        }
    }
    let mut message = "#[derive(Component)] cannot find the rewire runtime: add `rewire` to [dependencies] in Cargo.toml, \
         or name the path with `#[component(crate = \"...\")]`"
        .to_string();
    if !failures.is_empty() {
        message.push_str(&format!(" ({})", failures.join("; ")));
    }
    Err(syn::Error::new(Span::call_site(), message))
}

/// `::name`. When the calling crate *is* the package (its lib, binaries,
/// examples, tests), `::name` is right everywhere but inside the lib itself,
/// which the runtime and facade never derive in; a lib that does can add
/// `extern crate self as <name>;`.
fn path_of(package: &str, found: FoundCrate) -> Path {
    let name = match found {
        FoundCrate::Itself => package.replace('-', "_"),
        FoundCrate::Name(name) => name,
    };
    let ident = syn::Ident::new(&name, Span::call_site());
    syn::parse_quote!(::#ident)
}
