//! Stage four: the generated code.
//!
//! Everything goes in one `const _: () = { ... };` block: the `Inject` and
//! `Buildable` impls, the factory and validator, and the registration.
//!
//! Hygiene: locals and `self` are always written at the call site, where
//! their bindings are; the user's spans go only on paths and types, so a
//! trait error lands on the user's tokens. Mixing the two breaks a struct
//! written inside the user's `macro_rules!` (its types then come from
//! another syntax context than the derive's).

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{LitStr, Path};

use crate::kinds::{canonical_kind, BUILT_IN_KINDS};
use crate::validate::{Component, FieldPlan, FieldRole};

/// The code for `component`, reaching the runtime through `krate`.
pub(crate) fn expand(component: &Component<'_>, krate: &Path) -> TokenStream {
    let inject = inject_impl(component, krate);
    let probe = probe(component, krate);
    let buildable = buildable_impl(component, krate);
    let factory = factory(component, krate);
    let validator = validator(component, krate);
    let registration = registration(component, krate);
    quote! {
        #[doc(hidden)]
        const _: () = {
            #inject
            #probe
            #buildable
            #factory
            #validator
            #registration
        };
    }
}

/// The `#[inject]` fields, with the component each names.
type Injected<'c, 'a> = Vec<(&'c FieldPlan<'a>, &'c Option<String>)>;

fn injected_fields<'c, 'a>(component: &'c Component<'a>) -> Injected<'c, 'a> {
    component
        .fields
        .iter()
        .filter_map(|field| match &field.role {
            FieldRole::Inject { name } => Some((field, name)),
            _ => None,
        })
        .collect()
}

fn inject_impl(component: &Component<'_>, krate: &Path) -> TokenStream {
    inject_impl_for(component.ident, &injected_fields(component), krate)
}

/// A struct of just the `#[inject]` fields, with the same setters: what
/// validation offers a configuration's componentRefs to, ahead of start.
fn probe(component: &Component<'_>, krate: &Path) -> TokenStream {
    let ident = syn::Ident::new("__RewireInjectProbe", Span::call_site());
    let injected = injected_fields(component);
    let fields = injected.iter().map(|(field, _)| {
        let (field_ident, ty) = (field.ident, field.ty);
        quote!(#field_ident: #ty)
    });
    let inject = inject_impl_for(&ident, &injected, krate);
    quote! {
        #[derive(Default)]
        struct #ident {
            #(#fields,)*
        }
        #inject
    }
}

fn inject_impl_for(ident: &syn::Ident, injected: &Injected<'_, '_>, krate: &Path) -> TokenStream {
    if injected.is_empty() {
        return quote! {
            #[automatically_derived]
            impl #krate::Inject for #ident {}
        };
    }
    // Fields that name their component get first pick, so an unnamed field
    // does not take the component a named one asked for.
    let offer_order = injected
        .iter()
        .filter(|(_, name)| name.is_some())
        .chain(injected.iter().filter(|(_, name)| name.is_none()));
    let offers = offer_order.map(|(field, name)| {
        let (field_ident, ty) = (field.ident, field.ty);
        let name = match name {
            Some(name) => quote!(::core::option::Option::Some(#name)),
            None => quote!(::core::option::Option::None),
        };
        let offer = quote_spanned!(ty.span()=> <#ty as #krate::InjectField>::offer);
        quote! {
            let handle = match #offer(&mut self.#field_ident, handle, #name) {
                ::core::option::Option::Some(handle) => handle,
                ::core::option::Option::None => return ::core::result::Result::Ok(()),
            };
        }
    });
    let checks = injected.iter().map(|(field, _)| {
        let (field_ident, ty) = (field.ident, field.ty);
        // `r#type` is the field `type` to whoever reads the error.
        let field_name = field_ident.unraw().to_string();
        let as_field = quote_spanned!(ty.span()=> <#ty as #krate::InjectField>);
        quote! {
            if !#as_field::satisfied(&self.#field_ident) {
                return ::core::result::Result::Err(#krate::InjectError::Missing {
                    field: #field_name,
                    what: #as_field::WHAT,
                });
            }
        }
    });
    quote! {
        #[automatically_derived]
        impl #krate::Inject for #ident {
            fn set_component(
                &mut self,
                handle: #krate::InjectedHandle,
            ) -> ::core::result::Result<(), #krate::InjectError> {
                #(#offers)*
                ::core::result::Result::Err(#krate::InjectError::not_accepted(&handle))
            }

            fn check_injected(&self) -> ::core::result::Result<(), #krate::InjectError> {
                #(#checks)*
                ::core::result::Result::Ok(())
            }
        }
    }
}

fn buildable_impl(component: &Component<'_>, krate: &Path) -> TokenStream {
    let ident = component.ident;
    let kind = &component.kind;
    let span = kind.span();
    let built_in = BUILT_IN_KINDS
        .iter()
        .find(|(name, _)| kind.value() == *name);
    // Spanned on `kind = "..."`: a missing kind trait (`StateStore` for
    // "state"...) is reported there, as "`T: StateStore` is not satisfied".
    let this = quote!(self);
    let instance = match built_in {
        Some((_, variant)) => {
            let variant = syn::Ident::new(variant, span);
            quote_spanned! {span=> #krate::Instance::#variant(::std::sync::Arc::new(*#this)) }
        }
        // A custom kind has no kind trait; a missing `Component` is
        // reported on the struct name, as the `Buildable` impl's is.
        None => {
            quote_spanned! {ident.span()=> #krate::Instance::Custom(::std::sync::Arc::new(*#this)) }
        }
    };
    quote! {
        #[automatically_derived]
        impl #krate::Buildable for #ident {
            fn into_instance(self: ::std::boxed::Box<Self>) -> #krate::Instance {
                #instance
            }
        }
    }
}

fn factory(component: &Component<'_>, krate: &Path) -> TokenStream {
    let ident = component.ident;
    let decode = match component.metadata_field() {
        Some(field) => {
            let ty = field.ty;
            let decode = quote_spanned!(ty.span()=> #krate::metadata::decode::<#ty>);
            quote! {
                let decoded = #decode(metadata)?;
            }
        }
        None => quote! {
            let _ = #krate::metadata::decode::<#krate::NoMetadata>(metadata)?;
        },
    };
    let inits = component.fields.iter().map(|field| {
        let field_ident = field.ident;
        match field.role {
            FieldRole::Metadata => quote!(#field_ident: decoded),
            FieldRole::Inject { .. } | FieldRole::Default => {
                quote_spanned!(field.ty.span()=> #field_ident: ::core::default::Default::default())
            }
        }
    });
    quote! {
        fn build(
            metadata: &#krate::Metadata,
        ) -> ::core::result::Result<::std::boxed::Box<dyn #krate::Buildable>, #krate::MetadataError> {
            #decode
            ::core::result::Result::Ok(::std::boxed::Box::new(#ident { #(#inits,)* }))
        }
    }
}

fn validator(component: &Component<'_>, krate: &Path) -> TokenStream {
    let metadata_ty = match component.metadata_field() {
        Some(field) => {
            let ty = field.ty;
            quote!(#ty)
        }
        None => quote!(#krate::NoMetadata),
    };
    quote! {
        fn validate(
            metadata: &#krate::__private::serde_json::Map<
                ::std::string::String,
                #krate::__private::serde_json::Value,
            >,
            injected: &[::std::string::String],
        ) -> ::core::result::Result<(), #krate::MetadataError> {
            #krate::metadata::decode_for_validation::<#metadata_ty>(metadata, injected)
        }
    }
}

fn registration(component: &Component<'_>, krate: &Path) -> TokenStream {
    let kind = component.kind.value();
    let kind = LitStr::new(canonical_kind(&kind), Span::call_site());
    let type_name = LitStr::new(&component.type_name.value(), Span::call_site());
    let description = &component.description;
    let example = &component.example;
    let ident = component.ident;
    // Spanned on `in_place`: a missing `InPlaceUpdate` impl is reported
    // there, by the trait's own message.
    let in_place = match component.in_place {
        Some(span) => quote_spanned! {span=>
            ::core::option::Option::Some({
                fn in_place(
                    component: &dyn #krate::Component,
                ) -> ::core::option::Option<&dyn #krate::InPlaceUpdate> {
                    let any: &dyn ::core::any::Any = component;
                    any.downcast_ref::<#ident>()
                        .map(|own| own as &dyn #krate::InPlaceUpdate)
                }
                in_place as #krate::InPlaceHook
            })
        },
        None => quote!(::core::option::Option::None),
    };
    // Where the struct is, so a type submitted twice names both structs.
    let struct_name = ident.unraw().to_string();
    let origin = quote!(::core::concat!(::core::module_path!(), "::", #struct_name));
    quote! {
        #krate::__private::inventory::submit! {
            #krate::ComponentDescriptor {
                kind: #kind,
                type_name: #type_name,
                description: #description,
                example_metadata: #example,
                validate,
                build,
                check_refs: ::core::option::Option::Some(
                    #krate::__private::check_refs::<__RewireInjectProbe>,
                ),
                in_place: #in_place,
            }
            .declared_at(#origin)
        }
    }
}
