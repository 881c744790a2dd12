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
mod kinds;
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
///
/// /// A cache that takes a new capacity without being rebuilt.
/// #[derive(rewire_runtime::Component)]
/// #[component(kind = "cache", type = "resizable", in_place)]
/// struct ResizableCache {
///     #[metadata]
///     meta: CacheMetadata,
///     capacity: std::sync::atomic::AtomicUsize,
/// }
///
/// #[async_trait]
/// impl Component for ResizableCache {
///     async fn init(&mut self, _: &InitContext) -> Result<(), ComponentError> {
///         *self.capacity.get_mut() = self.meta.capacity;
///         Ok(())
///     }
/// }
///
/// // Required by `in_place`: without it the derive does not compile.
/// #[async_trait]
/// impl InPlaceUpdate for ResizableCache {
///     async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
///         let new: CacheMetadata = metadata.decode()?;
///         self.capacity.store(new.capacity, std::sync::atomic::Ordering::Relaxed);
///         Ok(InPlace::Applied)
///     }
/// }
///
/// let resizable = Registry::collected().get("cache", "resizable").copied();
/// assert!(resizable.is_some_and(|d| d.in_place.is_some()));
/// ```
///
/// * `#[component(...)]` (required, on the struct): `kind` and `type`
///   (required; a custom kind that is a built-in kind spelled another way,
///   such as `state_store`, `secretstores` or `State`, is refused), `example` (example metadata as JSON object text, default
///   `{}`), `in_place` (a flag: the struct implements `InPlaceUpdate` and
///   takes metadata changes without a rebuild; the derive refuses to
///   compile without the impl), `crate` (path of the runtime crate, found
///   automatically otherwise).
/// * `#[metadata]` (at most one field): decoded from the component's
///   metadata; without it the component takes no metadata.
/// * `#[inject]` / `#[inject(name = "...")]`: filled from the component's
///   `componentRef`s, each offered first to the named fields, then to the
///   unnamed ones (each group in declaration order); a field takes one
///   reference (a named one only its component's), and a componentRef no
///   field takes is an error. `Option<...>` fields are optional.
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
