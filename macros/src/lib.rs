//! `#[derive(Component)]` for rewire.
//!
//! The derive is a pipeline, one file per stage: [`parse`] reads the
//! attributes into a model, [`validate`] turns user mistakes into errors
//! spanned on the user's tokens, [`crate_path`] finds the runtime crate, and
//! [`expand`] writes the code.

use proc_macro::TokenStream;

mod crate_path;
mod errors;
mod expand;
mod parse;
mod validate;

/// Derives registration, factory, metadata decoding and setters.
///
/// ```
/// use rewire_runtime::prelude::*;
/// use rewire_runtime::Registry;
///
/// #[derive(serde::Deserialize)]
/// struct CacheMetadata {
///     capacity: usize,
/// }
///
/// /// A cache in front of config stores.
/// #[derive(rewire_runtime::Component)]
/// #[component(kind = "cache", type = "lru", example = r#"{"capacity": 100}"#)]
/// struct LruCache {
///     #[metadata]
///     meta: CacheMetadata,
///     #[inject]
///     config: ConfigStoreHandle,
///     #[inject(name = "apollo")]
///     apollo: Option<ConfigStoreHandle>,
///     entries: std::sync::Mutex<Vec<(String, String)>>,
/// }
///
/// #[async_trait]
/// impl Component for LruCache {}
///
/// // Registered: a configuration can declare `cache/<name>` of type `lru`.
/// let lru = Registry::collected().get("cache", "lru").copied();
/// assert_eq!(lru.map(|d| d.example_metadata), Some(r#"{"capacity": 100}"#));
/// ```
///
/// * `#[component(...)]` (required, on the struct): `kind` and `type`
///   (required), `example` (example metadata as JSON object text, default
///   `{}`), `crate` (path of the runtime crate, found automatically
///   otherwise).
/// * `#[metadata]` (at most one field): decoded from the component's
///   metadata; without it the component takes no metadata.
/// * `#[inject]` / `#[inject(name = "...")]`: filled from the component's
///   `componentRef`s; `Option<...>` fields are optional.
/// * Every other field starts as `Default::default()`.
///
/// The struct must also implement `Component` and, for a built-in kind,
/// that kind's trait (`StateStore` for `state`...).
#[proc_macro_derive(Component, attributes(component, metadata, inject))]
pub fn derive_component(input: TokenStream) -> TokenStream {
    let input = syn::parse_macro_input!(input as syn::DeriveInput);
    derive(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

fn derive(input: &syn::DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let parsed = parse::parse(input);
    let component = validate::validate(parsed)?;
    let krate = crate_path::resolve(component.crate_override.as_ref())?;
    Ok(expand::expand(&component, &krate))
}
